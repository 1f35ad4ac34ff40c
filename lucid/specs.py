"""Translate gymnasium spaces to the agent's tensors and back.

Observations become a dict of arrays: image keys (uint8, H x W x C) and vector keys (float32,
flat; Discrete and MultiDiscrete as one-hots, MultiBinary as 0/1). Dict and Tuple spaces, nested
too, are flattened into one key per leaf: `a/b` for Dict(a=Dict(b=...)), `0`, `1` for Tuple
items. Actions live in model space: concatenated one-hots for Discrete/MultiDiscrete/MultiBinary,
and [-1, 1]^d for Box, rescaled to the env's bounds on the way out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from .warn import warn

SUPPORTED_OBS = ("Box (vectors of any shape, images H x W x C), Discrete, MultiDiscrete, "
                 "MultiBinary, and Dict and Tuple spaces of these")
SUPPORTED_ACT = "Discrete, MultiDiscrete, MultiBinary or Box, and Dict and Tuple spaces of these"
LEAVES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


class ObservationKeyError(KeyError):
    """An observation without a key (or Tuple item) of its space; shown as its message, not
    quoted as KeyError shows its key."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def leaves(space: gym.Space, path: tuple = ()):
    """(path, leaf space) of every leaf of a Dict/Tuple space, in order; a path is the Dict
    keys and Tuple indices that lead to the leaf."""
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            yield from leaves(sub, (*path, key))
    elif isinstance(space, gym.spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            yield from leaves(sub, (*path, i))
    else:
        yield path, space


def _is_image(space: gym.spaces.Box) -> bool:
    return len(space.shape) == 3 and space.shape[-1] <= 4 and min(space.shape[:2]) >= 16


def _looks_like_a_misshaped_image(space: gym.spaces.Box) -> str | None:
    """Why a Box that is not H x W x C (C <= 4) looks like an image (uint8, or frames of any
    dtype stacked on a first axis), or None."""
    s = space.shape
    if len(s) == 4 and s[-1] <= 4 and min(s[1:3]) >= 16:
        return (f"{s[0]} stacked frames {s}: DreamerV3 needs no frame stacking (its recurrent "
                f"state carries the past), so drop the FrameStackObservation wrapper and give "
                f"one H x W x C frame per step")
    if space.dtype != np.uint8:
        return None
    if len(s) == 2 and min(s) >= 16:
        return (f"a grayscale image {s} without a channel axis: add one (H x W x 1), e.g. "
                f"with gymnasium.wrappers.ReshapeObservation(env, {(*s, 1)})")
    if len(s) == 3 and s[0] <= 4 and min(s[1:]) >= 16:
        return (f"a channel-first image {s}: lucid takes H x W x C, so transpose it, e.g. "
                f"with gymnasium.wrappers.TransformObservation and np.moveaxis(obs, 0, -1) "
                f"(if these are stacked frames, drop the stacking instead: DreamerV3's "
                f"recurrent state carries the past)")
    if len(s) == 3 and s[2] > 4 and min(s[:2]) >= 16:
        return (f"an image {s} with {s[2]} channels: lucid's image encoder takes at most 4; "
                f"split it into Dict keys of at most 4 channels each")
    return None


def _image_scale(space: gym.spaces.Box, where: str) -> float:
    """The factor that brings an image space's values to 0..255: 1 for integer pixels and
    floats in [0, 255], 255 for floats in [0, 1]; other float images are refused."""
    if not np.issubdtype(space.dtype, np.floating):
        return 1.0
    low, high = float(np.min(space.low)), float(np.max(space.high))
    if low >= 0 and high <= 1:
        return 255.0
    if low >= 0 and high <= 255:
        return 1.0
    raise TypeError(f"observation{where} is a float image {space.shape} with values in "
                    f"[{low:g}, {high:g}]; lucid encodes images as pixels in [0, 255] (uint8, "
                    f"or floats in [0, 1] or [0, 255]): rescale it with "
                    f"gymnasium.wrappers.TransformObservation and a Box of those bounds, or "
                    f"flatten it (gymnasium.wrappers.FlattenObservation) to encode it as a vector")


@dataclass
class ObsSpec:
    images: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # key -> (H, W, C)
    vectors: dict[str, int] = field(default_factory=dict)  # key -> flat size
    discrete: dict[str, tuple[int, ...]] = field(default_factory=dict)  # key -> n of each one-hot
    image_scale: dict[str, float] = field(default_factory=dict)  # key -> factor to 0..255
    discrete_start: dict[str, np.ndarray] = field(default_factory=dict)  # key -> starts (start=)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # key -> one obs's shape
    paths: dict[str, tuple] = field(default_factory=dict)  # key -> its place in a Dict/Tuple obs
    dtypes: dict[str, np.dtype] = field(default_factory=dict)  # key -> its space's dtype

    @classmethod
    def from_space(cls, space: gym.Space) -> "ObsSpec":
        spec = cls()
        items = list(leaves(space))
        if not items:
            raise TypeError(f"the observation space is an empty {type(space).__name__}: lucid "
                            f"needs at least one observation to learn from")
        for path, sub in items:
            where = f" at key {'/'.join(map(str, path))!r}" if path else ""
            if not isinstance(sub, LEAVES):
                drop = (" (to train on the other keys, drop it: gymnasium.wrappers."
                        "FilterObservation(env, [the keys to keep]))"
                        if len(path) == 1 and isinstance(space, gym.spaces.Dict) else "")
                raise TypeError(f"unsupported observation space {sub}{where}; "
                                f"lucid supports {SUPPORTED_OBS}{drop}")
            image = isinstance(sub, gym.spaces.Box) and _is_image(sub)
            # one observation's own name; the leaves of a Dict/Tuple are named by their path
            name = "/".join(map(str, path)) or ("image" if image else "vector")
            if name in spec.paths:
                raise ValueError(f"two observations are both named {name!r} once nested keys "
                                 f"are joined with '/'; rename one of them")
            spec.paths[name] = path
            spec.shapes[name] = tuple(int(d) for d in sub.shape)
            spec.dtypes[name] = np.dtype(sub.dtype)
            if image:  # any H x W (both >= 16): the encoder's stages follow the size
                spec.images[name] = spec.shapes[name]
                spec.image_scale[name] = _image_scale(sub, where)
            elif isinstance(sub, (gym.spaces.Box, gym.spaces.MultiBinary)):
                if isinstance(sub, gym.spaces.Box) and (why := _looks_like_a_misshaped_image(sub)):
                    raise TypeError(f"the observation{where} looks like {why}")
                spec.vectors[name] = int(np.prod(sub.shape))
            else:  # Discrete, MultiDiscrete: a one-hot per entry
                nvec = np.asarray(sub.n if isinstance(sub, gym.spaces.Discrete) else sub.nvec)
                spec.discrete[name] = tuple(int(n) for n in nvec.ravel())
                spec.discrete_start[name] = np.asarray(sub.start, np.int64).ravel()
                spec.vectors[name] = sum(spec.discrete[name])
        if len({s[:2] for s in spec.images.values()}) > 1:
            raise ValueError(f"all image observations must share one height and width, got "
                             f"{spec.images}; resize them with a wrapper")
        return spec

    @property
    def structured(self) -> bool:
        """A Dict or Tuple space (else one observation, named "image" or "vector")."""
        return any(self.paths.values())

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

    def shape(self, key: str) -> tuple[int, ...]:
        """The shape of one observation of `key`, as the env gives it."""
        return self.shapes[key]

    def _what(self, key: str) -> str:
        return f"observation {key!r}" if self.structured else "the observation"

    def leaf(self, obs, key: str):
        """The part of an env observation (one, or a batch) that `key` names."""
        for step in self.paths[key]:
            if isinstance(obs, dict):  # a Dict space's keys may be any hashable, ints too
                if step not in obs:
                    raise ObservationKeyError(f"observation is missing key {key!r} (has "
                                              f"{list(obs)})")
            elif not (isinstance(obs, (tuple, list)) and isinstance(step, int)
                      and step < len(obs)):
                raise ObservationKeyError(
                    f"observation has no item {key!r}: it is {type(obs).__name__}"
                    f"{f' of {len(obs)}' if isinstance(obs, (tuple, list)) else ''}, where "
                    f"the space has a {'Dict' if isinstance(step, str) else 'Tuple'} there")
            obs = obs[step]
        return obs

    def check(self, obs, batch_shape: tuple[int, ...] = ()) -> None:
        """Refuse, naming the key, an observation (or a batch) that does not fit its space:
        a missing key, another shape, or a dtype the space's cannot hold (float pixels for a
        uint8 image), which gymnasium's vector envs would refuse without naming the key."""
        for key in self.keys():
            x = np.asarray(self.leaf(obs, key))
            want = (*batch_shape, *self.shape(key))
            if x.shape != want:
                raise ValueError(f"{self._what(key)} has shape {x.shape}, expected {want}")
            dtype = self.dtypes[key]
            if not np.can_cast(x.dtype, dtype, "same_kind"):
                raise ValueError(
                    f"{self._what(key)} is {x.dtype}, which its space's dtype {dtype} cannot "
                    f"hold: return it as {dtype} (e.g. obs.astype(np.{dtype})), or declare "
                    f"the space with dtype {x.dtype}")

    def batch_of(self, obs) -> int | None:
        """None for one observation, N for a batch of N (a leading axis), judged by the
        spec's first key; other shapes are refused, named."""
        key = self.keys()[0]
        x, shape = np.asarray(self.leaf(obs, key)), self.shape(key)
        if x.ndim == len(shape):
            return None
        if x.ndim == len(shape) + 1:
            return x.shape[0]
        raise ValueError(f"{self._what(key)} has shape {x.shape}: one observation has shape "
                         f"{shape}, a batch of N has shape (N, *{shape})")

    def convert(self, obs, batch_shape: tuple[int, ...] = ()) -> dict[str, np.ndarray]:
        """Env observation(s) -> dict of arrays with leading `batch_shape`; checks values."""
        out: dict[str, np.ndarray] = {}
        for key in self.keys():
            x = np.asarray(self.leaf(obs, key))
            if key in self.images:
                if x.shape != (*batch_shape, *self.images[key]):
                    raise ValueError(f"{self._what(key)} has shape {x.shape}, expected "
                                     f"{(*batch_shape, *self.images[key])}")
                if x.dtype != np.uint8:
                    if not np.all(np.isfinite(x)):
                        raise ValueError(f"{self._what(key)} contains NaN or Inf")
                    scale = self.image_scale.get(key, 1.0)
                    x = x * scale
                    if x.size and (x.min() < -0.5 or x.max() > 255.5):  # beyond rounding
                        warn(f"{self._what(key)} has values outside [0, {255 / scale:g}], "
                             f"the range lucid reads from its space's bounds, which are "
                             f"clipped into it: declare the bounds the env's images have "
                             f"(Box(0, 255) for floats in 0..255, Box(0, 1) for floats in 0..1)")
                    x = np.rint(np.clip(x, 0, 255)).astype(np.uint8)
            elif key in self.discrete:
                nvec = self.discrete[key]
                if x.shape != (*batch_shape, *self.shape(key)):
                    raise ValueError(f"{self._what(key)} has shape {x.shape}, expected "
                                     f"{(*batch_shape, *self.shape(key))}")
                idx = x.reshape(*batch_shape, len(nvec)).astype(np.int64)
                idx = idx - self.discrete_start[key]
                if np.any((idx < 0) | (idx >= np.asarray(nvec))):
                    start, what = self.discrete_start[key], self._what(key)
                    if not self.shape(key):
                        raise ValueError(f"{what} = {x.tolist()} lies outside its Discrete "
                                         f"space ({start[0]} to {start[0] + nvec[0] - 1})")
                    raise ValueError(f"{what} = {x.tolist()} lies outside its MultiDiscrete "
                                     f"space (entries from {start.tolist()} to "
                                     f"{(start + np.asarray(nvec) - 1).tolist()})")
                x = np.concatenate([np.eye(n, dtype=np.float32)[idx[..., j]]
                                    for j, n in enumerate(nvec)], -1)
            else:
                if x.size != np.prod(batch_shape, dtype=np.int64) * self.vectors[key]:
                    raise ValueError(f"{self._what(key)} has shape {x.shape}, expected "
                                     f"{(*batch_shape, *self.shape(key))}")
                x = x.reshape(*batch_shape, -1).astype(np.float32)
                if not np.all(np.isfinite(x)):
                    raise ValueError(f"{self._what(key)} contains NaN or Inf; check the "
                                     f"environment or wrap it to clean its observations")
            out[key] = x
        return out


@dataclass
class ActionSpec:
    discrete: list[int] | None = None  # sizes of the categorical sub-actions
    low: np.ndarray | None = None  # Box bounds (continuous)
    high: np.ndarray | None = None
    shape: tuple[int, ...] = ()
    start: np.ndarray | None = None  # first index of each categorical sub-action (start=)
    dtype: np.dtype | None = None  # of the env's actions where not the default (int64 for
    # (Multi)Discrete, float32 for Box): MultiBinary's, a float64 or integer Box's
    space: gym.Space | None = None  # a Dict or Tuple action space, whose leaves are `parts`
    parts: list[tuple[tuple, "ActionSpec"]] = field(default_factory=list)  # (path, leaf spec)
    int_bounds: tuple[np.ndarray, np.ndarray] | None = None  # an integer Box's own bounds:
    # `low`/`high` are float64, which rounds int64 bounds beyond 2**53

    @classmethod
    def from_space(cls, space: gym.Space, where: str = "") -> "ActionSpec":
        """`where`: the leaf's path in a Dict/Tuple action space, for messages."""
        if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            return cls._structured(space)
        name = f"action space {space}" + (f" (action {where!r})" if where else "")
        if isinstance(space, (gym.spaces.Box, gym.spaces.MultiDiscrete)) \
                and int(np.prod(space.shape)) == 0:  # nothing for the actor to output
            raise TypeError(f"the {name} has no actions in it (shape {space.shape}); "
                            + ("drop it from the action space" if where else
                               "give the env at least one action"))
        if isinstance(space, gym.spaces.Discrete):
            return cls(discrete=[int(space.n)], shape=(), start=np.array([int(space.start)]))
        if isinstance(space, gym.spaces.MultiDiscrete):
            return cls(discrete=[int(n) for n in np.asarray(space.nvec).ravel()],
                       shape=tuple(space.nvec.shape),
                       start=np.asarray(space.start, np.int64).ravel())
        if isinstance(space, gym.spaces.MultiBinary):  # a two-way categorical per entry
            n = int(np.prod(space.shape))
            return cls(discrete=[2] * n, shape=tuple(space.shape), start=np.zeros(n, np.int64),
                       dtype=space.dtype)
        if isinstance(space, gym.spaces.Box):
            low, high = space.low.astype(np.float64).ravel(), space.high.astype(np.float64).ravel()
            open_dims = np.flatnonzero(~(np.isfinite(low) & np.isfinite(high)))
            if open_dims.size:
                warn(f"the {name} has infinite bounds at dims "
                     f"{open_dims.tolist()}: lucid's actions there lie in [-1, 1] (within the "
                     f"bounds); give it finite bounds, or rescale with "
                     f"gymnasium.wrappers.RescaleAction")
            exact = ((space.low.ravel(), space.high.ravel())
                     if np.issubdtype(space.dtype, np.integer) else None)
            return cls(low=low, high=high, shape=tuple(space.shape),
                       dtype=None if space.dtype == np.float32 else space.dtype,
                       int_bounds=exact)
        raise TypeError(f"unsupported {name}; lucid supports {SUPPORTED_ACT}")

    @classmethod
    def _structured(cls, space: gym.Space) -> "ActionSpec":
        """A Dict/Tuple action space: the model's action is its leaves' actions side by side,
        the discrete leaves' one-hots first, then the Box leaves' dimensions, each in leaf
        order (`slices`): categoricals and one Normal, as for flat spaces of each kind."""
        parts = [(path, cls.from_space(leaf, "/".join(map(str, path))))
                 for path, leaf in leaves(space)]
        if not parts:
            raise TypeError(f"the action space {space} has no actions in it")
        disc = [part for _, part in parts if part.is_discrete]
        box = [part for _, part in parts if not part.is_discrete]
        return cls(discrete=[n for part in disc for n in part.discrete] if disc else None,
                   low=np.concatenate([part.low for part in box]) if box else None,
                   high=np.concatenate([part.high for part in box]) if box else None,
                   space=space, parts=parts)

    def slices(self) -> list[slice]:
        """Where each of `parts` lies in the model's action: discrete leaves first, then Box
        leaves, each kind in leaf order."""
        first = [0, self.n_discrete]  # the next free index of each kind
        out = []
        for _, part in self.parts:
            k = 0 if part.is_discrete else 1
            out.append(slice(first[k], first[k] + part.dim))
            first[k] += part.dim
        return out

    def _assemble(self, leaf_of) -> Any:
        """The Dict/Tuple structure of `space` with `leaf_of(path)` at each leaf."""
        def build(space, path):
            if isinstance(space, gym.spaces.Dict):
                return {k: build(sub, (*path, k)) for k, sub in space.spaces.items()}
            if isinstance(space, gym.spaces.Tuple):
                return tuple(build(sub, (*path, i)) for i, sub in enumerate(space.spaces))
            return leaf_of(path)
        return build(self.space, ())

    @staticmethod
    def _get(action, path: tuple):
        for step in path:
            action = action[step]
        return action

    def item(self, batch, i: int):
        """The `i`-th env action of a batch that `to_env` returned."""
        if self.parts:
            return self._assemble(lambda path: self._get(batch, path)[i])
        return batch[i]

    @property
    def is_discrete(self) -> bool:
        """Only categorical actions (no Box leaf)."""
        return self.low is None

    @property
    def is_continuous(self) -> bool:
        """Only Box actions (no discrete leaf)."""
        return self.discrete is None

    @property
    def n_discrete(self) -> int:
        """Width of the one-hot block, which leads the model's action."""
        return sum(self.discrete) if self.discrete else 0

    @property
    def dim(self) -> int:
        return self.n_discrete + (int(self.low.size) if self.low is not None else 0)

    def to_env(self, action: np.ndarray):
        """Model-space actions (N, dim) -> a batch of env actions (for a Dict/Tuple space,
        its structure with a batch at each leaf, as gymnasium's vector envs take)."""
        if self.parts:
            leaves = {path: part.to_env(action[:, where])
                      for (path, part), where in zip(self.parts, self.slices())}
            return self._assemble(leaves.__getitem__)
        if self.discrete:
            parts, i = [], 0
            for n in self.discrete:
                parts.append(action[:, i:i + n].argmax(-1))
                i += n
            idx = np.stack(parts, -1)
            if self.start is not None:
                idx = idx + self.start
            if self.dtype is not None:
                idx = idx.astype(self.dtype)
            if not self.shape:
                return idx[:, 0]
            return idx.reshape(len(action), *self.shape)
        a = np.clip(action, -1.0, 1.0).astype(np.float64)
        finite = np.isfinite(self.low) & np.isfinite(self.high)
        with np.errstate(invalid="ignore"):  # inf bounds: the branch np.where drops
            scaled = np.where(finite, self.low + (a + 1.0) / 2.0 * (self.high - self.low), a)
        scaled = np.clip(scaled, self.low, self.high)  # half-open bounds: stay inside
        if self.int_bounds is not None:  # an integer Box: the nearest integer within bounds,
            # clipped where exact: float64 may round a bound past itself or past the dtype
            info = np.iinfo(self.dtype)
            top = np.nextafter(float(info.max) + 1.0, 0.0)  # the largest float below 2**bits
            ints = np.clip(np.rint(scaled), float(info.min), top).astype(self.dtype)
            return np.clip(ints, *self.int_bounds).reshape(len(action), *self.shape)
        scaled = scaled.reshape(len(action), *self.shape)
        if self.dtype is None:
            return scaled.astype(np.float32)
        if self.dtype == np.bool_:
            return scaled > 0.5
        return scaled.astype(self.dtype)

    def from_env(self, action) -> np.ndarray:
        """A batch of env actions -> model space (N, dim)."""
        if self.parts:
            leaves = [part.from_env(self._get(action, path)) for path, part in self.parts]
            out = np.empty((len(leaves[0]), self.dim), np.float32)
            for leaf, where in zip(leaves, self.slices()):
                out[:, where] = leaf
            return out
        a = np.asarray(action)
        n = a.shape[0]
        if self.discrete:
            idx = a.reshape(n, -1).astype(np.int64)
            if self.start is not None:
                idx = idx - self.start
            return np.concatenate(
                [np.eye(k, dtype=np.float32)[idx[:, j]] for j, k in enumerate(self.discrete)], -1)
        a = a.reshape(n, -1).astype(np.float64)
        finite = np.isfinite(self.low) & np.isfinite(self.high) & (self.high > self.low)
        span = np.where(finite, self.high - self.low, 2.0)
        with np.errstate(invalid="ignore"):
            unscaled = np.where(finite, 2.0 * (a - self.low) / span - 1.0,
                                np.where(self.high == self.low, 0.0, a))
        return unscaled.astype(np.float32)
