"""A run's directory: a new run claims one that holds no run's data (never another run's
files overwritten), one learning process holds it locked, and a start that fails takes the
directory it made away again."""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import time
from pathlib import Path

import yaml

from . import checkpoint as ckpt
from .config import Config, ConfigError
from .envs import env_label, instances
from .resume import resume_hint

RUN_FILES = ("checkpoints", "replay", "metrics.jsonl", "episodes.jsonl")  # a run's data


def default_run_dir(cfg: Config) -> Path:
    name = env_label(cfg.env.id).replace(":", "-").replace("/", "-")
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-s{cfg.run.seed}"


def has_data(path: Path) -> bool:
    """A non-empty file or a directory with something in it."""
    return path.stat().st_size > 0 if path.is_file() else path.is_dir() and any(path.iterdir())


def is_lucid_config(path: Path) -> bool:
    """Whether `path` may be a lucid run's config.yaml (empty, or a mapping of its sections,
    e.g. one that a failed start left), not some other program's file of that name."""
    try:
        tree = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    sections = {f.name for f in dataclasses.fields(Config)}
    return tree is None or isinstance(tree, dict) and set(map(str, tree)) <= sections


def _refuse_held(given: Path, held: list[str]) -> None:
    pid = ckpt.training_pid(given)
    if pid is not None and pid != str(os.getpid()):
        raise ConfigError(f"{given} is in use: another lucid process (pid {pid}) is training "
                          f"in it; give another run directory. Nothing was written")
    if not (given / "config.yaml").is_file():
        raise ConfigError(f"{given} holds {', '.join(held)} but no config.yaml, so it is no "
                          f"lucid run that could be resumed, and a new run there would mix "
                          f"its logs with these files; give another run directory. Nothing "
                          f"was written")
    if not ckpt.list_checkpoints(given) and pid is None:  # --resume would find nothing
        raise ConfigError(
            f"{given} holds the files ({', '.join(held)}) of a run that stopped before its "
            f"first checkpoint, so it cannot be resumed; give another run directory, or "
            f"delete {given} to use its name again. Nothing was written")
    try:  # a run on an env instance continues from Python only
        held_env = str(yaml.safe_load((given / "config.yaml").read_text())["env"]["id"])
    except Exception:
        held_env = ""
    how = resume_hint(held_env, given)
    if not instances.is_instance(held_env):
        how += " (or Dreamer.load)"
    if pid is not None:  # a Trainer or Dreamer of this process holds it
        raise ConfigError(f"{given} is in use by a Trainer or Dreamer of this process: close() "
                          f"it, then continue it with {how}, or give another run directory. "
                          f"Nothing was written")
    raise ConfigError(f"{given} already holds a run ({', '.join(held)}); continue it with "
                      f"{how}, or give another run directory. Nothing was written")


def _claim_given(given: Path) -> Path:
    if given.exists() and not given.is_dir():
        raise ConfigError(f"the run directory {given} is a file; give a directory")
    held = [n for n in RUN_FILES if has_data(given / n)]
    if held:
        _refuse_held(given, held)
    if (given / "config.yaml").is_file() and not is_lucid_config(given / "config.yaml"):
        raise ConfigError(
            f"{given} has a config.yaml that is not a lucid run's, which a new run there "
            f"would overwrite; give another run directory (e.g. {given / 'run'}). Nothing "
            f"was written")
    try:
        given.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError, PermissionError) as exc:
        raise ConfigError(f"cannot make the run directory {given}: {exc.strerror} "
                          f"({exc.filename}); give another --run-dir") from None
    return given


def claim_run_dir(given: Path | None, cfg: Config) -> Path:
    """The directory of a new run: `given` if it holds no run's data yet (never another run's
    files overwritten; a config.yaml alone, left by a start that failed, is replaced), else a
    fresh runs/ENV-TIME-sSEED, with -2, -3, ... when two runs start in the same second."""
    if given is not None:
        return _claim_given(given)
    base = default_run_dir(cfg)
    base.parent.mkdir(parents=True, exist_ok=True)
    for i in itertools.count(1):
        path = base if i == 1 else base.with_name(f"{base.name}-{i}")
        try:
            path.mkdir()  # atomic: two processes never get the same directory
            return path
        except FileExistsError:
            continue


class RunDirClaim:
    """What a learning process holds of its run directory: the lock (one training process
    per directory; a second is refused with the first one's pid) and, for a new run, whether
    this start made the directory. Only the main data-parallel rank locks and claims; the
    others are told the directory."""

    def __init__(self, ranks):
        self.ranks = ranks
        self.lock: ckpt.RunLock | None = None
        self.made: Path | None = None  # the new run's directory, where this start made it

    def hold(self, run_dir: Path) -> None:
        if self.ranks.is_main and self.lock is None and run_dir.is_dir():
            lock = ckpt.RunLock(run_dir)
            lock.acquire()
            self.lock = lock

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def new(self, given: Path | None, cfg: Config) -> Path:
        """Claim a new run's directory and hold it; a refusal reaches every rank."""
        claim: str | ConfigError | None = None
        if self.ranks.is_main:
            existed = given is not None and given.exists()
            try:
                claim = str(claim_run_dir(given, cfg))
            except ConfigError as exc:
                claim = exc
            else:
                self.made = None if existed else Path(claim)
        claim = self.ranks.broadcast_object(claim)
        if isinstance(claim, ConfigError):
            raise claim
        self.hold(Path(claim))
        return Path(claim)

    def discard_failed_start(self) -> None:
        """A new run that fails to start (after its directory was made: an env runner that
        cannot be built, say) takes the directory away again when it holds nothing but what
        the start wrote (config.yaml, and a memory-mapped replay's empty ring files), so that
        failed starts do not pile up under runs/. Only while this process holds the
        directory's lock: a start that lost the lock to another process leaves it alone."""
        d = self.made
        if d is None or self.lock is None or not d.is_dir():
            return
        files = [p for p in d.rglob("*") if not p.is_dir()]
        # ring files: replay/ring/, replay/runner-<i>/ring/ (Ray), replay-rank<r>/ring/
        if all((p.parent == d and p.name in ("config.yaml", ckpt.RunLock.NAME))
               or (p.parent.name == "ring" and p.suffix == ".npy") for p in files):
            shutil.rmtree(d, ignore_errors=True)
