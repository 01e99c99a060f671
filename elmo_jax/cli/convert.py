"""The conversion command (`elmo-jax convert`): any model into a format (`convert.WRITE_FORMATS`).

    elmo-jax convert --from=elmo_3/ --to=elmo_3_bilm/             # a TF-Hub module, exact
    elmo-jax convert --from=runs/default --to=gs://bucket/model/   # a run's export, uploaded
    elmo-jax convert --from=https://host/m/options.json --to=model/ --format=bilm-hdf5
    elmo-jax convert --from=zhs.model/ --to=zhs_again/ --format=efml     # an EFML folder, same bits

`--from` is anything `--model=` takes (a released name, a run, a folder of options.json + weights.hdf5, elmo_jax's
safetensors folder, a TF-Hub `elmo/3`-layout module folder, an ELMoForManyLangs folder, an archive, a URL);
`--to` a new or empty folder, written whole or not at all: options.json + weights.hdf5 (+ the softmax, and
vocab.txt, where the source has them), every tensor with the bits it was read with (the work:
`elmo_jax.sources.convert`); or, `--format=efml`, an ELMoForManyLangs release folder written without torch;
`--format=safetensors`, elmo_jax's own folder with its model card; `--format=stablehlo` / `--format=onnx`, the
forward pass itself (docs/portable-models.md). A format that cannot hold the model is refused in one line
(EFML's word embedding has no place in bilm-tf's layout).
"""
from __future__ import annotations

import sys

from absl import app
from absl import flags

from elmo_jax import cli
from elmo_jax.formats import onnx_export
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import stablehlo
from elmo_jax.formats import tf_bundle
from elmo_jax.formats import weights as weights_lib
from elmo_jax.runtime import files
from elmo_jax.runtime import storage
from elmo_jax.sources import convert as convert_lib
from elmo_jax.sources import download

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("from", None, "The model: anything --model takes (a released name, a run, a folder: "
                      "options.json + weights.hdf5, safetensors, a TF-Hub elmo/3-layout module, ELMoForManyLangs; "
                      "an archive, a URL, hf://owner/name).")
  flags.DEFINE_string("to", None, "A new or empty folder (local or gs://) to write the model into.")
  flags.DEFINE_enum("format", "bilm-hdf5", list(convert_lib.WRITE_FORMATS),
                    "bilm-hdf5: bilm-tf's / AllenNLP's options.json + weights.hdf5; efml: an "
                    "ELMoForManyLangs release folder (config.json, char.dic, word.dic, *.pkl) that its Embedder loads; "
                    "safetensors: elmo_jax's own folder (config.json, model.safetensors, a model card README.md); "
                    "stablehlo: the forward pass as a jax.export artifact (cpu, cuda, tpu); onnx: model.onnx + "
                    "tokenizer.json for onnxruntime alone (docs/portable-models.md).")


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  for name in ("from", "to"):
    if not FLAGS[name].value:
      raise app.UsageError(f"--{name} is required")
  source, to = FLAGS["from"].value, FLAGS.to
  try:
    if FLAGS.format == convert_lib.STABLEHLO:
      stablehlo.require_flatbuffers()  # before the model is loaded
    model = convert_lib.convert(source, to, FLAGS.format)
  except (convert_lib.ConvertError, onnx_export.OnnxExportError, stablehlo.ExportedError, files.UnsafeOutputError,
          weights_lib.WeightFileError, options_lib.OptionsError, tf_bundle.BundleError, download.DownloadError,
          storage.StorageError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  if model.note and FLAGS.format == convert_lib.BILM_HDF5:  # what bilm-tf's layout cannot hold: nothing to say of efml
    print(f"note: {model.note}", file=sys.stderr)
  print(f"wrote {to}: {FLAGS.format} of {source}", file=sys.stderr)
  return 0


def run() -> None:
  cli.run_main(main, define_flags)


if __name__ == "__main__":
  run()
