"""Every command that writes tells a path the file system refuses in one line naming that
path and the fix (no traceback, no ffmpeg pipe), and loses nothing of the run. Paths are made
unwritable the way any user can (a file where a directory has to be, a directory where a
file has to be), and by a read-only mount where this machine allows one."""

import subprocess
import sys
from pathlib import Path

import pytest

from lucid.config import make_config
from lucid.train import Trainer
from procs import run_grouped

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished run: checkpoint, replay, logs."""
    d = tmp_path_factory.mktemp("unwritable") / "run"
    cfg = make_config("default", env={"id": "CartPole-v1"}, model={"size": "nano"},
                      train={"batch_size": 2, "batch_length": 8, "horizon": 3, "prefill": 20,
                             "train_ratio": 16},
                      run={"steps": 80, "progress": False, "run_dir": str(d), "log_every": 0.0,
                           "videos": False})
    with Trainer(cfg) as tr:
        tr.run()
    return d


def _files(d: Path) -> dict:
    return {p: p.read_bytes() for p in d.rglob("*") if p.is_file() and p.name != ".lock"}


def _lucid(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    return run_grouped([sys.executable, "-m", "lucid", *map(str, args)], timeout=300, cwd=cwd)


def _refused(r: subprocess.CompletedProcess, path, why: str,
             fix: str = "; give a path that can be written") -> None:
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert err and err[-1].startswith(f"error: cannot write {path}: {why}{fix}"), r.stderr
    assert "Traceback" not in r.stderr and "Broken pipe" not in r.stderr, r.stderr


def test_outputs_under_a_file_are_refused_in_one_line(run, tmp_path):
    before = _files(run)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    in_the_way = "a file is in the way of a directory"
    _refused(_lucid("dream", run, "--out", blocker / "dream.mp4"), blocker, in_the_way)
    _refused(_lucid("report", run, "--out", blocker / "r.html"), blocker, in_the_way)
    _refused(_lucid("plot", run, "--out", blocker / "c.png"), blocker, in_the_way)
    assert _files(run) == before and blocker.read_text() == "not a directory"


def test_a_run_directory_whose_parts_cannot_be_written_is_refused_in_one_line(run, tmp_path):
    """--resume, eval --video, dream and report write into the run directory."""
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(run), str(copy)], check=True)
    (copy / "videos").write_text("a file where videos/ goes")
    (copy / ".lock").unlink(missing_ok=True)
    (copy / ".lock").mkdir()  # a directory where the lock file goes
    (copy / "report.html").unlink(missing_ok=True)
    (copy / "report.html").mkdir()
    before = _files(copy)
    _refused(_lucid("train", "--resume", copy, "--steps", 120), copy / ".lock",
             "a directory is in the way of a file")
    _refused(_lucid("eval", copy, "--episodes", 1, "--video"), copy / "videos",
             "a file is in the way of a directory")
    _refused(_lucid("dream", copy), copy / "videos", "a file is in the way of a directory")
    _refused(_lucid("report", copy), copy / "report.html", "it is not a regular file",
             fix=" (a directory, device, pipe or socket)")
    assert _files(copy) == before


def test_a_read_only_run_directory_is_refused_in_one_line(run, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(run), str(ro)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("this machine allows no bind mount (not root, or no CAP_SYS_ADMIN)")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        before = _files(run)
        read_only = "the file system is read-only"
        _refused(_lucid("train", "--resume", ro, "--steps", 120), ro / ".lock", read_only)
        r = _lucid("dream", ro)
        assert r.returncode == 2 and f"error: cannot write {ro / 'videos'}" in r.stderr, r.stderr
        _refused(_lucid("report", ro), ro / "report.html", read_only)
        _refused(_lucid("plot", ro, cwd=ro), "curves.png", read_only)
        r = _lucid("eval", ro, "--episodes", 1)  # reading only: works
        assert r.returncode == 0 and '"episodes": 1' in r.stdout, r.stderr
        assert _files(run) == before
    finally:
        subprocess.run(["umount", str(ro)])
