"""Messages about a run directory tell a run that is training now (its lock is held) from one
that stopped and from a directory that is no run; none advises deleting a live run."""

import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from lucid.checkpoint import training_pid
from lucid.cli import app
from procs import kill_group, popen_grouped

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _wait_for(cond, what: str, proc, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.communicate()}")
        assert time.monotonic() < end, f"no {what} within {timeout:.0f} s"
        time.sleep(0.2)


def test_a_live_run_before_its_first_checkpoint_is_told_from_a_stopped_one(tmp_path):
    run = tmp_path / "live"
    # A real run that stays in its random prefill (a million steps), so it has no checkpoint.
    proc = popen_grouped(
        [sys.executable, "-m", "lucid", "train", "CartPole-v1", "--preset", "cpu-control",
         "--size", "nano", "--steps", "2000000", "--run-dir", str(run), "train.prefill=1000000",
         "run.progress=false", "run.threads=1", "run.videos=false", "run.log_every=0.2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: training_pid(run) is not None and (run / "metrics.jsonl").is_file(),
                  "lock and metrics.jsonl", proc)
        assert training_pid(run) == str(proc.pid)
        assert not list((run / "checkpoints").glob("*.pt"))
        said = {}
        said["train"] = runner.invoke(app, ["train", "--run-dir", str(run), "--steps", "10"])
        said["resume"] = runner.invoke(app, ["train", "--resume", str(run)])
        said["eval"] = runner.invoke(app, ["eval", str(run)])
        said["dream"] = runner.invoke(app, ["dream", str(run)])
        for cmd, r in said.items():
            assert r.exit_code == 2, (cmd, r.output)
            assert f"pid {proc.pid}" in r.output, (cmd, r.output)
            assert "delete" not in r.output and "stopped" not in r.output, (cmd, r.output)
        assert "another lucid process (pid" in said["train"].output
        assert "is a run in progress" in said["eval"].output
        assert "has not written its first checkpoint yet" in said["dream"].output
    finally:
        kill_group(proc)
        proc.communicate()
    # the same directory, its process gone: a run that stopped before its first checkpoint
    assert training_pid(run) is None
    r = runner.invoke(app, ["eval", str(run)])
    assert r.exit_code == 2 and "stopped before its first one" in r.output, r.output
    r = runner.invoke(app, ["train", "--run-dir", str(run), "--steps", "10"])
    assert r.exit_code == 2 and "stopped before its first checkpoint" in r.output, r.output


def test_a_directory_that_is_no_run_is_called_so(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text('{"loss": 1}\n')
    for args in (["eval", str(other)], ["dream", str(other)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and "is not a lucid run: it has no config.yaml" in r.output, (args, r.output)
        assert "stopped" not in r.output and "resume" not in r.output, r.output
    r = runner.invoke(app, ["train", "--run-dir", str(other), "--steps", "10"])
    assert r.exit_code == 2 and "no lucid run" in r.output and "delete" not in r.output, r.output
    assert [p.name for p in other.iterdir()] == ["metrics.jsonl"]
