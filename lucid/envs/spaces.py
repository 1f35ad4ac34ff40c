"""Translate gymnasium spaces to the agent's tensors and back.

Observations become a dict of arrays: image keys (uint8, H x W x C) and vector keys (float32,
flat). Actions live in model space: concatenated one-hots for Discrete/MultiDiscrete, and
[-1, 1]^d for Box, rescaled to the env's bounds on the way out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

SUPPORTED_OBS = "Box (vectors of any shape, images H x W x C), Discrete, or a Dict of these"
SUPPORTED_ACT = "Discrete, MultiDiscrete or Box"


def _is_image(space: gym.spaces.Box) -> bool:
    return len(space.shape) == 3 and space.shape[-1] <= 4 and min(space.shape[:2]) >= 16


@dataclass
class ObsSpec:
    images: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # key -> (H, W, C)
    vectors: dict[str, int] = field(default_factory=dict)  # key -> flat size
    discrete: dict[str, int] = field(default_factory=dict)  # key -> n (one-hot encoded)

    @classmethod
    def from_space(cls, space: gym.Space) -> "ObsSpec":
        spec = cls()
        items = space.spaces.items() if isinstance(space, gym.spaces.Dict) else [(None, space)]
        for key, sub in items:
            if isinstance(sub, gym.spaces.Box):
                if _is_image(sub):
                    spec.images[key or "image"] = tuple(int(s) for s in sub.shape)
                else:
                    spec.vectors[key or "vector"] = int(np.prod(sub.shape))
            elif isinstance(sub, gym.spaces.Discrete):
                spec.vectors[key or "vector"] = int(sub.n)
                spec.discrete[key or "vector"] = int(sub.n)
            else:
                where = f" at key {key!r}" if key else ""
                raise TypeError(f"unsupported observation space {sub}{where}; "
                                f"lucid supports {SUPPORTED_OBS}")
        if len({s[:2] for s in spec.images.values()}) > 1:
            raise ValueError(f"all image observations must share one height and width, got "
                             f"{spec.images}; resize them with a wrapper")
        return spec

    @property
    def vector_dim(self) -> int:
        return sum(self.vectors.values())

    @property
    def image_shape(self) -> tuple[int, int, int] | None:
        """(C, H, W) of the channel-concatenated images, or None."""
        if not self.images:
            return None
        h, w, _ = next(iter(self.images.values()))
        return (sum(s[2] for s in self.images.values()), h, w)

    def keys(self) -> list[str]:
        return list(self.images) + list(self.vectors)

    def convert(self, obs, batch_shape: tuple[int, ...] = ()) -> dict[str, np.ndarray]:
        """Env observation(s) -> dict of arrays with leading `batch_shape`; checks values."""
        raw = obs if isinstance(obs, dict) else {self.keys()[0]: obs}
        out: dict[str, np.ndarray] = {}
        for key in self.keys():
            if key not in raw:
                raise KeyError(f"observation is missing key {key!r} (has {list(raw)})")
            x = np.asarray(raw[key])
            if key in self.images:
                if x.shape != (*batch_shape, *self.images[key]):
                    raise ValueError(f"observation {key!r} has shape {x.shape}, expected "
                                     f"{(*batch_shape, *self.images[key])}")
                if x.dtype != np.uint8:
                    if not np.all(np.isfinite(x)):
                        raise ValueError(f"observation {key!r} contains NaN or Inf")
                    x = np.clip(x, 0, 255).astype(np.uint8)
            elif key in self.discrete:
                x = np.eye(self.discrete[key], dtype=np.float32)[x.astype(np.int64)]
            else:
                x = x.reshape(*batch_shape, -1).astype(np.float32)
                if x.shape[-1] != self.vectors[key]:
                    raise ValueError(f"observation {key!r} has {x.shape[-1]} values, "
                                     f"expected {self.vectors[key]}")
                if not np.all(np.isfinite(x)):
                    raise ValueError(f"observation {key!r} contains NaN or Inf; check the "
                                     f"environment or wrap it to clean its observations")
            out[key] = x
        return out


@dataclass
class ActionSpec:
    discrete: list[int] | None = None  # sizes of the categorical sub-actions
    low: np.ndarray | None = None  # Box bounds (continuous)
    high: np.ndarray | None = None
    shape: tuple[int, ...] = ()

    @classmethod
    def from_space(cls, space: gym.Space) -> "ActionSpec":
        if isinstance(space, gym.spaces.Discrete):
            return cls(discrete=[int(space.n)], shape=())
        if isinstance(space, gym.spaces.MultiDiscrete):
            return cls(discrete=[int(n) for n in np.asarray(space.nvec).ravel()],
                       shape=tuple(space.nvec.shape))
        if isinstance(space, gym.spaces.Box):
            return cls(low=space.low.astype(np.float64).ravel(),
                       high=space.high.astype(np.float64).ravel(), shape=tuple(space.shape))
        raise TypeError(f"unsupported action space {space}; lucid supports {SUPPORTED_ACT}")

    @property
    def is_discrete(self) -> bool:
        return self.discrete is not None

    @property
    def dim(self) -> int:
        return sum(self.discrete) if self.discrete else int(self.low.size)

    def to_env(self, action: np.ndarray):
        """Model-space actions (N, dim) -> a batch of env actions."""
        if self.discrete:
            parts, i = [], 0
            for n in self.discrete:
                parts.append(action[:, i:i + n].argmax(-1))
                i += n
            idx = np.stack(parts, -1)
            if not self.shape:
                return idx[:, 0]
            return idx.reshape(len(action), *self.shape)
        a = np.clip(action, -1.0, 1.0).astype(np.float64)
        finite = np.isfinite(self.low) & np.isfinite(self.high)
        scaled = np.where(finite, self.low + (a + 1.0) / 2.0 * (self.high - self.low), a)
        return scaled.reshape(len(action), *self.shape).astype(np.float32)

    def from_env(self, action) -> np.ndarray:
        """A batch of env actions -> model space (N, dim)."""
        a = np.asarray(action)
        n = a.shape[0]
        if self.discrete:
            idx = a.reshape(n, -1)
            return np.concatenate(
                [np.eye(k, dtype=np.float32)[idx[:, j]] for j, k in enumerate(self.discrete)], -1)
        a = a.reshape(n, -1).astype(np.float64)
        finite = np.isfinite(self.low) & np.isfinite(self.high)
        span = np.where(finite, self.high - self.low, 2.0)
        unscaled = np.where(finite, 2.0 * (a - self.low) / span - 1.0, a)
        return unscaled.astype(np.float32)
