"""Where a model comes from: the released models by name and the one reading of any model spec
(`resolve.resolve_model` -> `resolve.ResolvedModel`; released names: `released`), the one load of it (`loaded.load_model`), the download
cache (download), archives unpacked once (archive), and conversion of any source into a format (convert)."""
