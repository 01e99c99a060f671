"""A non-English biLM end to end (docs/other-languages.md): Turkish, from the Turkish Web Treebank.

    python benchmarks/another_language.py [--out=results/another_language] [--steps=2000] [--run=DIR]

1. fetches PyPI's `turkish-treebanks==1.0.0` (Google's Turkish Web Treebank, Apache-2.0: web.conllu +
   wiki.conllu, 4,849 sentences) with `pip download` (or takes `--wheel=FILE`), and splits its sentences by a
   seeded hash of `sent_id` into LM train / valid / test (85 / 5 / 10 %);
2. writes the raw sentences (`# text =`) as the LM's text files, and the same splits as CoNLL `word<TAB>TAG`
   files for the POS probe (train on the LM's train sentences, test on its test sentences). The treebank
   splits words into inflectional groups (`Açık` `la` `nma` `yan`, joined by SpaceAfter=No); a probe token is
   the surface word (the groups joined back), tagged with its last group's UPOS, which is the word's role
   in the sentence (punctuation stays a token of its own, as the tokenizer splits it);
3. counts the share of tokens whose UTF-8 bytes exceed the 48 that `max_characters_per_token=50` keeps
   (and of `--other_text` files: by default Chinese Tang poems from Debian's fortunes-zh, where installed);
4. trains `configs/default.py` on it (`--steps` steps, the default config otherwise) into RUN, then
   `evaluate.py`: perplexity on the test split against the unigram baseline, and the POS probe of the
   trained biLM against its untrained twin;
5. writes OUT/results.json (and OUT/perplexity.json, OUT/pos.json as evaluate.py wrote them; no weights).

`--slice=DIR --slice_sentences=N` instead writes the first N sentences of each split there (how the test
slice `data/tr-twt-tiny/` was made) and stops.
"""
from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

from absl import app
from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from elmo_jax.data import tokenize  # pylint: disable=g-import-not-at-top,wrong-import-position

PACKAGE = "turkish-treebanks==1.0.0"
_OUT = flags.DEFINE_string("out", os.path.join(REPO, "results", "another_language"), "Result folder.")
_RUN = flags.DEFINE_string("run", os.path.join(REPO, "runs", "another_language"), "The training run folder.")
_STEPS = flags.DEFINE_integer("steps", 2000, "Training steps (configs/default.py's own: 2000).")
_OTHER = flags.DEFINE_list("other_text", [p for p in ("/usr/share/games/fortunes/tang300",) if os.path.exists(p)],
                           "Other texts whose 50-byte cut share is reported too (default: Debian fortunes-zh's "
                           "Tang poems, where installed: `apt-get install fortunes-zh`).")
_WHEEL = flags.DEFINE_string("wheel", None, f"A downloaded wheel of {PACKAGE} (default: pip download it).")
_SLICE = flags.DEFINE_string("slice", None, "Write a small slice of the splits here and stop.")
_SLICE_N = flags.DEFINE_integer("slice_sentences", 300, "Train sentences of --slice (valid/test: a tenth).")


def fetch_wheel(folder: str) -> str:
  subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", folder, PACKAGE], check=True)
  return glob.glob(os.path.join(folder, "turkish_treebanks-*.whl"))[0]


def read_conllu(text: str) -> list[dict]:
  """CoNLL-U -> [{"id", "text", "words": [(surface word, UPOS)]}]; inflectional groups joined (see above)."""
  sentences, meta, rows = [], {}, []
  for line in text.splitlines() + [""]:
    if line.startswith("#"):
      key, _, value = line[1:].partition("=")
      meta[key.strip()] = value.strip()
    elif line.strip():
      cols = line.split("\t")
      if cols[0].isdigit():
        rows.append((cols[1], cols[3], "SpaceAfter=No" in cols[9]))
    elif rows:
      words, glue = [], False
      for form, upos, no_space in rows:
        if glue and upos != "PUNCT" and words[-1][1] != "PUNCT":
          words[-1] = (words[-1][0] + form, upos)
        else:
          words.append((form, upos))
        glue = no_space
      sentences.append({"id": meta["sent_id"], "text": meta["text"], "words": words})
      meta, rows = {}, []
  return sentences


def split_of(sent_id: str) -> str:
  h = int(hashlib.sha256(f"tr-twt:{sent_id}".encode()).hexdigest()[:8], 16) % 100
  return "test" if h < 10 else "valid" if h < 15 else "train"


def write_splits(sentences: list[dict], folder: str, limit: int | None = None) -> dict[str, int]:
  """folder/{train,valid,test}.txt.gz (raw sentences) and folder/pos/{train,test}.conll; sentence counts."""
  os.makedirs(os.path.join(folder, "pos"), exist_ok=True)
  counts = {}
  for split in ("train", "valid", "test"):
    part = [s for s in sentences if split_of(s["id"]) == split]
    if limit:
      part = part[: limit if split == "train" else max(1, limit // 10)]
    counts[split] = len(part)
    with gzip.open(os.path.join(folder, f"{split}.txt.gz"), "wt", encoding="utf-8") as f:
      f.writelines(s["text"] + "\n" for s in part)
    if split != "valid":
      with open(os.path.join(folder, "pos", f"{split}.conll"), "w", encoding="utf-8") as f:
        f.writelines("".join(f"{w}\t{t}\n" for w, t in s["words"]) + "\n" for s in part)
  return counts


def byte_limit_stats(sentences: list[dict], max_chars: int = 50, pretokenized: bool = False) -> dict:
  """Share of tokens (the trainer's Moses tokens, or `pretokenized`: whitespace-split) whose UTF-8 bytes
  exceed max_chars - 2 (BOW/EOW)."""
  tok = tokenize.Tokenizer(pretokenized=pretokenized)
  lengths = sorted(len(t.encode("utf-8")) for s in sentences for t in tok(s["text"]))
  chars = sorted(len(t) for s in sentences for t in tok(s["text"]))
  cut = sum(n > max_chars - 2 for n in lengths)

  def quantile(xs, q):
    return xs[min(len(xs) - 1, int(q * len(xs)))]
  return {"tokens": len(lengths), "cut_at_50": cut, "cut_share": cut / len(lengths),
          "max_bytes": lengths[-1], "bytes_p99": quantile(lengths, 0.99), "bytes_p999": quantile(lengths, 0.999),
          "chars_p999": quantile(chars, 0.999),
          "bytes_per_char": sum(lengths) / max(1, sum(chars)),
          "share_over": {n: sum(x > n - 2 for x in lengths) / len(lengths) for n in (20, 30, 40, 50)}}


def read_plain(path: str) -> list[dict]:
  """A text file (a fortune file too: `%` separators and ANSI colours dropped) as sentences, one a line."""
  with open(path, encoding="utf-8") as f:
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in f]
  return [{"text": line} for line in lines if line and line != "%"]


def _run(args: list[str]) -> None:
  print("+", " ".join(args), flush=True)
  subprocess.run([sys.executable, *args], check=True, cwd=REPO)


def main(argv):
  del argv
  with tempfile.TemporaryDirectory() as tmp:
    wheel = _WHEEL.value or fetch_wheel(tmp)
    with zipfile.ZipFile(wheel) as z:
      sentences = [s for name in ("data/web.conllu", "data/wiki.conllu")
                   for s in read_conllu(z.read(name).decode("utf-8"))]
  if _SLICE.value:
    print(json.dumps(write_splits(sentences, _SLICE.value, _SLICE_N.value)))
    return
  data = os.path.join(_RUN.value, "data")
  counts = write_splits(sentences, data)
  stats = byte_limit_stats(sentences)
  other = {path: {"moses": byte_limit_stats(read_plain(path)),
                  "whitespace": byte_limit_stats(read_plain(path), pretokenized=True)} for path in _OTHER.value}
  print(json.dumps({"turkish": stats, **other}), flush=True)
  if not os.path.exists(os.path.join(_RUN.value, "export", "weights.hdf5")):
    _run(["train.py", "--config=configs/default.py", f"--workdir={_RUN.value}", "--noprogress",
          f"--config.num_train_steps={_STEPS.value}", f"--config.data.train_files={data}/train.txt.gz",
          f"--config.data.eval_files={data}/valid.txt.gz"])
  ev = os.path.join(_RUN.value, "eval")
  _run(["evaluate.py", "--task=perplexity", f"--workdir={_RUN.value}", f"--text_file={data}/test.txt.gz",
        f"--output_dir={ev}", "--noprogress"])
  _run(["evaluate.py", "--task=pos", f"--workdir={_RUN.value}", f"--pos_train_file={data}/pos/train.conll",
        f"--pos_test_file={data}/pos/test.conll", f"--output_dir={ev}", "--noprogress"])
  os.makedirs(_OUT.value, exist_ok=True)
  for name in ("perplexity.json", "pos.json"):
    shutil.copy(os.path.join(ev, name), os.path.join(_OUT.value, name))
  with open(os.path.join(ev, "perplexity.json")) as f:
    ppl = json.load(f)
  with open(os.path.join(ev, "pos.json")) as f:
    pos = json.load(f)
  result = {"corpus": f"PyPI {PACKAGE} (Turkish Web Treebank, Apache-2.0)", "sentences": counts,
            "config": "configs/default.py", "num_train_steps": _STEPS.value, "byte_limit": stats,
            "byte_limit_other": other, "perplexity": ppl, "pos": pos}
  with open(os.path.join(_OUT.value, "results.json"), "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
  print(json.dumps({"ppl": ppl.get("ppl"), "unigram_ppl": ppl.get("unigram_ppl")}))


if __name__ == "__main__":
  app.run(main)
