"""Uniform replay of length-T windows over the step streams of parallel environments.

Each environment's steps are kept in order in its own ring buffer (FIFO eviction), in their
own dtype (uint8 images stay uint8, stored once). `sample(B, T)` draws windows uniformly over
every stored contiguous window of every env; windows cross episode boundaries, where the next
episode starts with `is_first`. Sampling costs O(B·T), independent of capacity.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

FLAGS = ("is_first", "is_last", "is_terminal")


class Replay:
    def __init__(self, capacity: int, num_envs: int, fields: dict[str, tuple[tuple, np.dtype]],
                 seed: int = 0):
        """`fields` maps names (observation keys as `obs/<key>`, `action`, `reward`, flags)
        to (shape, dtype) of one step; `capacity` counts steps over all envs."""
        self.num_envs = num_envs
        self.per_env = max(1, capacity // num_envs)
        self.fields = {k: (tuple(s), np.dtype(d)) for k, (s, d) in fields.items()}
        self.data = {k: np.zeros((num_envs, self.per_env, *s), d) for k, (s, d) in self.fields.items()}
        self.pos = 0  # next write slot (same for all envs: they step together)
        self.count = 0  # steps written per env, ever
        self.rng = np.random.default_rng(seed)

    @classmethod
    def for_spaces(cls, obs_spec, action_dim: int, capacity: int, num_envs: int, seed: int = 0):
        fields: dict[str, tuple[tuple, np.dtype]] = {}
        for k, shape in obs_spec.images.items():
            fields[f"obs/{k}"] = (shape, np.uint8)
        for k, size in obs_spec.vectors.items():
            fields[f"obs/{k}"] = ((size,), np.float32)
        fields["action"] = ((action_dim,), np.float32)
        fields["reward"] = ((), np.float32)
        for f in FLAGS:
            fields[f] = ((), np.bool_)
        return cls(capacity, num_envs, fields, seed)

    def __len__(self) -> int:
        return min(self.count, self.per_env) * self.num_envs

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.data.values())

    def add(self, step: dict[str, np.ndarray]) -> None:
        """Append one step of every env: each field shaped (num_envs, ...)."""
        for k, arr in self.data.items():
            arr[:, self.pos] = step[k]
        self.pos = (self.pos + 1) % self.per_env
        self.count += 1

    def can_sample(self, length: int) -> bool:
        return min(self.count, self.per_env) >= length

    def sample_indices(self, batch: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        stored = min(self.count, self.per_env)
        if stored < length:
            raise ValueError(f"replay holds {stored} steps per env, fewer than the window "
                             f"length {length}")
        env = self.rng.integers(self.num_envs, size=batch)
        start = self.rng.integers(stored - length + 1, size=batch)
        oldest = (self.pos - stored) % self.per_env
        idx = (oldest + start[:, None] + np.arange(length)[None]) % self.per_env
        return env[:, None], idx

    def sample(self, batch: int, length: int) -> dict[str, np.ndarray]:
        env, idx = self.sample_indices(batch, length)
        return {k: arr[env, idx] for k, arr in self.data.items()}

    # ------------------------------------------------------------------ persistence

    def save(self, path: str | Path) -> None:
        """Write the stored steps (oldest first) to an .npz file, atomically."""
        path = Path(path)
        stored = min(self.count, self.per_env)
        order = (self.pos - stored + np.arange(stored)) % self.per_env
        arrays = {k: a[:, order] for k, a in self.data.items()}
        tmp = path.with_suffix(".tmp.npz")
        with open(tmp, "wb") as f:
            np.savez(f, __count__=np.int64(self.count), **arrays)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)

    def load(self, path: str | Path) -> None:
        with np.load(path, allow_pickle=False) as f:
            for k in self.data:
                if k not in f:
                    raise ValueError(f"replay file {path} lacks field {k!r}; it was written "
                                     f"for other observation/action spaces")
            stored = f[next(iter(self.data))].shape[1]
            keep = min(stored, self.per_env)
            for k, a in self.data.items():
                src = f[k]
                if src.shape[0] != self.num_envs or src.shape[2:] != a.shape[2:]:
                    raise ValueError(f"replay file field {k!r} has shape {src.shape}, which "
                                     f"does not fit ({self.num_envs}, *, {a.shape[2:]})")
                a[:, :keep] = src[:, stored - keep:]
            self.count = int(f["__count__"])
        self.pos = keep % self.per_env
        if self.count < keep:
            self.count = keep


def to_batch(sample: dict[str, np.ndarray], device: torch.device) -> dict:
    """Numpy window sample -> the agent's batch dict of tensors (B, T, ...)."""
    obs = {k[4:]: torch.as_tensor(v, device=device) for k, v in sample.items()
           if k.startswith("obs/")}
    out = {k: torch.as_tensor(v, device=device) for k, v in sample.items()
           if not k.startswith("obs/")}
    out["obs"] = obs
    return out
