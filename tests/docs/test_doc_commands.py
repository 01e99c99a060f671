"""Every shell command in the README and on the docs pages is either run by a test (at tiny settings) or listed
here with the reason it is not (a GPU/TPU, the internet, research data that does not ship, hours). A command
added to a page without either fails `test_every_command_is_run_or_listed`."""
from __future__ import annotations

import glob
import hashlib
import os
import re
import subprocess
import sys

import pytest
from paths import REPO_ROOT

# command (a regex searched in the command, its comment dropped) -> the test that runs it at tiny settings
RUN_BY = {
    r"^bash scripts/train\.sh$": "tests/docs/test_doc_commands.py::test_train_sh_trains_the_shipped_corpus",
    r"^source \.venv/bin/activate$": "tests/docs/test_doc_commands.py::test_the_readme_activates_the_venv_first",
    r"^elmo-jax embed --model=original .*--output_file=(elmo|all_layers|vectors|tokens|elmo_cached)\.hdf5":
        "tests/docs/test_readme_pretrained.py::test_readme_code_runs",
    r"^elmo-jax embed --model=original --input_file=sentences\.txt --output_file=elmo\.hdf5 --top$":
        "tests/docs/test_readme_pretrained.py::test_readme_code_runs",
    r"^elmo-jax embed --workdir=runs/\w+ --input_file=sentences\.txt --output_file=\w+\.hdf5$":
        "tests/training/test_train.py::test_export_matches_trained_params_and_embeds",
    r"^elmo-jax embed --options_file=options\.json --weight_file=weights\.hdf5 .*\[--stateful\]":
        "tests/embedding/test_embed_cli.py::test_stateful_reproduces_bilm_tf_fixture",
    r"^elmo-jax embed --model=original --input_file=corpus\.txt --output_file=elmo\.hdf5$":
        "tests/embedding/test_embed_parallel.py::test_kill_9_then_rerun_gives_the_same_file",
    r"^elmo-jax embed \.\.\. --devices=1$":
        "tests/embedding/test_embed_parallel.py::test_cli_devices_and_cluster_errors_are_one_line",
    r"^elmo-jax embed \.\.\. --coordinator_address=HOST0:1234 --num_processes=2 --process_id=[01]$":
        "tests/embedding/test_embed_parallel.py::test_two_processes_write_the_one_process_file",
    r"^elmo-jax embed --model=elmo_3/ ":
        "tests/interop/test_tfhub.py::test_embed_command_writes_the_module_outputs",
    r"^elmo-jax embed --model=zhs\.model ": "tests/interop/test_archive.py::test_efml_folder_is_handed_to_folder_resolution",
    r"^elmo-jax convert --from=elmo_3/ --to=elmo_3_bilm/$":
        "tests/interop/test_convert.py::test_round_trips_return_the_same_bits",
    r"^elmo-jax convert --from=elmo_3/ --to=elmo_3_stablehlo/ --format=stablehlo$":
        "tests/interop/test_portable.py::test_stablehlo_lowers_for_cpu_cuda_and_tpu_with_symbolic_batch_and_time",
    r"^elmo-jax convert --from=elmo_3/ --to=elmo_3_onnx/ --format=onnx$":
        "tests/interop/test_portable.py::test_onnx_equals_the_embedder_within_1e5_without_jax",
    r"^python examples/onnx_embed\.py elmo_3_onnx/ sentences\.txt layers\.npz$":
        "tests/interop/test_portable.py::test_onnx_equals_the_embedder_within_1e5_without_jax",
    r"^elmo-jax train --workdir=runs/mine --config=configs/default\.py --config\.data\.train_files=":
        "tests/docs/test_doc_commands.py::test_train_sh_trains_the_shipped_corpus",
    r"^elmo-jax train --workdir=runs/default --config=configs/default\.py \[--config\.key=value \.\.\.\]$":
        "tests/docs/test_doc_commands.py::test_train_sh_trains_the_shipped_corpus",
    r"^elmo-jax train --workdir=runs/default400 --config=configs/default\.py --config\.num_train_steps=400$":
        "tests/docs/test_doc_commands.py::test_train_sh_trains_the_shipped_corpus",
    r"^python docs/_hooks/notebooks\.py --workdir=runs/default400$": "tests/docs/test_notebook.py::test_notebook_runs_and_draws",
    r"^elmo-jax train --config=configs/default\.py --workdir=runs/ft --config\.init_from=runs/default ":
        "tests/training/test_domain_finetune.py::test_frozen_phase_keeps_the_bilm_then_trains_it",
    r"^elmo-jax train --workdir=/shared/run --config=configs/lm1b\.py +--coordinator_address=":
        "tests/training/test_multihost.py::test_two_processes_match_one_and_resume",
    r"^elmo-jax prepare --input='corpus/\*\.txt\.gz' --output_dir=prepared/corpus --num_workers=":
        "tests/data/test_prepare.py::test_prepare_is_byte_identical_for_any_worker_count_and_verifies",
    r"^elmo-jax plan --config=configs/default\.py --target=cpu:8$":
        "tests/plan/test_plan.py::test_step_work_per_device_does_not_grow_with_devices",
    r"^elmo-jax evaluate --task=perplexity --workdir=runs/default --text_file=":
        "tests/evaluation/test_perplexity.py::test_matches_trainer_eval_and_writes_json_and_plots",
    r"^elmo-jax evaluate --task=all --workdir=runs/default$":
        "tests/evaluation/test_evaluate_all.py::test_all_runs_what_has_data_and_skips_the_rest_in_one_line_each",
    r"^elmo-jax evaluate --task=all --workdir=runs/default(400)? --probe_data_dir=PROBES$":
        "tests/evaluation/test_evaluate_all.py::test_probe_data_dir_supplies_the_probe_sets",
    r"^elmo-jax evaluate --task=wsd --options_file=O\.json --weight_file=W\.hdf5 --wsd_file=":
        "tests/evaluation/test_evaluate_all.py::test_all_runs_what_has_data_and_skips_the_rest_in_one_line_each",
    r"^elmo-jax downstream --task=(pos|sentiment) --elmo=(none|frozen|finetune) .*--data_dir=":
        "tests/downstream/test_downstream.py::test_cli_runs_and_tables",
    r"^elmo-jax downstream --task=sentiment --elmo=frozen .*--train=tfds:glue/sst2:train":
        "tests/downstream/test_downstream.py::test_missing_split_is_one_line_naming_the_flag",
    r"^elmo-jax downstream table ": "tests/downstream/test_downstream.py::test_cli_runs_and_tables",
    r"^elmo-jax train --config=configs/finetune\.py --config\.init_from=":
        "tests/training/test_efml_finetune.py::test_frozen_phase_keeps_the_efml_bilm_and_word_embedding_bit_for_bit",
    r"^elmo-jax convert --from=\S+ --to=\S+ --format=efml":
        "tests/interop/test_efml_export.py::test_efml_round_trip_same_bits_and_loads_in_efml",
    r"^elmo-jax train --config=configs/efml\.py ":
        "tests/training/test_efml_finetune.py::test_new_language_config_beats_unigram_and_exports_for_efml",
    r"^curl -sf http://127\.0\.0\.1:8000/": "tests/serving/test_serve_process.py::test_docs_curl_and_python_examples_run",
    r"^python benchmarks/serve_load\.py --preset=small$": "tests/serving/test_serve_process.py::test_load_benchmark_smoke",
    r"^elmo-jax convert --format=safetensors --from=small --to=elmo_small/$":
        "tests/interop/test_make_zoo.py::test_make_zoo_converts_every_released_model_from_a_mirror",
    r"^elmo-jax embed --model=elmo_small/ --input_file=sentences\.txt --output_file=out\.hdf5$":
        "tests/interop/test_make_zoo.py::test_make_zoo_converts_every_released_model_from_a_mirror",
    r"^(pip install -e \"\.\[ray\]\" && )?elmo-jax embed --engine=ray --model=small --input_file='(corpus|data/pd-small)/\*\.txt\.gz' "
    r"--output_dir=embedded/ --average$":
        "tests/engines/test_ray_engine.py::test_the_pages_command_and_python_blocks_run",
    r"^elmo-jax push --to=hf://owner/elmo-small elmo_small/$":
        "tests/interop/test_hub.py::test_the_push_command_pushes_a_checked_folder",
}
# command -> why no test runs it
NOT_RUN = {
    r"^bash scripts/test\.sh( |$)": "it is the test suite; CI runs it from a clean clone (.ci/run)",
    r"^ELMO_JAX_EXTRA=cuda12 bash scripts/train\.sh": "needs an NVIDIA GPU (the GPU check: benchmarks/gpu_check.py)",
    r"^pip install ": "changes the environment it runs in; pyproject's extras are checked by "
                     "tests/training/test_newcomer_train.py::test_package_declares_dependencies_extras_and_console_scripts",
    r"^elmo-jax plan --config=configs/lm1b\.py --target=v5e:": "needs libtpu (the plan-tpu extra, 1.3 GB); "
        "tests/plan/test_plan.py::test_plan_compiles_for_tpu_v5e_without_hardware runs a v5e plan where it is installed",
    r"^bash scripts/plan\.sh ": "installs the planner's compilers (internet, 2.5 GB) and compiles lm1b for minutes",
    r"^pip install tensorboard": "internet; TensorBoard is not a dependency",
    r"^tensorboard --logdir": "a web UI; the traces it reads are tests/training/test_profile.py's",
    r"^elmo-jax convert --from=runs/default --to=gs://": "a real bucket; local --to is "
        "tests/interop/test_convert.py's, bucket writes tests/runtime/test_storage.py's (fake-gcs-server)",
    r"^elmo-jax train --workdir=runs/small --config=configs/small\.py ": "the 13.6M-parameter small preset: hours on a CPU",
    r"^elmo-jax train --workdir=runs/lm1b --config=configs/lm1b\.py": "TFDS lm1b (internet, 4 GB) and an accelerator",
    r"^elmo-jax prepare --tfds_name=lm1b ": "TFDS lm1b (internet); a TFDS source is "
        "tests/data/test_prepare.py::test_prepare_from_tfds_equals_the_same_text's",
    r"^gcloud compute tpus tpu-vm ssh ": "a TPU pod (its VMs and a bucket)",
    r"^for s in 0 1 2; do for e in none frozen finetune; do elmo-jax downstream ":
        "nine runs of the downstream commands above on research data that does not ship",
    r"^bash scripts/reference\.sh ": "research probe data that does not ship, and about two hours",
    r"^python benchmarks/another_language\.py": "downloads turkish-treebanks from PyPI (internet) and trains 21 min; "
        "tests/evaluation/test_another_language.py::test_turkish_bilm_beats_unigram is the same at tiny size",
    r"^PYTHON=python3\.12 bash scripts/(test|train)\.sh": "installs the Python 3.12 lock (minutes, torch's 4 GB CUDA "
        "build); .ci/run runs the quick tier on it, tests/runtime/test_stack.py checks the lock is chosen by Python",
    r"^PYTHON=python3\.12 bash scripts/plan\.sh ": "installs the newest jax's planner compilers (2.5 GB) and "
        "compiles lm1b for minutes",
    r"^bash scripts/device_wheels\.sh": "downloads wheels from the package index (internet)",
    r"^bash scripts/device_check\.sh ": "a GPU machine; its refusals are tests/runtime/test_stack.py's",
    r"^unshare -n env JAX_PLATFORMS=cpu bash scripts/device_check\.sh ": "the simulated GPU image: a Python 3.12 "
        "venv of the image's packages plus .whl/ (minutes of installs, then the CPU mode of the GPU check)",
    r"^python benchmarks/(train|embed)_throughput\.py ": "speed benchmarks: they print JSON, never asserted, minutes",
    r"^python benchmarks/efml_finetune\.py ": "a turkish-treebanks wheel from PyPI (internet) and about 45 minutes; "
        "tests/training/test_efml_finetune.py is the same at tiny size",
    r"^python -c \"from elmo_jax\.embedding\.embedder import Embedder; Embedder\.from_pretrained\('small'\)":
        "downloads the small model (internet); a warm load is tests/embedding/test_embed_latency.py's",
    r"^python -m pip install --no-deps --target /tmp/allennlp_pkg ": "internet; the AllenNLP baseline is optional",
    r"^ray start --(head --port=6379|address=HEAD:6379)$": "a Ray cluster's nodes (several machines); the tests "
        "start a local cluster with ray.init and join it by its address",
    r"^elmo-jax embed --engine=ray --ray_address=HEAD:6379 ": "a Ray cluster of several nodes, GPUs and a bucket; "
        "tests/engines/test_ray_engine.py joins a local cluster by its address, tests/engines/test_ray_buckets.py "
        "reads and writes a bucket (fake-gcs-server)",
    r"^elmo-jax serve --model=original": "downloads the original model (internet); "
        "tests/serving/test_serve_process.py serves bilm-tf's fixture folder the same way",
    r"^python benchmarks/embed_latency\.py ": "a latency benchmark (JSON, never asserted); its keys are "
        "tests/embedding/test_embed_latency.py's smoke run",
    r"^python benchmarks/portable_latency\.py ": "a latency benchmark (JSON, never asserted); its keys are "
        "tests/interop/test_portable.py's smoke run",
    r"^elmo-jax embed --model=hf://owner/elmo-small@v1 ": "a real Hub repository (internet); hf:// specs are "
        "tests/interop/test_hub.py's, against a fake Hub on 127.0.0.1",
    r"^bash scripts/make_zoo\.sh zoo/$": "downloads every released model (internet, about 1 GB); "
        "tests/interop/test_make_zoo.py runs it against a file:// mirror of fixture models",
    r"^for d in zoo/\*/; do elmo-jax push --to=hf://OWNER/": "publishes to the real Hub with its owner's token; "
        "tests/interop/test_hub.py::test_the_push_command_pushes_a_checked_folder pushes to a fake Hub",
}
COMMAND_START = re.compile(r"^(python|bash|pip|elmo-jax|tensorboard|gcloud|curl|for )")


def doc_files() -> list[str]:
  pages = sorted(glob.glob(os.path.join(REPO_ROOT, "docs", "**", "*.md"), recursive=True))
  return [os.path.join(REPO_ROOT, "README.md")] + pages


def blocks(text: str) -> list[tuple[str, str]]:
  """(language, body) of every fenced block."""
  return re.findall(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", text, re.S | re.M)


def commands() -> list[tuple[str, str]]:
  """(file, command) of every command in a bash block: continuation lines joined, the comment dropped."""
  found = []
  for path in doc_files():
    with open(path, encoding="utf-8") as f:
      text = f.read()
    for language, body in blocks(text):
      if language not in ("bash", "sh", "shell"):
        continue
      for line in re.split(r"(?<!\\)\n", body):
        command = re.sub(r"\s+#\s.*$", "", re.sub(r"\\\n\s*", " ", line)).strip()
        if command and not command.startswith("#"):
          found.append((os.path.relpath(path, REPO_ROOT), command))
  return found


def test_every_command_is_run_or_listed():
  found = commands()
  assert len(found) > 40, found
  unlisted = [(f, c) for f, c in found if not any(re.search(p, c) for p in (*RUN_BY, *NOT_RUN))]
  assert unlisted == [], "run these in a test (RUN_BY) or say why not (NOT_RUN): " + repr(unlisted)
  unused = [p for p in (*RUN_BY, *NOT_RUN) if not any(re.search(p, c) for _, c in found)]
  assert unused == [], f"entries no page has any more: {unused}"
  assert all(len(reason) > 10 for reason in NOT_RUN.values())


def test_every_command_has_the_one_form():
  """`elmo-jax <command>` on every page; `python -m elmo_jax` and `python train.py` / `evaluate.py` are the same
  commands, said once (README, Install), never a second form in a command block."""
  other = [(f, c) for f, c in commands() if re.match(r"^(PYTHONPATH=\S+ )?python (-m elmo_jax\b|train\.py|evaluate\.py)", c)]
  assert other == [], other


def test_the_tests_named_exist():
  """RUN_BY's tests, and every `tests/X.py::test_y` a page names as the check of a claim (it must not point
  at a test renamed or gone)."""
  cited = set()
  for page in doc_files():
    with open(page, encoding="utf-8") as f:
      cited.update(re.findall(r"tests/[\w/]+\.py::test_\w+", f.read()))
  assert len(cited) >= 6, cited
  for where in set(RUN_BY.values()) | cited:
    path, name = where.split("::")
    with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
      assert re.search(rf"^def {name}\(", f.read(), re.M), where


def test_commands_sit_in_bash_blocks():
  """A command in an unlabelled block would escape the check above."""
  for path in doc_files():
    with open(path, encoding="utf-8") as f:
      for language, body in blocks(f.read()):
        first = body.lstrip().splitlines()[0] if body.strip() else ""
        assert language or not COMMAND_START.match(first), (path, first)


def _script_would_install() -> bool:
  """scripts/env.sh installs into .venv unless its stamp matches requirements.txt + pyproject.toml."""
  stamp = os.path.join(REPO_ROOT, ".venv", ".requirements.sha256")
  if not os.path.exists(stamp) or not os.path.samefile(sys.prefix, os.path.join(REPO_ROOT, ".venv")):
    return True
  with open(os.path.join(REPO_ROOT, "requirements.txt"), "rb") as a, \
       open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as b:
    want = hashlib.sha256(a.read() + b.read()).hexdigest()
  with open(stamp) as f:
    return f.read().strip() != want


@pytest.mark.slow  # prepares data/pd-small (~340k tokens) and trains the default config for 2 steps
def test_train_sh_trains_the_shipped_corpus(tmp_path):
  """The README's first command on the corpus shipped in data/: `bash scripts/train.sh` itself where its
  `.venv` is set up (CI), else the `train.py` command it runs, with this interpreter."""
  flags = [f"--workdir={tmp_path / 'run'}", "--config.num_train_steps=2", "--config.eval_every_steps=2",
           "--config.checkpoint_every_steps=2", "--config.log_every_steps=1"]
  if _script_would_install():
    argv = [sys.executable, "train.py", "--config=configs/default.py", *flags]
  else:
    argv = ["bash", "scripts/train.sh", *flags]
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO_ROOT, "ELMO_JAX_CACHE": str(tmp_path / "cache")}
  proc = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  export = tmp_path / "run" / "export"
  assert (export / "options.json").exists() and (export / "weights.hdf5").exists()
  with open(tmp_path / "run" / "config.json") as f:
    assert "pd-small" in f.read()  # the shipped corpus, configs/default.py's


def test_the_readme_activates_the_venv_first():
  """The README's `source .venv/bin/activate` comes before its first `elmo-jax` command, and in a new shell
  (no environment activated) it makes `elmo-jax` the environment's (where `.venv` is set up, as in CI)."""
  readme = [c for f, c in commands() if f == "README.md"]
  first = next(i for i, c in enumerate(readme) if c.startswith("elmo-jax"))
  assert "source .venv/bin/activate" in readme[:first], readme[:first + 1]
  activate = os.path.join(REPO_ROOT, ".venv", "bin", "activate")
  if not os.path.exists(activate):
    pytest.skip("no .venv here (scripts/test.sh makes it)")
  env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
  env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
  proc = subprocess.run(["bash", "-c", "source .venv/bin/activate && elmo-jax --help"], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0 and "usage: elmo-jax <command>" in proc.stdout, proc.stderr[-2000:]
