"""The corpus-preparing command, `elmo-jax prepare --input=... --output_dir=...`.

The work (and the output directory's layout) is `elmo_jax.data.prepare.prepare`; this reads its flags, stages
a bucket `--output_dir` locally, and reports a refusal or Ctrl-C in one line.
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

from elmo_jax.data.manifest import PARTIAL, PrepareError
from elmo_jax.data.prepare import prepare
from elmo_jax.data.sources import split_paths
from elmo_jax.runtime import files
from elmo_jax.runtime import log
from elmo_jax.runtime import progress as progress_lib
from elmo_jax.runtime import storage


def main(argv: Sequence[str]) -> None:
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  if not f.progress:
    progress_lib.set_enabled(False)
  inputs = split_paths(f.input or "")
  output_dir = f.output_dir
  try:  # a bucket --output_dir: prepared in a local staging folder (resumable there), uploaded when done
    with storage.staged_output(f.output_dir, "--output_dir", directory=True, inputs=inputs) as output_dir:
      prepare(output_dir, inputs, tfds_name=f.tfds_name, tfds_split=f.tfds_split, tfds_data_dir=f.tfds_data_dir,
              tfds_text_key=f.tfds_text_key, pretokenized=f.pretokenized, max_token_chars=f.max_token_chars,
              vocab_max_size=f.vocab_max_size or None, vocab_min_count=f.vocab_min_count,
              vocab_file=f.vocab_file, num_workers=f.num_workers, chunk_sentences=f.chunk_sentences)
    if storage.is_remote(f.output_dir):
      log.info(f"uploaded to {f.output_dir}")
  except (PrepareError, files.UnsafeOutputError, storage.StorageError) as e:
    sys.exit(f"prepare: {e}")
  except KeyboardInterrupt:  # the workers ignore SIGINT: this is the only report
    work = os.path.join(os.path.abspath(output_dir), PARTIAL)
    kept = (f"rerun the same command to resume (finished chunks are kept in {work})" if os.path.isdir(work)
            else "nothing was written")
    print(f"prepare: interrupted; {kept}", file=sys.stderr, flush=True)
    sys.exit(130)


def define_flags() -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string("input", None, "Comma-separated text files or globs (.gz ok), one sentence per line.")
  flags.DEFINE_string("tfds_name", "", "A TFDS dataset (ArrayRecord, read without TensorFlow), e.g. lm1b.")
  flags.DEFINE_string("tfds_split", "train", "TFDS split.")
  flags.DEFINE_string("tfds_data_dir", "", "TFDS data_dir (default: TFDS's).")
  flags.DEFINE_string("tfds_text_key", "text", "Feature holding the sentence.")
  flags.DEFINE_string("output_dir", None, "Directory for the prepared corpus (created; resumable).")
  flags.DEFINE_bool("pretokenized", False, "Lines are already tokenized: split on whitespace (else Moses).")
  flags.DEFINE_integer("max_token_chars", 50, "Longer tokens are cut to this many characters for the char CNN.")
  flags.DEFINE_integer("vocab_max_size", 100_000, "Softmax vocabulary size incl. <S>, </S>, <UNK> (0 = all).")
  flags.DEFINE_integer("vocab_min_count", 1, "Tokens seen fewer times are <UNK> in the softmax.")
  flags.DEFINE_string("vocab_file", "", "Use this vocab.txt (bilm-tf format) instead of building one.")
  flags.DEFINE_integer("num_workers", max(1, (os.cpu_count() or 2) - 1), "Tokenizer processes.")
  flags.DEFINE_integer("chunk_sentences", 100_000, "Sentences per resumable chunk (not part of the output).")
  flags.DEFINE_bool("progress", True, "Progress bars on stderr.")
  flags.mark_flags_as_required(["output_dir"])


def run() -> None:
  """Defines the flags and runs `main` under absl (as `elmo-jax prepare` always has)."""
  from elmo_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run_main(main, define_flags)  # as every command: `--help` lists the flags
