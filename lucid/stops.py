"""Why a run stops before `run.steps`: a signal (Ctrl-C, SIGTERM), its time limit or target
return; and the errors that stop it with a checkpoint."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import numpy as np

from . import checkpoint as ckpt


class NonFiniteError(RuntimeError):
    """Training produced non-finite losses or gradients too many times in a row."""


class DiskFullError(OSError):
    """The disk under the run directory is full: the run stopped at its last checkpoint."""


def disk_full_error(exc: OSError, run_dir: Path, env_steps: int, hint: str) -> DiskFullError:
    """The error a full disk stops a run with: what is intact, and how to go on (`hint`)."""
    saved = ckpt.list_checkpoints(run_dir)
    then = (f"its newest checkpoint, {saved[-1].name}, and the replay on disk are intact. "
            f"Free some space (old runs, videos/, a lower run.keep_checkpoints or "
            f"train.replay_capacity) and continue with {hint}"
            if saved else "it had no checkpoint yet; free some space and start it again "
            "in a new run directory")
    err = DiskFullError(f"the disk under {run_dir} is full ({exc.strerror} writing "
                        f"{exc.filename or 'a file'}, at {env_steps} env steps); the run "
                        f"stopped and {then}")
    err.errno = exc.errno
    return err


def early_stop(run, started: float, recent: list[float]) -> str | None:
    """Why the run stops early, if it does: the time limit of this session (`started`: a
    resumed run gets its own) or the target return reached by the last 10 episodes. `run`:
    the config's run section."""
    if run.time_limit and time.time() - started >= run.time_limit * 60:
        return f"run.time_limit={run.time_limit:g} minutes reached"
    if (run.target_return is not None and len(recent) >= 10
            and float(np.mean(recent)) >= run.target_return):
        return (f"run.target_return={run.target_return:g} reached (mean of the last 10 "
                f"episodes {float(np.mean(recent)):.4g})")
    return None


class SignalStop:
    """While entered, SIGINT and SIGTERM call `stop(signum)`, so that the run ends at its
    step's end with a checkpoint; a second Ctrl-C stops at once (KeyboardInterrupt, still
    saved). Python lets only the main thread handle signals (learn() on another thread: a
    GUI, Ray Tune), so elsewhere they are left alone."""

    def __init__(self, stop):
        self.stop = stop
        self.signalled: int | None = None
        self.old: dict = {}

    def __enter__(self) -> "SignalStop":
        if threading.current_thread() is threading.main_thread():
            self.old = {sig: signal.signal(sig, self.handle)
                        for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)

    def handle(self, signum, frame) -> None:
        if self.signalled is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signalled is not None:  # SIGTERM again: a launcher (make, timeout, a
            return  # scheduler) that signals a whole process group reaches a run twice
        self.signalled = signum
        self.stop(signum)
