"""Weight interop and released models: options.json, the hdf5 weight files of bilm-tf / AllenNLP (read
and written exactly), the released models by name, `pretrained.resolve_model` (what any model spec names,
for every loader), and the download cache."""
