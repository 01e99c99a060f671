"""`elmo-jax embed --engine=ray`: the embed command's corpus on a Ray cluster (`elmo_jax.engines.ray_data`).

    elmo-jax embed --engine=ray --model=small --input_file='corpus/*.txt.gz' --output_dir=out/ --average
    elmo-jax embed --engine=ray --ray_address=HEAD:6379 --actor_gpus=1 --actors=8 --model=original \
        --input_file='gs://bucket/corpus/*.txt' --output_dir=gs://bucket/elmo/ --top --output_dtype=float16

The output is a folder of shards (`engines/shard_files.py`: Parquet by default, or AllenNLP-layout HDF5 with
`--output_format=hdf5`) and a manifest; a rerun of the same command skips the shards already written.
"""
from __future__ import annotations

import sys

from absl import app
from absl import flags

from elmo_jax.engines import ray_data
from elmo_jax.engines import shard_files
from elmo_jax.engines import worker
from elmo_jax.runtime import files

FLAGS = flags.FLAGS
# The local engine's flags that a Ray job has no use for, with why.
_LOCAL_ONLY = {"output_file": "a Ray job writes shards: give --output_dir",
               "stateful": "a carried state runs in input order on one process",
               "module_output": "a TF-Hub module's outputs are the local engine's",
               "use_sentence_keys": "shards are keyed by line index", "forget_sentences": "shards hold each line",
               "token_embedding_file": "the local engine's", "dump_token_embeddings": "the local engine's",
               "options_file": "give the folder of options.json + weights as --model",
               "weight_file": "give the folder of options.json + weights as --model",
               "part_sentences": "a shard is the unit of resumption: --shard_lines",
               "coordinator_address": "Ray's address is --ray_address", "num_processes": "Ray places the actors"}


def define_flags() -> None:
  """The engine flags of `elmo-jax embed` (its `define_flags` calls this)."""
  flags.DEFINE_enum("engine", "local", ["local", "ray"], "local: this process (and its jax.distributed peers) "
                    "writes one HDF5 file; ray: actors on a Ray cluster write shards to --output_dir.")
  flags.DEFINE_string("ray_address", None, "--engine=ray: the cluster's address (HOST:PORT of `ray start "
                      "--head`, or 'auto'); default: start a local cluster on this machine.")
  flags.DEFINE_integer("actors", 1, "--engine=ray: actors in the pool, each holding one warm model.")
  flags.DEFINE_float("actor_cpus", 1.0, "--engine=ray: CPUs Ray reserves for each actor.")
  flags.DEFINE_float("actor_gpus", 0.0, "--engine=ray: GPUs for each actor (1 on a GPU cluster; a fraction "
                     "shares a device).")
  flags.DEFINE_string("output_dir", None, "--engine=ray: the folder (or gs:// prefix) of the shards and the "
                      "manifest.")
  flags.DEFINE_enum("output_format", "parquet", list(shard_files.FORMATS), "--engine=ray: parquet (index, "
                    "file, line, text, embedding a row) or hdf5 (AllenNLP's `elmo` layout a shard).")
  flags.DEFINE_integer("shard_lines", None, "--engine=ray: lines a shard holds (a multiple of --chunk_size; "
                       "default: one chunk): the unit of scheduling, retry and resumption.")
  flags.DEFINE_enum("on_bad_line", "stop", list(worker.ON_BAD_LINE), "--engine=ray: a line that is not UTF-8 "
                    "or is over --max_tokens: stop the job naming its file and line, or skip it (listed on "
                    "stderr and in the manifest).")
  flags.DEFINE_integer("max_tokens", None, "--engine=ray: a line of more tokens is a bad line (default: any "
                       "length).")
  flags.DEFINE_list("mix_weights", None, "One weight per layer: write their weighted sum of the layers, "
                    "(n_tokens, 2P) per line (e.g. a trained scalar mix's gamma * softmax(s)).")


def check_flags() -> None:
  """Usage errors of `--engine=ray` (one line each)."""
  for name, why in _LOCAL_ONLY.items():
    if FLAGS[name].present and FLAGS[name].value not in (None, False):
      raise app.UsageError(f"--{name} is not for --engine=ray ({why})")
  if not FLAGS.output_dir:
    raise app.UsageError("--engine=ray writes shards: give --output_dir")
  if not FLAGS.input_file:
    raise app.UsageError("--input_file is required (files, globs or gs:// URLs, comma-separated)")
  if bool(FLAGS.model) == bool(FLAGS.workdir):
    raise app.UsageError("give one of --model or --workdir")
  if FLAGS.top + FLAGS.average + FLAGS.all + bool(FLAGS.mix_weights) > 1:
    raise app.UsageError("give at most one of --all, --top, --average, --mix_weights")


def mix() -> list[float] | None:
  """--mix_weights as floats (usage error naming the bad one)."""
  if not FLAGS.mix_weights:
    return None
  try:
    return [float(w) for w in FLAGS.mix_weights]
  except ValueError as e:
    raise app.UsageError(f"--mix_weights: {e}") from None


def main() -> int:
  check_flags()
  output = ("mix" if FLAGS.mix_weights else "top" if FLAGS.top else "average" if FLAGS.average else "layers")
  cluster = ray_data.Cluster(FLAGS.ray_address, FLAGS.actors, FLAGS.actor_cpus, FLAGS.actor_gpus)
  try:
    summary = ray_data.embed_corpus(
        FLAGS.model or FLAGS.workdir, [FLAGS.input_file], FLAGS.output_dir, cluster=cluster, output=output,
        mix=mix(), sentence_vectors=FLAGS.sentence_vectors, dtype=FLAGS.output_dtype,
        output_format=FLAGS.output_format, batch_size=FLAGS.batch_size, chunk_size=FLAGS.chunk_size,
        shard_lines=FLAGS.shard_lines, tokenize=FLAGS.tokenize, max_tokens=FLAGS.max_tokens,
        on_bad_line=FLAGS.on_bad_line, progress_every=FLAGS.progress_every if FLAGS.progress else None)
  except (*ray_data.USER_ERRORS, ray_data.WorkerError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  bad = f", {len(summary['bad_lines'])} bad lines skipped (listed in the manifest)" if summary["bad_lines"] else ""
  resumed = f"; {summary['skipped_shards']} shards were written earlier" if summary["skipped_shards"] else ""
  rate = summary["embedded_tokens"] / max(summary["seconds"], 1e-9)
  print(f"wrote {FLAGS.output_dir}: {len(summary['shards'])} shards, {summary['written_lines']} lines, "
        f"{summary['tokens']} tokens, {files.human_bytes(summary['bytes'])} in {summary['seconds']:.1f} s "
        f"({rate:.0f} tokens/s){bad}{resumed}", file=sys.stderr)
  return 0
