"""An ELMoForManyLangs-style model for Turkish, handed to EFML users and continued on another domain
(docs/finetune-released.md): the figures of that page.

    python benchmarks/efml_finetune.py --treebank_wheel=turkish_treebanks-1.0.0-py3-none-any.whl \
        [--root=runs/efml_finetune] [--results=results/efml_finetune] [--steps_a=2000] [--steps_b=500]

1. splits PyPI `turkish-treebanks==1.0.0` (Google's Turkish Web Treebank, Apache-2.0) by domain: web (blogs,
   forums, guides, how-tos, reviews; web.conllu) and wiki (wiki.conllu), each into train / valid / test by
   benchmarks/another_language.py's seeded hash of `sent_id`;
2. trains `configs/efml.py` (its default size, lexicons built from the text) on web's train split: run A,
   which exports an EFML release folder;
3. embeds web's test sentences with EFML's own package (`elmoformanylangs.Embedder` on A's export/) and with
   ours (`Embedder.from_pretrained(A)`): the max abs difference over the three layers;
4. continues A on wiki's train split (`configs/finetune.py`, init_from A's workdir, A's vocabulary: its softmax
   is taken over): run B;
5. scores A and B on both domains' valid splits with the trainer's own eval step (full softmax, the run's
   batches), and writes OUT/results.json (and the two runs' config.json; no weights).
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

from absl import app
from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import another_language  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

_PIP = "pip download --no-deps turkish-treebanks==1.0.0"
_WHEEL = flags.DEFINE_string("treebank_wheel", None, f"A downloaded wheel of turkish-treebanks==1.0.0 ({_PIP}).")
_ROOT = flags.DEFINE_string("root", os.path.join(REPO, "runs", "efml_finetune"), "Runs and data folder.")
_OUT = flags.DEFINE_string("results", os.path.join(REPO, "results", "efml_finetune"), "Result folder.")
_STEPS_A = flags.DEFINE_integer("steps_a", 2000, "Steps of run A (configs/efml.py's own: 2000).")
_STEPS_B = flags.DEFINE_integer("steps_b", 500, "Steps of run B, continued on the other domain.")
_SIZE = flags.DEFINE_list("size", [], "Overrides of run A's model size, e.g. options.lstm.dim=128 (default: none).")


def write_domains(wheel: str, folder: str) -> dict[str, dict[str, int]]:
  """folder/{web,wiki}/{train,valid,test}.txt.gz: each domain's raw sentences by the seeded hash split."""
  counts: dict[str, dict[str, int]] = {}
  with zipfile.ZipFile(wheel) as z:
    for domain in ("web", "wiki"):
      name = next(n for n in z.namelist() if n.endswith(f"{domain}.conllu"))
      sentences = another_language.read_conllu(z.read(name).decode("utf-8"))
      os.makedirs(os.path.join(folder, domain), exist_ok=True)
      counts[domain] = {}
      for split in ("train", "valid", "test"):
        part = [s["text"] for s in sentences if another_language.split_of(s["id"]) == split]
        with gzip.open(os.path.join(folder, domain, f"{split}.txt.gz"), "wt", encoding="utf-8") as f:
          f.writelines(t + "\n" for t in part)
        counts[domain][split] = len(part)
  return counts


def missing_input(wheel: str | None) -> str | None:
  """Why the benchmark cannot run (one line), or None: checked before anything is written or trained, since
  a missing wheel or EFML package would otherwise be a traceback (the package only after run A's training)."""
  if not wheel:
    return f"give --treebank_wheel=WHEEL, the optional turkish-treebanks wheel ({_PIP})"
  try:
    with zipfile.ZipFile(wheel) as z:
      lacking = [d for d in ("web", "wiki") if not any(n.endswith(f"{d}.conllu") for n in z.namelist())]
  except (OSError, zipfile.BadZipFile) as e:
    return f"--treebank_wheel={wheel}: not a readable wheel ({getattr(e, 'strerror', None) or e}); {_PIP}"
  if lacking:
    return f"--treebank_wheel={wheel}: holds no {'.conllu, '.join(lacking)}.conllu; not turkish-treebanks==1.0.0"
  try:
    import elmoformanylangs  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:  # the reference of step 3: an optional package (requirements-test.txt)
    return f"EFML's package elmoformanylangs cannot be imported ({e}); pip install it (requirements-test.txt)"
  return None


def train(workdir: str, config: str, *flags_: str) -> float:
  """train.py into `workdir` (resumes, or does nothing, if it already ran); returns the wall seconds."""
  started = time.time()
  subprocess.run([sys.executable, os.path.join(REPO, "train.py"), f"--workdir={workdir}", f"--config={config}",
                  "--noprogress", *flags_], check=True, cwd=REPO)
  return time.time() - started


def perplexity(workdir: str, eval_file: str, step: int | None = None) -> dict[str, float]:
  """The run's newest checkpoint (or `step`'s) scored on `eval_file` with the trainer's eval step, the run's vocabulary,
  lexicons, batch size and unroll length (what its `eval_ppl` records measure on its own eval split)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from elmo_jax.training import init_from, loop, variant  # pylint: disable=g-import-not-at-top
  from elmo_jax.training.input import make_input  # pylint: disable=g-import-not-at-top
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    c = ml_collections.ConfigDict(json.load(f))
  c.data.eval_files, c.data.vocab_file = eval_file, os.path.join(workdir, "vocab.txt")
  c.data.lexicon, c.init_from = os.path.join(workdir, variant.LEXICON_DIR), ""
  with tempfile.TemporaryDirectory() as scratch:
    c = variant.resolve(c, scratch)
    data = make_input(c, scratch, c.batch_size)
    steps, _ = loop.make_steps(c, c.options.to_dict(), len(data.vocab))
    params, _, step = init_from._restore_params(os.path.join(workdir, "checkpoints"), step)  # pylint: disable=protected-access
    result = loop.evaluate(c, data, steps, params)
  return {"step": step, "ppl": result["eval_ppl"], "ppl_forward": result["eval_ppl_forward"],
          "ppl_backward": result["eval_ppl_backward"], "tokens": result["eval_tokens"]}


def efml_vs_ours(workdir: str, text_file: str, n: int = 100) -> dict[str, float]:
  """Max abs difference of the three layers: EFML's Embedder on the run's export/ vs ours on the run."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from elmoformanylangs import Embedder as EFMLEmbedder  # pylint: disable=g-import-not-at-top
  from elmo_jax.data import Tokenizer  # pylint: disable=g-import-not-at-top
  from elmo_jax.embedding.embedder import Embedder  # pylint: disable=g-import-not-at-top
  tokenizer = Tokenizer(pretokenized=False)
  with gzip.open(text_file, "rt", encoding="utf-8") as f:
    sentences = [tokenizer(line) for line in f.read().splitlines()[:n]]
  sentences = [s for s in sentences if s]
  reference = EFMLEmbedder(os.path.join(workdir, "export"), batch_size=1)
  diffs = []
  ours = Embedder.from_pretrained(workdir).embed_sentences(sentences)
  for sentence, got in zip(sentences, ours):
    reference.model.encoder.reset_states()  # each sentence from a fresh state, as ours
    want = reference.sents2elmo([sentence], output_layer=-2)[0]
    diffs.append(float(np.abs(np.asarray(got) - want).max()))
  return {"sentences": len(sentences), "tokens": sum(map(len, sentences)), "max_abs_diff": max(diffs)}


def main(argv):
  del argv
  if (problem := missing_input(_WHEEL.value)) is not None:
    sys.exit(f"efml_finetune.py: error: {problem}")
  root, out = _ROOT.value, _OUT.value
  data = os.path.join(root, "data")
  counts = write_domains(_WHEEL.value, data)
  a, b = os.path.join(root, "a_web"), os.path.join(root, "b_wiki")
  text = lambda domain, split: os.path.join(data, domain, f"{split}.txt.gz")  # noqa: E731
  seconds_a = train(a, os.path.join(REPO, "configs", "efml.py"), f"--config.data.train_files={text('web', 'train')}",
                    f"--config.data.eval_files={text('web', 'valid')}", f"--config.num_train_steps={_STEPS_A.value}",
                    *(f"--config.{kv}" for kv in _SIZE.value))
  before = {d: perplexity(a, text(d, "valid")) for d in ("web", "wiki")}
  half = {d: perplexity(a, text(d, "valid"), _STEPS_A.value // 2) for d in ("web", "wiki")}
  agreement = efml_vs_ours(a, text("web", "test"))
  seconds_b = train(b, os.path.join(REPO, "configs", "finetune.py"), f"--config.init_from={a}",
                    f"--config.data.train_files={text('wiki', 'train')}", f"--config.data.eval_files={text('wiki', 'valid')}",
                    f"--config.data.vocab_file={a}/vocab.txt", "--config.freeze_bilm_steps=0",
                    f"--config.num_train_steps={_STEPS_B.value}", "--config.eval_every_steps=250",
                    "--config.checkpoint_every_steps=250")
  after = {d: perplexity(b, text(d, "valid")) for d in ("web", "wiki")}
  os.makedirs(out, exist_ok=True)
  for name, run in (("config_a.json", a), ("config_b.json", b)):
    shutil.copyfile(os.path.join(run, "config.json"), os.path.join(out, name))
  results = {"corpus": "PyPI turkish-treebanks==1.0.0 (Turkish Web Treebank, Apache-2.0), split by domain",
             "sentences": counts, "steps": {"a": _STEPS_A.value, "b": _STEPS_B.value},
             "train_seconds": {"a": seconds_a, "b": seconds_b}, "size_overrides": _SIZE.value,
             "efml_vs_ours": agreement, "perplexity_valid": {"a_web": before, "a_web_half": half, "b_wiki": after},
             "export": sorted(os.listdir(os.path.join(a, "export")))}
  with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  print(json.dumps(results, indent=1))


if __name__ == "__main__":
  app.run(main)
