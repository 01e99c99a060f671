"""config.profile_steps (issue 32, item 3): a jax.profiler trace of chosen steps, after their compile, that
leaves the run's steps, metrics and resume as they are; bad values are one line before anything is written."""
from __future__ import annotations

import glob
import gzip
import json
import os

import jax
import pytest

import launch_util
import tiny
from elmo_jax.training import preflight, profile


@pytest.mark.parametrize("text, parsed", [("", None), ("2:3", (2, 3)), (" 10 : 1 ", (10, 1))])
def test_profile_steps_parse(text, parsed):
  assert profile.parse_steps(text) == parsed


def _corpus(tmp_path) -> str:
  path = tmp_path / "train.txt"
  if not path.exists():
    path.write_text("".join(f"the cat {i % 7} sat on mat {i % 5} .\n" for i in range(60)))
  return str(path)


@pytest.mark.parametrize("value, words", [
    ("5", "config.profile_steps='5': expected START:COUNT with START >= 1 and COUNT >= 1 (e.g. '10:3' traces "
          "steps 10-12), or '' for none"),
    ("a:b", "config.profile_steps='a:b': expected START:COUNT"),
    ("-1:2", "config.profile_steps='-1:2': expected START:COUNT"),
    ("0:2", "config.profile_steps='0:2': expected START:COUNT"),
    ("3:0", "config.profile_steps='3:0': expected START:COUNT"),
    (5, "config.profile_steps=5: expected START:COUNT"),
    ("2000:2", "config.profile_steps='2000:2' starts after the last step (config.num_train_steps=1000)"),
])
def test_bad_profile_steps_are_one_line_before_anything_is_written(tmp_path, value, words):
  config = tiny.train_config(_corpus(tmp_path))
  if isinstance(value, int):  # a config file may set any type
    del config["profile_steps"]
  config.profile_steps = value
  before = sorted(os.listdir(tmp_path))
  with pytest.raises(preflight.PreflightError) as e:
    preflight.check(config, str(tmp_path / "run"))
  assert str(e.value).startswith(words) and "\n" not in str(e.value)
  assert sorted(os.listdir(tmp_path)) == before


def test_profile_dir_defaults_to_the_workdir_and_is_checked_as_an_output(tmp_path):
  config = tiny.train_config(_corpus(tmp_path), profile_steps="2:2")
  assert profile.profile_dir(config, "gs://bucket/run") == "gs://bucket/run/profile"
  config.profile_dir = str(tmp_path / "train.txt")  # a file where a folder goes
  with pytest.raises(preflight.PreflightError, match="config.profile_dir=.*train.txt is a file, not a directory"):
    preflight.check(config, str(tmp_path / "run"))


def _train(tmp_path, workdir: str, steps: int, capsys, **overrides) -> str:
  from elmo_jax.training.loop import train_and_evaluate
  config = tiny.train_config(_corpus(tmp_path), **{"num_train_steps": steps, "log_every_steps": 2,
                                                   "checkpoint_every_steps": 2, "n_negative_samples": 0,
                                                   "data.vocab_max_size": 50, **overrides})
  train_and_evaluate(config, workdir)
  return capsys.readouterr().out


def _traces(workdir: str) -> list[str]:
  return sorted(glob.glob(os.path.join(workdir, "profile", "plugins", "profile", "*")))


@pytest.mark.slow
def test_two_steps_are_traced_and_a_resume_past_them_traces_nothing(tmp_path, capsys):
  run = str(tmp_path / "run")
  out = _train(tmp_path, run, 4, capsys, profile_steps="2:2")
  traces = _traces(run)
  assert len(traces) == 1, out
  assert f"step 3: profile of steps 2-3 written to {traces[0]}" in out
  xplane, = glob.glob(os.path.join(traces[0], "*.xplane.pb"))
  data = jax.profiler.ProfileData.from_file(xplane)  # parses: the planes TensorBoard's profile plugin reads
  names = {e.name for plane in data.planes for line in plane.lines for e in line.events}
  assert any(plane.name == "/host:CPU" for plane in data.planes) and "train" in names  # the step annotations
  with gzip.open(os.path.join(traces[0], "perfetto_trace.json.gz")) as f:
    assert json.load(f)["traceEvents"]  # what ui.perfetto.dev opens
  # A resume whose profile_steps are behind it captures nothing, in one line.
  out = _train(tmp_path, run, 6, capsys, profile_steps="2:2")
  assert out.count("config.profile_steps='2:2': steps 2-3 ran before this run's first step (5, resumed); no "
                   "profile captured") == 1, out
  assert _traces(run) == traces
  # The profiled, resumed run's records are those of one run without a profile.
  plain = str(tmp_path / "plain")
  _train(tmp_path, plain, 6, capsys)
  assert launch_util.records(run) == launch_util.records(plain)
  assert [r["step"] for r in launch_util.records(run) if "train_loss" in r] == [2, 4, 6]


@pytest.mark.parametrize("inside", ["export", "checkpoints", "export/trace"])
def test_a_profile_dir_inside_the_runs_own_replaced_folders_is_refused_on_a_fresh_run(tmp_path, inside):
  """The next export deleted the trace the log said was written: refused before anything is written."""
  run = str(tmp_path / "run")
  config = tiny.train_config(_corpus(tmp_path), profile_steps="2:2", profile_dir=os.path.join(run, inside))
  before = sorted(os.listdir(tmp_path))
  with pytest.raises(preflight.PreflightError, match=rf"config\.profile_dir=.*{inside} is inside this run's "
                     rf"{inside.split('/')[0]}/ folder, which the run replaces whole"):
    preflight.check(config, run)
  assert sorted(os.listdir(tmp_path)) == before


def test_a_trace_that_cannot_be_written_is_a_warning_not_the_end_and_not_written(tmp_path, capsys, monkeypatch):
  def refuse(*args, **kwargs):
    raise RuntimeError("cannot write the trace (injected)")
  monkeypatch.setattr(jax.profiler, "stop_trace", lambda: (_ for _ in ()).throw(RuntimeError("disk full (injected)")))
  prof = profile.Profiler(tiny.train_config(_corpus(tmp_path), profile_steps="1:1"), str(tmp_path / "run"), 0, 3)
  monkeypatch.setattr(jax.profiler, "start_trace", lambda *a, **k: None)
  prof.before(1, lambda: None, lambda: None)
  prof.after(1, lambda: None)
  out = capsys.readouterr().out
  assert "warning: the profile could not be written to" in out and "disk full (injected)" in out
  assert "written to" not in out.replace("could not be written to", "")
  prof = profile.Profiler(tiny.train_config(_corpus(tmp_path), profile_steps="1:1"), str(tmp_path / "run"), 0, 3)
  monkeypatch.setattr(jax.profiler, "start_trace", refuse)
  prof.before(1, lambda: None, lambda: None)
  prof.after(1, lambda: None)
  prof.close()
  out = capsys.readouterr().out
  assert "warning: no profile:" in out and "the run goes on without it" in out and "written to" not in out
