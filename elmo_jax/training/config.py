"""The base training config; `configs/*.py` start from it and change what differs."""
from __future__ import annotations

import os

import ml_collections

from elmo_jax.formats import options as options_lib


def base_config() -> ml_collections.ConfigDict:
  """Every key with its default and why (as the Flax examples' configs); `c.data` is `_data_config()`."""
  c = ml_collections.ConfigDict()
  # --- keys scripts rely on -------------------------------------------------------------------------
  c.seed = 0
  c.batch_size = 128  # global, in sequences (batch rows), split over all devices of all processes
  # The alternative to batch_size (MaxText's): rows per device, so one config runs on any device count;
  # exactly one of the two is set (> 0), the other 0. `global_batch_size` is the one place that decides.
  c.per_device_batch_size = 0
  c.unroll_steps = 20  # truncated-BPTT window in tokens
  c.num_train_steps = 1000
  c.eval_every_steps = 500
  c.checkpoint_every_steps = 500
  c.log_every_steps = 50
  # --- model: the options.json of the biLM ---------------------------------------------------------
  c.options = ml_collections.ConfigDict(options_lib.preset("small"))
  c.dtype = "float32"  # compute dtype of the matmuls; params and optimizer state stay float32
  c.scan_unroll = 1
  # Run the char CNN once per distinct token of each device's rows instead of on every position of both
  # windows (exact; the step compiles once per table-size bucket). See elmo_jax/data/dedupe.py.
  c.dedupe_tokens = True
  c.dropout = 0.1
  # --- softmax ----------------------------------------------------------------------------------------
  c.n_negative_samples = 8192  # sampled softmax (bilm-tf); 0 = full softmax. Full when vocab is smaller.
  # Split the softmax W [V, P] and its optimizer state along P over the devices instead of replicating it:
  # the step then moves ~MBs of softmax rows and their gradient instead of all-reducing all of W
  # (3.3 GB per step for lm1b; `elmo-jax plan` shows the bytes). Same losses.
  c.shard_softmax = False
  # --- optimizer (bilm-tf: Adagrad 0.2, initial accumulator 1.0, global-norm clip 10) -------------------
  c.optimizer = "adagrad"  # adagrad | adam | adamw
  c.learning_rate = 0.2
  c.adagrad_initial_accumulator = 1.0
  c.grad_clip = 10.0
  c.weight_decay = 0.0
  c.warmup_steps = 0
  # --- data ---------------------------------------------------------------------------------------------
  c.data = _data_config()
  c.eval_max_batches = 0  # 0 = the whole eval split
  # --- host/device overlap ------------------------------------------------------------------------------
  c.prefetch_batches = 2  # batches built and put on the devices ahead of the step that uses them
  c.stop_check_every_steps = 10  # several processes: how often they agree on a SIGTERM (a collective)
  # --- checkpoints ------------------------------------------------------------------------------------
  c.keep_checkpoints = 3
  # A save (Orbax step, its checksums, the export) must be on disk or in the bucket this many seconds after it
  # began, else the run stops with one line (exit 1) and keeps the last finished checkpoint: a disk or bucket
  # that stops answering otherwise hangs the run in retries. Saves overlap the steps that follow them.
  c.checkpoint_timeout_s = 600.0
  c.init_from = ""  # another run's workdir/checkpoint, an original ELMo options.json (weights beside),
  # or a released ELMo by name (small, medium, original, original_5.5B) or URL, downloaded once
  # Domain fine-tuning: for the first N steps of the run only the softmax trains; the biLM's weights and its
  # optimizer state stay exactly as init_from left them (elmo_jax/training/freeze.py), then everything
  # trains. Use it when init_from brings no softmax (a new vocabulary, or released ELMo files, which have
  # none): a random softmax's first gradients would otherwise flow into the pretrained biLM. 0 = off.
  c.freeze_bilm_steps = 0
  # The export's format (WORKDIR/export/): "" = the model's own ("efml" for an ELMoForManyLangs-style model:
  # a release folder its Embedder loads; else "bilm-hdf5"); "safetensors": elmo_jax's own folder (any model);
  # a format that cannot hold the model is refused.
  c.export_format = ""
  _profile_keys(c)
  return c


def _profile_keys(c: ml_collections.ConfigDict) -> None:
  """`base_config`'s profiling keys."""
  # "START:COUNT" captures a jax.profiler trace of steps START..START+COUNT-1 (training/profile.py), after
  # their compile; "" = off. Into profile_dir ("" = WORKDIR/profile; a gs:// path is uploaded when done),
  # on process 0 only unless profile_all_processes.
  c.profile_steps = ""
  c.profile_dir = ""
  c.profile_all_processes = False


class BatchSizeError(ValueError):
  """batch_size / per_device_batch_size that give no global batch for these devices; one line."""


def global_batch_size(batch_size: int, per_device_batch_size: int, n_devices: int) -> int:
  """The global batch in rows (over all devices of all processes): `batch_size`, or
  `per_device_batch_size * n_devices`; exactly one of the two is > 0, and the batch splits over the devices."""
  for key, value in (("batch_size", batch_size), ("per_device_batch_size", per_device_batch_size)):
    if value < 0:
      raise BatchSizeError(f"config.{key}={value}: must be >= 0")
  if batch_size and per_device_batch_size:
    raise BatchSizeError(f"config.batch_size={batch_size} and config.per_device_batch_size="
                         f"{per_device_batch_size} are both set; set one of them and the other to 0 (e.g. "
                         "--config.batch_size=0)")
  if not batch_size and not per_device_batch_size:
    raise BatchSizeError("config.batch_size=0 and config.per_device_batch_size=0: set one of them (the global "
                         "batch in rows, or rows per device)")
  if per_device_batch_size:
    return per_device_batch_size * n_devices
  if batch_size % n_devices:
    raise BatchSizeError(f"config.batch_size={batch_size} must be divisible by the {n_devices} devices (e.g. "
                         f"--config.batch_size={-(-batch_size // n_devices) * n_devices}); or give rows per device: "
                         f"--config.per_device_batch_size={max(batch_size // n_devices, 1)} --config.batch_size=0")
  return batch_size


def with_global_batch(config: ml_collections.ConfigDict, n_devices: int) -> ml_collections.ConfigDict:
  """A copy of `config` whose `batch_size` is the global batch on `n_devices` (`global_batch_size`), which is
  what the trainer reads, config.json and checkpoints record and a resume compares; `per_device_batch_size`
  stays as given (it says how the batch was asked for). Raises BatchSizeError."""
  rows = global_batch_size(config.batch_size, config.per_device_batch_size, n_devices)
  resolved = config.copy_and_resolve_references()
  resolved.batch_size = rows
  return resolved


def _data_config() -> ml_collections.ConfigDict:
  """`base_config().data`: where the corpus comes from and how it is tokenized, split and made a vocabulary."""
  d = ml_collections.ConfigDict()
  d.train_files = "data/pd-small/train.txt.gz"  # comma-separated files or globs
  d.eval_files = "data/pd-small/valid.txt.gz"
  # A corpus prepared by `elmo-jax prepare` (ids + type table): no tokenizing while training.
  # Set, it replaces train_files/tfds_name (and prepared_eval_dir replaces eval_files / the TFDS eval split).
  d.prepared_dir = ""
  d.prepared_eval_dir = ""
  # Text corpora up to this size are prepared automatically into workdir/prepared/ (0 = never).
  d.auto_prepare_max_mb = 1024
  d.tfds_name = ""  # e.g. "lm1b": read TFDS (ArrayRecord) instead of text files
  d.tfds_data_dir = ""
  d.tfds_train_split = "train"
  d.tfds_eval_split = "test"
  d.tfds_text_key = "text"
  d.tfds_download = False
  d.pretokenized = False  # True: whitespace-split lines; False: Moses tokenizer
  d.vocab_file = ""  # an existing vocab (bilm-tf format); empty = build from the training split
  d.vocab_max_size = 100_000  # including <S>, </S>, <UNK>
  d.vocab_min_count = 1
  d.max_token_chars = 50
  # An ELMoForManyLangs-style model's char.dic + word.dic: their folder, or "build" (from the training text,
  # data/lexicon.py); set from an EFML init_from by itself. "" for bilm-tf's byte ids.
  d.lexicon = ""
  # How processes split the training data: "sentences" (process p reads sentences p::P) or "rows" (all
  # processes walk one global stream, each producing its rows of the global batch: the batches are then
  # the same for any process count).
  d.shard = "sentences"
  return d


def config_path(argv: list[str], default_config_file: str, flag_name: str = "config") -> str:
  """The `--config=FILE[:ARG]` of `argv` (or the default), as config_flags will read it."""
  import re
  path = default_config_file
  for i, arg in enumerate(argv):
    m = re.match(rf"^--?{flag_name}(?:=(.*))?$", arg)
    if m:
      path = m.group(1) if m.group(1) is not None else (argv[i + 1] if i + 1 < len(argv) else path)
  return path


def _load_config(argv: list[str], default_config_file: str, flag_name: str) -> ml_collections.ConfigDict:
  import importlib.util
  file, _, arg = config_path(argv, default_config_file, flag_name).partition(":")
  spec = importlib.util.spec_from_file_location("_config_for_override_check", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def config_file_error(argv: list[str], default_config_file: str, flag_name: str = "config") -> str | None:
  """One line when `--config=FILE` is missing or does not load (config_flags: two tracebacks), else None."""
  import difflib
  file = config_path(argv, default_config_file, flag_name).partition(":")[0]
  if not os.path.isfile(file):
    folder = os.path.dirname(file) or "."
    known = sorted(n for n in os.listdir(folder) if n.endswith(".py")) if os.path.isdir(folder) else []
    close = difflib.get_close_matches(os.path.basename(file), known, n=1)
    hint = (f"; did you mean {os.path.join(os.path.dirname(file), close[0])}?" if close
            else f"; {folder} has: {', '.join(known)}" if known
            else f"; there is no folder {folder} in {os.getcwd()}" if not os.path.isdir(folder) else "")
    return f"--{flag_name}={file}: no such config file{hint}"
  try:
    _load_config(argv, default_config_file, flag_name)
  except Exception as e:  # pylint: disable=broad-except  (any error of a user's config file, in one line)
    return f"--{flag_name}={file} does not load: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
  return None


def unknown_override_error(argv: list[str], default_config_file: str, flag_name: str = "config") -> str | None:
  """One line naming the first `--config.a.b=...` of `argv` that the config file lacks, else None.

  ml_collections' config_flags meets an unknown key with a 50-line traceback, raised while the flag is
  defined (when the config file is not given explicitly) or parsed, where no `main` can catch it; scripts
  call this before `DEFINE_config_file`. Ill-typed values need nothing: absl already reports them in one
  line naming the flag. Anything unusual (a config file that does not load, indexed keys) returns None and
  is left to config_flags.
  """
  import difflib
  import re

  file = config_path(argv, default_config_file, flag_name).partition(":")[0]
  try:
    config = _load_config(argv, default_config_file, flag_name)
  except Exception:  # pylint: disable=broad-except
    return None
  for arg in argv:
    m = re.match(rf"^--?(?:no)?{flag_name}\.([^=]+)", arg)
    if not m or "[" in m.group(1):
      continue
    node = config
    for depth, part in enumerate(m.group(1).split(".")):
      if isinstance(node, ml_collections.ConfigDict) and part in node:
        node = node[part]
        continue
      if not isinstance(node, ml_collections.ConfigDict):
        break  # a leaf that config_flags may still index (e.g. a dict field); not ours to judge
      known = sorted(node.keys())
      close = difflib.get_close_matches(part, known, n=1)
      where = ".".join([flag_name, *m.group(1).split(".")[:depth]])
      hint = f"; did you mean '{close[0]}'?" if close else f"; {where} has: {', '.join(known)}"
      return f"unknown config key '{flag_name}.{m.group(1)}' in {arg!r} ({file}){hint}"
  return None


def released_config(preset: str) -> ml_collections.ConfigDict:
  """A released ELMo size (`small`/`medium`/`original`) with bilm-tf's recipe from `base_config`."""
  c = base_config()
  c.options = ml_collections.ConfigDict(options_lib.preset(preset))
  c.batch_size = 128
  c.num_train_steps = 100_000
  c.eval_every_steps = 5_000
  c.checkpoint_every_steps = 5_000
  c.log_every_steps = 100
  return c
