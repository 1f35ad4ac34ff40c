"""Checkpoints: atomic writes, the last K kept, safe loading with fallback.

A checkpoint is `checkpoints/ckpt-<updates>.pt`, loaded with `torch.load(weights_only=True)`
so that a file can never run code; the replay is persisted beside it as append-only chunk files in
`replay/` (numpy arrays, loaded without pickle; see lucid/replay.py). torch is imported in
the functions that use it: `lucid report` writes its page atomically without loading torch.
"""

from __future__ import annotations

import errno
import os
import pickle
import random
import signal
from pathlib import Path
from typing import BinaryIO, Callable

import numpy as np

from .seeds import not_one_run
from .warn import warn

FORMAT_VERSION = 1


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """`write(f)` into a temporary file, flush, fsync, then rename: readers see the old file
    or the complete new one, never a partial one. A write that fails (a full disk) removes
    the temporary file, so that it holds no space, and re-raises."""
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: the directory {path.parent} does not "
                                f"exist")
    if path.exists() and not path.is_file():  # the rename would replace it (e.g. /dev/null)
        raise ValueError(f"cannot write {path}: it is not a regular file (a directory, device, "
                         f"pipe or socket), which writing a file there would replace; give "
                         f"the path of a file")
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # torch.save and np.savez
            exc.filename = str(path)  # leave it out: name the file for the message
        raise
    _fsync_dir(path.parent)


def atomic_torch_save(obj, path: Path) -> None:
    import torch

    def write(f):
        torch.save(obj, f)
        if os.environ.get("LUCID_TEST_KILL_IN_CHECKPOINT"):  # fault injection for tests
            f.flush()
            f.truncate(f.tell() // 2)
            os.kill(os.getpid(), signal.SIGKILL)
    atomic_write(path, write)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` is a write refused for lack of space (or of quota)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


class RunLock:
    """An exclusive lock on a run directory while a process trains in it (`RUN/.lock`, a
    POSIX advisory lock that the kernel drops when the process dies, even by SIGKILL)."""

    NAME = ".lock"

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / self.NAME
        self.f = None

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            return
        f = open(self.path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            pid = f.read().strip() or "?"
            f.close()
            from .config import ConfigError
            if pid == str(os.getpid()):
                raise ConfigError(
                    f"{self.path.parent} is in use by another Trainer or Dreamer of this "
                    f"process (which holds its run directory while it lives); close() it, "
                    f"or give another run directory") from None
            raise ConfigError(f"{self.path.parent} is in use: another lucid process (pid {pid}) "
                              f"is training in it; wait for it to finish or stop it") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self.f = f

    def release(self) -> None:
        if self.f is not None:
            self.f.close()  # closing drops the lock
            self.f = None


def training_pid(run_dir: Path) -> str | None:
    """The pid of the process training in `run_dir` now (it holds the run's lock; "?" where
    it wrote none), else None: a stopped run, or no run."""
    try:
        import fcntl
        f = open(Path(run_dir) / RunLock.NAME)
    except (ImportError, OSError):
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return f.read().strip() or "?"
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def no_checkpoint(run_dir: Path) -> FileNotFoundError:
    """What to say of a directory without checkpoints: a run still training towards its first
    (it comes after the first updates), one that stopped before it, or no run at all."""
    run_dir = Path(run_dir)
    if (pid := training_pid(run_dir)) is not None:
        return FileNotFoundError(
            f"{run_dir} is a run in progress (pid {pid}) that has not written its first "
            f"checkpoint yet (it comes after the first updates, once train.prefill random "
            f"steps are collected); try again when checkpoints/ holds one")
    if (several := not_one_run(run_dir)) is not None:
        return FileNotFoundError(several)
    if not (run_dir / "config.yaml").is_file():
        return FileNotFoundError(
            f"{run_dir} is not a lucid run: it has no config.yaml and no checkpoints/ (give "
            f"the directory that `lucid train` printed as its run directory)")
    return FileNotFoundError(
        f"no checkpoints in {run_dir / 'checkpoints'}: the run stopped before its first one "
        f"(written after the first updates, then every run.checkpoint_minutes, "
        f"run.checkpoint_every env steps and at the end), so there is nothing to resume, "
        f"evaluate or dream with; start a new run in another directory")


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def rng_state() -> dict:
    """Python's, numpy's and torch's random states; and every GPU's, where CUDA is in use."""
    import torch
    state = {
        "python": _encode_py_state(random.getstate()),
        "numpy": _encode_np_state(np.random.get_state()),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """The states of `rng_state`; the GPUs' where this machine has as many (a GPU run resumed
    on a CPU draws its samples from the CPU's generator)."""
    import torch
    random.setstate(_decode_py_state(state["python"]))
    np.random.set_state(_decode_np_state(state["numpy"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() >= len(cuda):
        torch.cuda.set_rng_state_all(cuda)


def _encode_py_state(s):
    return [s[0], list(s[1]), s[2]]


def _decode_py_state(s):
    return (s[0], tuple(s[1]), s[2])


def _encode_np_state(s):
    return [s[0], s[1].tolist(), int(s[2]), int(s[3]), float(s[4])]


def _decode_np_state(s):
    return (s[0], np.asarray(s[1], dtype=np.uint32), s[2], s[3], s[4])


def list_checkpoints(run_dir: Path) -> list[Path]:
    d = Path(run_dir) / "checkpoints"
    if not d.exists():
        return []
    return sorted(d.glob("ckpt-*.pt"), key=lambda p: int(p.stem.split("-")[1]))


def save_checkpoint(run_dir: Path, payload: dict, keep: int = 3) -> Path:
    d = Path(run_dir) / "checkpoints"
    d.mkdir(parents=True, exist_ok=True)
    payload = {"format_version": FORMAT_VERSION, **payload}
    path = d / f"ckpt-{payload['counters']['updates']:09d}.pt"
    atomic_torch_save(payload, path)
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    for stale in d.glob("*.tmp"):  # left by a run killed while writing
        stale.unlink(missing_ok=True)
    return path


def load_checkpoint(path: Path, map_location="cpu") -> dict:
    import torch
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, not a checkpoint file; "
                                f"its checkpoints are in {path / 'checkpoints'}")
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint file {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        what = [ln.strip() for ln in str(exc).splitlines() if "unsupported global" in ln.lower()]
        if what:  # a real pickle of classes: a checkpoint of another program, maybe hostile
            raise ValueError(f"refused to load {path}: it contains objects other than tensors "
                             f"and plain data (loading it could run code): "
                             f"{what[0].split(' was not')[0].split(' whose')[0]}") from None
        raise ValueError(_unreadable(path, exc)) from None  # e.g. a text file
    except Exception as exc:  # noqa: BLE001 - torch's zip reader on a cut-off or foreign file
        raise ValueError(_unreadable(path, exc)) from None
    if not isinstance(payload, dict) or payload.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a lucid checkpoint of format {FORMAT_VERSION}")
    return payload


def _is_text(head: bytes) -> bool:
    """Whether a file's first bytes are text (UTF-8, a README with a "×" in it too; a
    character cut at the end counts), not a checkpoint's zip or pickle bytes."""
    if not head or b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 3 and exc.reason == "unexpected end of data"
    return all(b >= 32 or b in b"\t\r\n\f" for b in head)


def _unreadable(path: Path, exc: Exception) -> str:
    """Why `path` is no checkpoint: a text file (given by mistake) is named as one; anything
    else that torch cannot read is cut off or damaged."""
    if _is_text(path.read_bytes()[:512]):
        return (f"{path} is a text file, not a lucid checkpoint: give a file that Dreamer.save "
                f"wrote, or a run directory (its checkpoints/*.pt)")
    first = str(exc).split(". ")[0].strip() or type(exc).__name__
    return f"{path} is not a readable checkpoint (truncated or corrupt: {first[:160]})"


def load_latest(run_dir: Path, map_location="cpu", set_aside: bool = False
                ) -> tuple[dict, Path]:
    """Newest loadable checkpoint; a truncated or corrupt newer one is skipped with a warning
    and, with `set_aside` (a run that goes on), renamed `*.corrupt`, so that pruning by
    number never keeps it in place of a good one."""
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise no_checkpoint(run_dir)
    errors = []
    for path in reversed(ckpts):
        try:
            return load_checkpoint(path, map_location), path
        except Exception as exc:  # corrupt or truncated: fall back to the previous one
            if "refused to load" in str(exc):
                raise
            errors.append(f"{path.name}: {exc}")
            aside = ""
            if set_aside:
                path.rename(path.with_name(path.name + ".corrupt"))
                aside = f", set aside as {path.name}.corrupt"
            warn(f"checkpoint {path} is unreadable ({exc}){aside}; trying the "
                 f"previous one")
    raise ValueError("no readable checkpoint in " + str(run_dir) + ": " + "; ".join(errors))
