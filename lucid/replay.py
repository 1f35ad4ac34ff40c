"""Uniform replay of length-T windows over the step streams of parallel environments.

Each environment's steps are kept in order in its own ring buffer (FIFO eviction), in their
own dtype (uint8 images stay uint8, stored once). `sample(B, T)` draws windows uniformly over
every stored contiguous window of every env; windows cross episode boundaries, where the next
episode starts with `is_first`. Sampling costs O(B·T), independent of capacity.

Persistence is incremental: with a `directory`, steps are appended to it as chunk files
(`chunk-<first>-<end>.npz`, numpy arrays written atomically, never rewritten) every
`chunk_length` steps and on `flush()`. `restore()` rebuilds the ring buffer from the newest
contiguous run of chunks, so a checkpoint never rewrites the whole replay and a killed run
keeps every chunk that reached the disk. Chunks whose steps were all evicted are deleted.
With `memmap=True` the ring buffer itself lives in memory-mapped files in `directory/ring/`,
so its capacity can exceed RAM.

`Prefetcher` samples the next batch on a background thread while the learner updates
(`train.prefetch`). Writes (`add`, `add_chunk`, `write`, `restore`) and `sample` hold the
replay's lock, so a sample never sees a half-written step.

A sample can say where its steps live (`locate`): each env stream numbers its steps from 0
in the order they were added, and step s sits in slot s % per_env. `write` puts new values
into fields of steps sampled earlier (the Nature recipe's latents, refreshed by each update),
skipping those evicted since. Such writes reach the ring, not the chunk files already on
disk: a restored replay holds each step as it was when its chunk was written.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from .checkpoint import atomic_write
from .warn import warn

FLAGS = ("is_first", "is_last", "is_terminal")
_CHUNK = re.compile(r"chunk-(\d+)-(\d+)\.npz$")


class _Locked:
    """`self.lock` (an RLock) survives pickling and copying: locks do not pickle, so a copy
    gets a fresh one."""

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.lock = threading.RLock()


def _step_bytes(fields: dict) -> int:
    return sum(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize
               for s, d in fields.values())


class Replay(_Locked):
    def __init__(self, capacity: int, num_envs: int, fields: dict[str, tuple[tuple, np.dtype]],
                 seed: int = 0, directory: str | Path | None = None, chunk_length: int = 1024,
                 memmap: bool = False, max_bytes: int = 0, optional: tuple[str, ...] = ()):
        """`fields` maps names (observation keys as `obs/<key>`, `action`, `reward`, flags)
        to (shape, dtype) of one step; `capacity` counts steps over all envs, and `max_bytes`
        (if set) lowers it to what fits in that many bytes. The `optional` fields are stored
        as zeros where an added step lacks them (steps of random actions have no latents)."""
        self.num_envs = num_envs
        self.optional = frozenset(optional)
        self.fields = {k: (tuple(s), np.dtype(d)) for k, (s, d) in fields.items()}
        self.per_env = self.steps_per_env(self.fields, capacity, num_envs, max_bytes)
        self.directory = Path(directory) if directory is not None else None
        self.chunk_length = chunk_length
        if memmap and self.directory is None:
            raise ValueError("a memory-mapped replay needs a directory for its files")
        try:
            self.data = {k: self._array(k, (num_envs, self.per_env, *s), d, memmap)
                         for k, (s, d) in self.fields.items()}
        except MemoryError:
            from .config import ConfigError
            raise ConfigError(
                f"a replay of {self.per_env * num_envs:,} steps of {self.step_bytes:,} bytes "
                f"needs {self.per_env * num_envs * self.step_bytes / 2**30:.1f} GB, more than "
                f"this machine can allocate: lower train.replay_capacity, cap it with "
                f"train.replay_max_gb, or keep it on disk with train.replay_memmap=true") from None
        self.pos = 0  # next write slot (same for all envs: they step together)
        self.count = 0  # steps written per env, ever
        self.first = 0  # the oldest step (per env) ever held: after a restore, its first step
        self.persisted = 0  # steps per env already written to chunk files
        self.rng = np.random.default_rng(seed)
        # Held by every write and by `sample` (its indices, the gather and the RNG), so a
        # Prefetcher thread sampling while the trainer adds steps sees each step whole.
        self.lock = threading.RLock()

    @property
    def step_bytes(self) -> int:
        """Bytes of one step of one env."""
        return _step_bytes(self.fields)

    @staticmethod
    def steps_per_env(fields: dict, capacity: int, num_envs: int, max_bytes: int = 0) -> int:
        """The steps each env stream keeps: `capacity` over the envs, lowered to what fits
        in `max_bytes` (if set)."""
        if max_bytes:
            capacity = min(capacity, int(max_bytes) // max(1, _step_bytes(fields)))
        return max(1, capacity // num_envs)

    def _array(self, name, shape, dtype, memmap):
        if not memmap:
            return np.zeros(shape, dtype)
        ring = self.directory / "ring"
        ring.mkdir(parents=True, exist_ok=True)
        path = ring / (name.replace("/", "__") + ".npy")
        return np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)

    @staticmethod
    def space_fields(obs_spec, action_dim: int) -> dict[str, tuple[tuple, np.dtype]]:
        """The fields of one step for these observations and actions."""
        fields: dict[str, tuple[tuple, np.dtype]] = {}
        for k, shape in obs_spec.images.items():
            fields[f"obs/{k}"] = (shape, np.uint8)
        for k, size in obs_spec.vectors.items():
            fields[f"obs/{k}"] = ((size,), np.float32)
        fields["action"] = ((action_dim,), np.float32)
        fields["reward"] = ((), np.float32)
        for f in FLAGS:
            fields[f] = ((), np.bool_)
        return fields

    @classmethod
    def for_spaces(cls, obs_spec, action_dim: int, capacity: int, num_envs: int, seed: int = 0,
                   **kwargs):
        return cls(capacity, num_envs, cls.space_fields(obs_spec, action_dim), seed, **kwargs)

    @property
    def stored(self) -> int:
        """Steps held per env: the newest `per_env` at most, none before `first`."""
        return min(self.count - self.first, self.per_env)

    def __len__(self) -> int:
        return self.stored * self.num_envs

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.data.values())

    def add(self, step: dict[str, np.ndarray]) -> None:
        """Append one step of every env: each field shaped (num_envs, ...)."""
        with self.lock:
            for k, arr in self.data.items():
                arr[:, self.pos] = self._given(step, k)
            self.pos = (self.pos + 1) % self.per_env
            self.count += 1
            if self.directory is not None and self.count - self.persisted >= self.chunk_length:
                self.flush()

    def add_chunk(self, steps: dict[str, np.ndarray]) -> None:
        """Append L consecutive steps of every env at once: each field shaped
        (num_envs, L, ...). Equivalent to L calls of `add`."""
        n = next(iter(steps.values())).shape[1]
        keep = min(n, self.per_env)  # a chunk longer than the ring keeps its newest steps
        with self.lock:
            slots = (self.pos + np.arange(n - keep, n)) % self.per_env
            for k, arr in self.data.items():
                given = self._given(steps, k)
                arr[:, slots] = given[:, n - keep:] if np.ndim(given) else given
            self.pos = (self.pos + n) % self.per_env
            self.count += n
            if self.directory is not None and self.count - self.persisted >= self.chunk_length:
                self.flush()

    def _given(self, step: dict, k: str):
        if k in step or k not in self.optional:
            return step[k]
        return 0

    def can_sample(self, length: int) -> bool:
        return self.stored >= length

    def sample_indices(self, batch: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        stored = self.stored
        if stored < length:
            raise ValueError(f"replay holds {stored} steps per env, fewer than the window "
                             f"length {length}")
        env = self.rng.integers(self.num_envs, size=batch)
        start = self.rng.integers(stored - length + 1, size=batch)
        oldest = (self.pos - stored) % self.per_env
        idx = (oldest + start[:, None] + np.arange(length)[None]) % self.per_env
        return env[:, None], idx

    def rng_state(self) -> dict:
        """The sampling RNG's state (for checkpoints)."""
        return self.rng.bit_generator.state

    def set_rng_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state

    def reseed(self, seed) -> None:
        self.rng = np.random.default_rng(seed)

    def sample(self, batch: int, length: int, locate: bool = False) -> dict[str, np.ndarray]:
        """B windows of T steps (copies: later writes do not change them). With `locate`,
        also `_env` (B,) and `_step` (B, T): where each window's steps live (`write`)."""
        with self.lock:
            env, idx = self.sample_indices(batch, length)
            out = {k: arr[env, idx] for k, arr in self.data.items()}
            if locate:
                # slot = step % per_env, and the newest step (count - 1) is in slot pos - 1
                below = (idx - self.pos) % self.per_env  # slots below pos, oldest first
                out["_env"] = env[:, 0].astype(np.int64)
                out["_step"] = self.count - self.per_env + below.astype(np.int64)
            return out

    def write(self, env: np.ndarray, step: np.ndarray, values: dict[str, np.ndarray]) -> int:
        """Overwrite fields of sampled steps: `values[k]` (B, T, ...) at the steps `step`
        (B, T) of the env streams `env` (B,) (`sample(locate=True)`), except steps evicted
        since. Returns how many steps were written."""
        with self.lock:
            env = np.broadcast_to(np.asarray(env)[:, None], step.shape)
            held = step >= max(self.first, self.count - self.per_env)
            e, s = env[held], step[held] % self.per_env
            for k, v in values.items():
                self.data[k][e, s] = np.asarray(v)[held]
            return int(held.sum())

    # ------------------------------------------------------------------ persistence

    def _ordered(self, first: int, end: int) -> dict[str, np.ndarray]:
        """Steps [first, end) (per-env step numbers, all still stored) in order."""
        slots = (self.pos - (self.count - first) + np.arange(end - first)) % self.per_env
        return {k: np.asarray(a[:, slots]) for k, a in self.data.items()}

    def flush(self) -> Path | None:
        """Append the steps added since the last flush to a new chunk file."""
        if self.directory is None or self.count == self.persisted:
            return None
        first = max(self.persisted, self.count - self.per_env)  # older ones were evicted
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"chunk-{first:012d}-{self.count:012d}.npz"
        arrays = self._ordered(first, self.count)
        atomic_write(path, lambda f: np.savez(f, **arrays))
        self.persisted = self.count
        for old, (_, end) in self._chunks():
            if end <= self.count - self.per_env:  # every step in it was evicted
                old.unlink(missing_ok=True)
        return path

    def _chunks(self) -> list[tuple[Path, tuple[int, int]]]:
        if self.directory is None or not self.directory.exists():
            return []
        found = []
        for f in self.directory.iterdir():
            m = _CHUNK.match(f.name)
            if m:
                found.append((f, (int(m.group(1)), int(m.group(2)))))
        return sorted(found, key=lambda x: x[1])

    def restore(self, set_aside: bool = True) -> int:
        """Rebuild the buffer from the newest contiguous run of readable chunk files. An
        unreadable chunk is renamed *.corrupt (with `set_aside`); if it is the newest, the
        stream ends before it, otherwise the run starts after it (older chunks stay on disk
        behind the gap until their steps would have been evicted). Returns the number of
        steps per env restored."""
        with self.lock:
            return self._restore(set_aside)

    def _restore(self, set_aside: bool) -> int:
        """Newest chunk first, each copied into its slots as it is read (step s of an env
        lives in slot s % per_env), so memory holds one chunk at a time, never the replay."""
        if set_aside and self.directory is not None and self.directory.exists():
            for torn in self.directory.glob("chunk-*.npz.tmp"):  # a kill during a flush
                torn.unlink(missing_ok=True)
        self.pos = self.count = self.persisted = self.first = 0
        top = None  # the end of the restored run: new chunks follow it
        for path, (first, stop) in reversed(self._chunks()):
            if top is not None and (stop != self.first or stop <= top - self.per_env):
                break  # a gap, or every step in it would have been evicted
            try:
                with np.load(path, allow_pickle=False) as f:
                    arrays = {k: f[k] for k in f.files}
            except Exception as exc:  # noqa: BLE001 - a torn or corrupt file
                self._unreadable(path, exc, set_aside)
                if top is None:
                    continue  # the newest: the stream ends before it
                break
            self._check(path, arrays)  # written for other spaces: an error, not corruption
            if top is None:
                top = self.count = self.persisted = self.first = stop
                self.pos = stop % self.per_env
            lo = max(first, top - self.per_env)
            for k, a in self.data.items():
                a[:, np.arange(lo, stop) % self.per_env] = arrays[k][:, lo - first:]
            self.first = lo
        return self.stored

    def _unreadable(self, path: Path, exc: Exception, set_aside: bool) -> None:
        if set_aside:
            path.replace(path.with_name(path.name + ".corrupt"))
        warn(f"replay chunk {path.name} is unreadable ({exc}); it is left out of the "
             f"restored replay" + (" and renamed to *.corrupt" if set_aside else ""))

    def _check(self, path, arrays: dict) -> dict:
        for k, a in self.data.items():
            if k not in arrays:
                raise ValueError(f"replay file {path} lacks field {k!r}; it was written for "
                                 f"other observation/action spaces (does not fit)")
            src = arrays[k]
            if src.shape[0] != self.num_envs or src.shape[2:] != a.shape[2:]:
                raise ValueError(f"replay file {path} field {k!r} has shape {src.shape}, which "
                                 f"does not fit ({self.num_envs}, *, {a.shape[2:]})")
        return arrays


class ReplayGroup(_Locked):
    """Several `Replay`s sampled as one: the replay of a run whose env runners step on their own
    clocks (lucid.ray_runners). Part i holds runner i's env streams with its own write
    position, so a runner that is slow, dead or restarted never holds the others back.
    `sample(B, T)` draws each window uniformly over all windows of all parts (O(B·T)).
    For the visualizing tools (`count`, `per_env`, `pos`, `data`, `num_envs`) the group looks
    like its fullest part."""

    def __init__(self, parts: list[Replay], seed: int = 0):
        self.parts = parts
        self.rng = np.random.default_rng(seed)
        self.lock = threading.RLock()  # taken before a part's lock, never after

    def add_chunk(self, part: int, steps: dict[str, np.ndarray]) -> None:
        with self.lock:
            self.parts[part].add_chunk(steps)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def _windows(self, length: int) -> np.ndarray:
        return np.array([p.num_envs * max(0, p.stored - length + 1)
                         for p in self.parts], np.float64)

    def can_sample(self, length: int) -> bool:
        return bool(self._windows(length).sum() > 0)

    def sample(self, batch: int, length: int, locate: bool = False) -> dict[str, np.ndarray]:
        """As `Replay.sample`; with `locate`, `_env` numbers the env streams of all parts
        in order (part 0's first)."""
        with self.lock:
            w = self._windows(length)
            if w.sum() <= 0:
                raise ValueError(f"no env runner's replay holds {length} steps per env yet")
            counts = self.rng.multinomial(batch, w / w.sum())
            samples = []
            for p, c, first in zip(self.parts, counts, self._offsets()):
                if c > 0:
                    samples.append(p.sample(int(c), length, locate))
                    if locate:
                        samples[-1]["_env"] = samples[-1]["_env"] + first
        return {k: np.concatenate([s[k] for s in samples]) for k in samples[0]}

    def _offsets(self) -> list[int]:
        return np.cumsum([0] + [p.num_envs for p in self.parts[:-1]]).tolist()

    def write(self, env: np.ndarray, step: np.ndarray, values: dict[str, np.ndarray]) -> int:
        """`Replay.write` to each part the rows of its env streams (`sample(locate=True)`)."""
        env, wrote = np.asarray(env), 0
        with self.lock:
            for p, first in zip(self.parts, self._offsets()):
                rows = (env >= first) & (env < first + p.num_envs)
                if rows.any():
                    wrote += p.write(env[rows] - first, step[rows],
                                     {k: np.asarray(v)[rows] for k, v in values.items()})
        return wrote

    def flush(self) -> None:
        for p in self.parts:
            p.flush()

    def rng_state(self) -> dict:
        """The group's RNG (which part) and each part's (which window)."""
        return {"group": self.rng.bit_generator.state,
                "parts": [p.rng_state() for p in self.parts]}

    def set_rng_state(self, state: dict) -> None:
        if "group" not in state:  # a checkpoint from before the parts' states were saved
            self.rng.bit_generator.state = state
            return
        self.rng.bit_generator.state = state["group"]
        for p, s in zip(self.parts, state["parts"]):
            p.set_rng_state(s)

    def reseed(self, seed) -> None:
        seq = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
        self.rng = np.random.default_rng(seq)
        for i, p in enumerate(self.parts):  # children by key, not spawn(), which counts calls
            p.reseed(np.random.SeedSequence(seq.entropy, spawn_key=(*seq.spawn_key, i)))

    def restore(self, set_aside: bool = True) -> int:
        with self.lock:
            return sum(p.restore(set_aside) for p in self.parts)

    @property
    def fullest(self) -> Replay:
        return max(self.parts, key=lambda p: p.stored)

    count = property(lambda self: self.fullest.count)
    first = property(lambda self: self.fullest.first)
    stored = property(lambda self: self.fullest.stored)
    per_env = property(lambda self: self.fullest.per_env)
    pos = property(lambda self: self.fullest.pos)
    data = property(lambda self: self.fullest.data)
    num_envs = property(lambda self: self.fullest.num_envs)


def to_batch(sample: dict[str, np.ndarray], device: torch.device, pin: bool = False) -> dict:
    """Numpy window sample -> the agent's batch dict of tensors (B, T, ...). With `pin` and a
    CUDA device, each array goes through pinned host memory and is copied with
    `non_blocking=True` (asynchronous on the current CUDA stream)."""
    device = torch.device(device)
    if pin and device.type == "cuda":
        move = lambda v: torch.from_numpy(v).pin_memory().to(device, non_blocking=True)  # noqa: E731
    else:
        move = lambda v: torch.as_tensor(v, device=device)  # noqa: E731
    obs = {k[4:]: move(v) for k, v in sample.items() if k.startswith("obs/")}
    out = {k: v if k.startswith("_") else move(v)  # where the steps live: stays numpy
           for k, v in sample.items() if not k.startswith("obs/")}
    out["obs"] = obs
    return out


def _tensors(batch: dict):
    for v in batch.values():
        if isinstance(v, dict):
            yield from _tensors(v)
        elif isinstance(v, torch.Tensor):
            yield v


class Prefetcher:
    """The learner's batches: `get()` returns the next (B, T) batch from `replay`, sampled and
    converted (`to_batch`) on one background thread while the previous update ran, and starts
    sampling the one after. Exactly one batch is in flight, so every `get()` consumes one
    `replay.sample` and the replay's RNG draws the same sequence as without prefetching.

    Consistency: the trainer's main thread writes the replay between updates, possibly while
    the thread samples. `Replay.add`/`add_chunk` and `Replay.sample` hold the replay's lock,
    so a sample sees every step either whole or not at all, and the arrays it returns are
    copies (fancy indexing). A lock rather than "sample only between adds" because the next
    batch is wanted *during* the update that precedes the next collect step, and the lock
    costs the writer at most one sampling time when they collide. The price of prefetching is
    staleness: a batch may lack the steps added since it was sampled (at most one collect
    step, or one Ray chunk).

    On CUDA the copy goes through pinned memory, non-blocking, on a side stream; `get()` makes
    the current stream wait for it (no host sync). `background=False` samples synchronously in
    `get()` (the plain path), so the trainer times both the same way: `wait_ms()` is the mean
    time `get()` blocked the learner since the last call."""

    def __init__(self, replay, batch_size: int, length: int, device: torch.device | str,
                 background: bool = True, locate: bool = False):
        self.replay, self.batch_size, self.length = replay, batch_size, length
        self.locate = locate  # batches say where their steps live (Replay.sample)
        self.device = torch.device(device)
        self.background = background
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if (self.cuda and background) else None
        self._pool = (ThreadPoolExecutor(1, thread_name_prefix="lucid-prefetch")
                      if background else None)
        self._next: Future | None = None
        self._wait_s, self._gets = 0.0, 0
        self._drawn_from = None  # the replay's RNG state before the batch in flight was drawn

    def _load(self):
        with self.replay.lock:
            self._drawn_from = self.replay.rng_state()
            sample = self.replay.sample(self.batch_size, self.length, self.locate)
        if self.stream is None:
            return to_batch(sample, self.device), None
        with torch.cuda.stream(self.stream):
            batch = to_batch(sample, self.device, pin=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        return batch, event

    def get(self) -> dict:
        t0 = time.perf_counter()
        if self._pool is None:
            batch = to_batch(self.replay.sample(self.batch_size, self.length, self.locate),
                             self.device)
        else:
            if self._next is None:  # first call (or after drain): nothing in flight yet
                self._next = self._pool.submit(self._load)
            future, self._next = self._next, None
            batch, event = future.result()  # re-raises the thread's exception here
            self._drawn_from = None  # that batch is the learner's now
            if event is not None:  # the learner's stream waits for the copy, the host doesn't
                current = torch.cuda.current_stream(self.device)
                current.wait_event(event)
                for t in _tensors(batch):  # allocated on the side stream, used on this one
                    t.record_stream(current)
            self._next = self._pool.submit(self._load)
        self._wait_s += time.perf_counter() - t0
        self._gets += 1
        return batch

    def rng_state(self) -> dict:
        """The replay's RNG state as if no batch were in flight: a run resumed from a
        checkpoint draws the batch that was in flight at the save as its first."""
        with self.replay.lock:  # the thread draws under it: before or after, never during
            return self._drawn_from if self._drawn_from is not None else self.replay.rng_state()

    def wait_ms(self) -> float | None:
        """Mean milliseconds `get()` kept the learner waiting since the last call (None if no
        batch was taken)."""
        if not self._gets:
            return None
        out = 1e3 * self._wait_s / self._gets
        self._wait_s, self._gets = 0.0, 0
        return out

    def close(self) -> None:
        """Wait for the batch in flight (discarded) and stop the thread."""
        if self._pool is not None:
            if self._next is not None:
                self._next.cancel()
                try:
                    self._next.result()
                except Exception:  # noqa: BLE001 - a discarded batch's error does not matter
                    pass
                self._next = None
            self._pool.shutdown(wait=True)
            self._pool = None
