"""Weight interop and released models: options.json, the hdf5 weight files of bilm-tf / AllenNLP (read
and written exactly), the released models by name, and the download cache."""
