"""The embedding command (`elmo-jax embed`): a file of sentences into an HDF5 file of
ELMo layers, the layout of AllenNLP's `elmo` command (the work: `elmo_jax.embedding.writer.embed_file`).

    elmo-jax embed --options_file=O.json --weight_file=W.hdf5 \
        --input_file=S.txt --output_file=E.hdf5 [--batch_size=N] [--stateful]
    elmo-jax embed --workdir=DIR --input_file=S.txt --output_file=E.hdf5
    elmo-jax embed --model=original --input_file=S.txt.gz --output_file=E.hdf5 --top \
        --output_dtype=float16
    elmo-jax embed --model=small --input_file=raw.txt --tokenize --sentence_vectors \
        --average --output_file=V.hdf5
    elmo-jax embed --model=small --dump_token_embeddings --vocab_file=V.txt --output_file=T.hdf5
    elmo-jax embed --model=elmo_3/ --module_output=elmo --input_file=S.txt --output_file=E.hdf5

Input: one whitespace-tokenized sentence per line (UTF-8, gzip if it is gzipped), or raw text with
`--tokenize` (the trainer's Moses tokenizer). Output: dataset `str(i)` for input line i (0-based) of shape
`(n_layers + 1, n_tokens, 2P)` (`--all`, the default), `(n_tokens, 2P)` (`--top`: the top layer;
`--average`: the mean of the layers), with `--sentence_vectors` the mean over the tokens instead
(`(n_layers + 1, 2P)` or `(2P,)`); of a TF-Hub module folder (`--model=MODULE_DIR`), `--module_output=` one of
its outputs (`word_emb`, `lstm_outputs1`, `lstm_outputs2`, `elmo`, `default`); float32 or
`--output_dtype=float16` (a value past its 65,504 is refused in one line naming the line, never written as inf).
`sentence_to_index`: a (1,) variable-length string dataset holding
`json.dumps({stripped line text: "i"})` (later duplicates win, as in AllenNLP). With `--use_sentence_keys` the
datasets are named by the line text instead and there is no `sentence_to_index` (AllenNLP's layout; a repeated
line is then an error); `--forget_sentences` omits it.
"""
from __future__ import annotations

import os
import signal
import sys
import time

from absl import app
from absl import flags
from absl import logging

from elmo_jax import cli
from elmo_jax.cli import embed_ray
from elmo_jax.data.tokenize import Tokenizer
from elmo_jax.embedding import inputs as embed_inputs
from elmo_jax.embedding import job as embed_job
from elmo_jax.embedding import step as embed_step
from elmo_jax.embedding import token_cache
from elmo_jax.embedding import writer
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import tf_bundle
from elmo_jax.formats import tfhub
from elmo_jax.formats import weights as weights_lib
from elmo_jax.runtime import devices
from elmo_jax.runtime import distributed
from elmo_jax.runtime import files
from elmo_jax.runtime import progress as progress_lib
from elmo_jax.runtime import storage
from elmo_jax.sources import download
from elmo_jax.sources import resolve

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the command's flags; only when run as a command, so importing `embed_file` adds none."""
  flags.DEFINE_string("options_file", None, "options.json of the biLM (a path, file:// or http(s):// URL).")
  flags.DEFINE_string("weight_file", None, "ELMo weights (hdf5, bilm-tf/AllenNLP layout; path or URL).")
  flags.DEFINE_string("model", None, "A released model (small, medium, original, original_5.5B; downloaded "
                      "once into $ELMO_JAX_CACHE), a folder or a URL; instead of --options_file/--weight_file.")
  flags.DEFINE_string("workdir", None, "A training run's directory (uses export/options.json and "
                      "export/weights.hdf5); instead of --options_file/--weight_file.")
  flags.DEFINE_string("input_file", None, "One whitespace-tokenized sentence per line (UTF-8; .gz ok; a pipe, "
                      "FIFO or - for stdin is kept in the job folder OUTPUT.partial/ for the job's passes).")
  flags.DEFINE_string("output_file", None, "Output hdf5.")
  flags.DEFINE_bool("all", False, "Write all layers, (n_layers + 1, n_tokens, 2P) per line (the default).")
  flags.DEFINE_bool("top", False, "Write the top layer only, (n_tokens, 2P) per line.")
  flags.DEFINE_bool("average", False, "Write the mean of the layers, (n_tokens, 2P) per line.")
  flags.DEFINE_enum("module_output", None, list(tfhub.OUTPUTS),
                    "A TF-Hub module's output (--model=MODULE_DIR): word_emb (n_tokens, P), lstm_outputs1/2 "
                    "and elmo, its learned mix of the layers x scaling, (n_tokens, 2P); default: elmo "
                    "mean-pooled over the tokens, (2P,).")
  flags.DEFINE_bool("sentence_vectors", False, "Write one vector per line: the mean over its tokens of "
                    "the chosen output ((n_layers + 1, 2P) with --all, (2P,) with --top/--average).")
  flags.DEFINE_enum("output_dtype", "float32", ["float32", "float16"], "Dtype of the written arrays.")
  flags.DEFINE_bool("use_sentence_keys", False, "Name each dataset by the line's text (AllenNLP's "
                    "--use-sentence-keys) instead of its index; no sentence_to_index then.")
  flags.DEFINE_bool("forget_sentences", False, "Do not write sentence_to_index.")
  flags.DEFINE_bool("tokenize", False, "Input is raw text: tokenize it with the trainer's Moses tokenizer "
                    "(sentence keys stay the raw line).")
  flags.DEFINE_string("token_embedding_file", None, "Precomputed token embeddings (--dump_token_embeddings) "
                      "for the words they cover; other words still go through the char CNN.")
  flags.DEFINE_bool("dump_token_embeddings", False, "Instead of embedding sentences, write the char-CNN "
                    "output of every word of --vocab_file to --output_file.")
  flags.DEFINE_string("vocab_file", None, "Vocabulary (one word per line) of --dump_token_embeddings.")
  flags.DEFINE_integer("batch_size", None, "Sentences per batch (default: 64 per device; --stateful: 64).")
  flags.DEFINE_bool("stateful", False, "Carry each batch row's LSTM state into the next batch "
                    "(bilm-tf semantics; sentences are then batched in file order).")
  flags.DEFINE_integer("chunk_size", 4096, "Lines read and embedded at once (bounds memory).")
  flags.DEFINE_float("progress_every", 5.0, "Seconds between progress lines on stderr.")
  flags.DEFINE_bool("progress", True, "Progress lines on stderr (--noprogress: none).")
  flags.DEFINE_integer("devices", None, "Local devices to split each batch over (default: all of them).")
  flags.DEFINE_integer("part_sentences", None, "Sentences per part of the job folder OUTPUT.partial/ (what a "
                       "kill can cost: a rerun resumes after the last part); default 8 batches.")
  cli.define_distributed_flags()
  embed_ray.define_flags()
  flags.DEFINE_bool("compilation_cache", True, "Keep compiled shapes in JAX's persistent compilation cache "
                    "under $ELMO_JAX_CACHE (default ~/.cache/elmo_jax), so the next run starts fast.")


def _on_signal(signum, frame):  # pylint: disable=unused-argument
  # Raising from a signal handler is unreliable (it can land in a weakref callback and be swallowed), so
  # the handler itself removes the unfinished outputs and exits at once.
  embed_inputs.remove_active_temps()
  kept = "".join(f"; finished parts are kept in {job}: rerun the same command to resume"
                 for job in list(embed_inputs.ACTIVE_JOBS)[:1])
  os.write(2, f"error: interrupted by signal {signum}; no output written{kept}\n".encode())
  os._exit(128 + signum)


def _check_flags() -> None:
  """Usage errors (`cli.run_main` prints each as one line)."""
  for name in (("vocab_file",) if FLAGS.dump_token_embeddings else ("input_file",)) + ("output_file",):
    if not FLAGS[name].value:
      raise app.UsageError(f"--{name} is required")
  sources = [bool(FLAGS.workdir), bool(FLAGS.model), bool(FLAGS.options_file or FLAGS.weight_file)]
  if sum(sources) > 1:
    raise app.UsageError("give one of --model, --workdir or --options_file/--weight_file")
  if not FLAGS.workdir and not FLAGS.model and not (FLAGS.options_file and FLAGS.weight_file):
    raise app.UsageError("give --model, or --options_file and --weight_file (or --workdir)")
  if FLAGS.top + FLAGS.average + FLAGS.all + bool(FLAGS.mix_weights) > 1:
    raise app.UsageError("give at most one of --all, --top, --average, --mix_weights")
  for name in ("output_dir", "ray_address", "shard_lines", "max_tokens"):
    if FLAGS[name].value is not None:
      raise app.UsageError(f"--{name} is for --engine=ray")
  if FLAGS.module_output and FLAGS.stateful:
    raise app.UsageError(writer.STATEFUL_MODULE_OUTPUT.format(FLAGS.module_output))
  if FLAGS.module_output and FLAGS.top + FLAGS.average + FLAGS.all + bool(FLAGS.mix_weights):
    raise app.UsageError(f"--module_output={FLAGS.module_output} is the output; drop --all/--top/--average/"
                         "--mix_weights")


def _run_inputs() -> list[str]:
  """Every file this run reads (the text or vocabulary, the token embeddings, every file of the model however
  it is named: `ResolvedModel.read_files`), found without loading or downloading anything: the output
  must not be one of them. (`embed_file` checks the loaded model's files again.)"""
  out = [FLAGS.input_file, FLAGS.vocab_file, FLAGS.token_embedding_file]
  out += [download.local_path(p) for p in (FLAGS.options_file, FLAGS.weight_file) if p]
  for spec, use in ((FLAGS.model, "model"), (FLAGS.workdir, "run")):
    if spec:
      model = resolve.resolve_model(spec, use=use, fetch=False)
      out += [model.options_file, model.weight_file, model.vocab_file, *model.read_files]  # an EFML folder's all
  return [p for p in out if p]


def _load_embedder() -> Embedder:
  kwargs = {"stateful": FLAGS.stateful, "token_embedding_file": FLAGS.token_embedding_file,
            "compilation_cache": FLAGS.compilation_cache, "devices": FLAGS.devices,
            "warm": False}  # one file, its lengths compiled when first met (no refusal of long sentences)
  if FLAGS.workdir:
    return Embedder.from_workdir(FLAGS.workdir, **kwargs)
  if FLAGS.model:
    return Embedder.from_pretrained(FLAGS.model, **kwargs)
  return Embedder.from_files(FLAGS.options_file, FLAGS.weight_file, **kwargs)


def _check_numbers() -> None:
  """Counts and rates of the flags, before any work: one line naming the flag (`cli.check_flag_numbers`, as
  evaluate and downstream do)."""
  cli.check_flag_numbers(
      embed_inputs.EmbedInputError,
      at_least=[(FLAGS[name], low) for name, low in (("batch_size", 1), ("chunk_size", 1), ("part_sentences", 1),
                                                     ("devices", 1), ("num_processes", 1), ("process_id", 0))],
      within=[(FLAGS["progress_every"], ">= 0 (seconds)", lambda x: x >= 0)])


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # keeps JAX's backend INFO lines out of the one-line errors
  if FLAGS.engine == "ray":
    return embed_ray.main()
  _check_flags()
  try:
    _check_numbers()
  except embed_inputs.EmbedInputError as e:  # the message alone, not absl's usage text
    print(f"error: {e}", file=sys.stderr)
    return 1
  if not FLAGS.progress:
    progress_lib.set_enabled(False)
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, _on_signal)
  # A file-size limit (ulimit -f) then fails the write (EFBIG: one line and the space needed) instead of
  # killing the process.
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  try:
    # A bucket --output_file is written to a local staging file and uploaded whole once the work is done.
    inputs = _run_inputs()  # the model named once, without loading it: what the output must not be
    with storage.staged_output(FLAGS.output_file, "--output_file", inputs=inputs) as output_file:
      done = _embed(output_file, inputs)
  except (embed_inputs.EmbedInputError, files.UnsafeOutputError, weights_lib.WeightFileError,
          options_lib.OptionsError, OSError, token_cache.TokenCacheError, embed_job.JobError,
          embed_step.DeviceError, tf_bundle.BundleError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(done, file=sys.stderr)
  return 0


def _embed(output_file: str, inputs: list[str]) -> str:
  """The work of `main`, writing to `output_file` (local; never one of `inputs`); returns the line that reports
  it."""
  source = storage.local(FLAGS.vocab_file if FLAGS.dump_token_embeddings else FLAGS.input_file)
  job_input = None
  if FLAGS.dump_token_embeddings:  # fail before spending time on loading the model
    source = "/dev/stdin" if source == embed_inputs.STDIN else source
    if not os.path.exists(source):
      raise embed_inputs.EmbedInputError(f"{source}: vocab file not found")
    problem = None if embed_inputs.is_stream(source) else files.text_problem(source)  # a pipe is read once
    if problem is not None:
      raise embed_inputs.EmbedInputError(f"--vocab_file={source} {problem}")
    embed_inputs.check_output_path(output_file, inputs, "--output_file")
  else:  # the job's checks, once, and its input read once (a pipe spooled into the job folder)
    job_input = embed_inputs.check_job(source, output_file, inputs, logging.warning, "--input_file")
  try:
    return _load_and_embed(source, output_file, job_input)
  finally:
    if job_input is not None:
      job_input.discard()  # a spool the job did not adopt (it failed before opening its folder)


def _load_and_embed(source: str, output_file: str, job_input: embed_inputs.JobInput | None) -> str:
  """`_embed` past the checks: the backend, the model, the work; returns the line that reports it."""
  # Before anything touches a JAX backend: initialize() must come first in every process.
  try:
    distributed.initialize(FLAGS.distributed, FLAGS.coordinator_address, FLAGS.num_processes,
                           FLAGS.process_id, FLAGS.distributed_timeout_s, command=cli.command_name())
  except ValueError as e:  # e.g. --coordinator_address without --num_processes
    raise embed_inputs.EmbedInputError(str(e)) from None
  devices.announce()
  import jax  # pylint: disable=g-import-not-at-top  (after initialize)
  if storage.is_remote(FLAGS.output_file) and jax.process_count() > 1:
    raise embed_inputs.EmbedInputError("--output_file in a bucket is written by one process; give a shared "
                                      "local path for a multi-process run, then upload it")
  embedder = _load_embedder()
  if FLAGS.dump_token_embeddings:
    start = time.perf_counter()
    n = writer.dump_token_embeddings(embedder, source, output_file)
    return (f"wrote {FLAGS.output_file}: {n} token embeddings of width {embedder.config.projection_dim} in "
            f"{time.perf_counter() - start:.1f} s")
  tokenize = None
  if FLAGS.tokenize:
    tokenize = Tokenizer()
  stats = writer.embed_file(embedder, job_input, output_file, FLAGS.batch_size,
                           chunk_size=FLAGS.chunk_size,
                           progress_every=FLAGS.progress_every if FLAGS.progress else None,
                           output=FLAGS.module_output or embed_ray.mix() or (
                               "top" if FLAGS.top else "average" if FLAGS.average else "all"),
                           sentence_vectors=FLAGS.sentence_vectors, output_dtype=FLAGS.output_dtype,
                           use_sentence_keys=FLAGS.use_sentence_keys,
                           forget_sentences=FLAGS.forget_sentences, tokenize=tokenize,
                           part_sentences=FLAGS.part_sentences)
  rate = stats["sentences"] / max(stats["seconds"], 1e-9)
  what = f"wrote {FLAGS.output_file} ({stats['lines']} lines)" if stats["wrote"] else "done with my share"
  resumed = f", resumed after {stats['resumed']} in earlier runs" if stats["resumed"] else ""
  return (f"{what}: this process embedded {stats['sentences']} sentences, {stats['tokens']} tokens in "
          f"{stats['seconds']:.1f} s ({rate:.1f} sent/s){resumed}")


def run() -> None:
  cli.run_main(main, define_flags)


if __name__ == "__main__":
  run()
