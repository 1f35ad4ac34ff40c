"""DeepMind Control Suite (dm_control) as gymnasium envs, with the 2023 paper's settings.

`dmc:walker-walk`: proprioceptive observations (float64 arrays cast to float32), by default
flattened into one vector in the suite's key order; `obs="dict"` keeps one Box per key.
`dmc-vision:walker-walk`: 64x64x3 uint8 camera images (camera 0; camera 2 for quadruped, as
the authors' code does). Both repeat each action 2 times (summing rewards) and end episodes
after 1000 physics control steps = 500 agent steps, reported as a truncation; a task that
ends with discount 0 is reported as a termination. `render()` of a proprio task (videos)
draws the same camera at 240x320.

Pixels render headless: MUJOCO_GL defaults to `egl` here (set before mujoco is imported;
an existing value, e.g. `osmesa`, is kept). `fast_render=True` shrinks the 4096^2 shadow
map to 256^2 and turns off multisampling, several times faster with slightly softer shadows.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from .extras import require

DMC_DEFAULTS = dict(repeat=2, size=64, camera=None, obs="flat", fast_render=False)


def _set_headless_gl() -> None:
    os.environ.setdefault("MUJOCO_GL", "egl")
    if os.environ["MUJOCO_GL"] in ("egl", "osmesa"):
        os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])


def _space_of(spec) -> gym.Space:
    """A dm_env spec -> a gymnasium space."""
    from dm_env import specs
    if isinstance(spec, specs.DiscreteArray):
        return gym.spaces.Discrete(int(spec.num_values))
    shape = tuple(int(s) for s in spec.shape) or (1,)
    if isinstance(spec, specs.BoundedArray):
        low = np.broadcast_to(spec.minimum, spec.shape).reshape(shape)
        high = np.broadcast_to(spec.maximum, spec.shape).reshape(shape)
        dtype = np.uint8 if spec.dtype == np.uint8 else np.float32
        return gym.spaces.Box(low.astype(dtype), high.astype(dtype), shape, dtype)
    if spec.dtype == np.uint8:
        return gym.spaces.Box(0, 255, shape, np.uint8)
    return gym.spaces.Box(-np.inf, np.inf, shape, np.float32)


class DMEnv(gym.Env):
    """A dm_env.Environment as a gymnasium env, with action repeat.

    `factory(seed)` builds the dm_env; `pixels(env)` (optional) returns the image observation
    after each agent step (rendered once per agent step, not once per repeated action);
    `frame(env)` (optional) draws `render()`'s picture where the observations are not images.
    A LAST time step with discount 0 is a termination, any other LAST a truncation.
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, factory: Callable[[int | None], Any], repeat: int = 1,
                 obs: str = "flat", pixels: Callable[[Any], np.ndarray] | None = None,
                 pixel_shape: tuple[int, int, int] | None = None, reseed=None,
                 render_mode: str | None = None,
                 frame: Callable[[Any], np.ndarray] | None = None):
        if obs not in ("flat", "dict"):
            raise ValueError(f"obs must be 'flat' or 'dict', got {obs!r}")
        self._factory, self._repeat, self._mode = factory, int(repeat), obs
        self._pixels, self._reseed, self._frame = pixels, reseed, frame
        self.render_mode = render_mode
        self._env = factory(None)
        self._needs_reset = True
        self.action_space = _space_of(self._env.action_spec())
        spec = self._env.observation_spec()
        self._single = not isinstance(spec, dict)  # one array, not a dict of them
        if pixels is not None:
            self.observation_space = gym.spaces.Box(0, 255, pixel_shape, np.uint8)
        elif self._single:
            self.observation_space = _space_of(spec)
        else:
            self._keys = list(spec)
            subs = {k: _space_of(s) for k, s in spec.items()}
            if obs == "dict":
                self.observation_space = gym.spaces.Dict(subs)
            else:
                size = sum(int(np.prod(s.shape)) for s in subs.values())
                self.observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)

    @property
    def dm_env(self):
        return self._env

    def _obs(self, timestep):
        if self._pixels is not None:
            return self._pixels(self._env)
        o = timestep.observation
        if self._single:
            space = self.observation_space
            if isinstance(space, gym.spaces.Discrete):
                return int(o)
            return np.asarray(o, space.dtype).reshape(space.shape)
        if self._mode == "dict":
            return {k: np.asarray(o[k], s.dtype).reshape(s.shape)
                    for k, s in self.observation_space.spaces.items()}
        return np.concatenate([np.asarray(o[k], np.float32).ravel() for k in self._keys])

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            if self._reseed is not None:
                self._reseed(self._env, seed)
            else:
                self.close()
                self._env = self._factory(seed)
        self._needs_reset = False
        return self._obs(self._env.reset()), {}

    def step(self, action):
        if self._needs_reset:
            raise RuntimeError("call reset() before step() (the episode has ended)")
        if isinstance(self.action_space, gym.spaces.Box):
            action = np.asarray(action, np.float64).reshape(self.action_space.shape)
        total, terminated, truncated = 0.0, False, False
        discount = 1.0
        for _ in range(self._repeat):
            ts = self._env.step(action)
            total += float(ts.reward or 0.0)
            if ts.last():
                discount = float(ts.discount) if ts.discount is not None else 1.0
                terminated, truncated = discount == 0.0, discount != 0.0
                self._needs_reset = True
                break
        return self._obs(ts), total, terminated, truncated, {"discount": discount}

    def render(self):
        draw = self._pixels or self._frame
        if draw is None:
            raise NotImplementedError("this dm_env draws no pictures")
        return draw(self._env)

    def close(self):
        env = getattr(self, "_env", None)
        if env is not None and hasattr(env, "close"):
            env.close()


def parse_task(task: str) -> tuple[str, str]:
    """`walker-walk`, `walker_walk`, `ball_in_cup-catch`, `cup-catch` -> (domain, task)."""
    if "-" in task:
        domain, _, name = task.partition("-")
    else:
        domain, _, name = task.partition("_")
    domain = {"cup": "ball_in_cup", "pointmass": "point_mass"}.get(domain, domain)
    return domain, name.replace("-", "_")


def make_dmc(task: str, vision: bool = False, render_mode: str | None = None, **overrides
             ) -> gym.Env:
    """`task` as `domain-task`; options: repeat (2), size (64), camera (0; 2 for quadruped),
    obs ("flat" or "dict", proprio only), fast_render (False; vision only)."""
    opts = dict(DMC_DEFAULTS)
    unknown = set(overrides) - set(opts)
    if unknown:
        raise TypeError(f"unknown DMC option(s) {sorted(unknown)}; options: {sorted(opts)}")
    opts.update(overrides)
    _set_headless_gl()
    require("mujoco", "dmc", "dmc")
    suite = require("dm_control.suite", "dmc", "dmc")
    domain, name = parse_task(task)
    if (domain, name) not in suite.ALL_TASKS:
        import difflib
        names = [f"{d}-{t}" for d, t in suite.ALL_TASKS]
        close = difflib.get_close_matches(f"{domain}-{name}", names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown DMC task {task!r}{hint}")
    camera = opts["camera"] if opts["camera"] is not None else (2 if domain == "quadruped" else 0)
    size, fast = int(opts["size"]), bool(opts["fast_render"])

    def factory(seed):
        env = suite.load(domain, name, task_kwargs={"random": seed})
        if vision and fast:
            q = env.physics.model.vis.quality
            q.shadowsize, q.offsamples = 256, 0
        return env

    def reseed(env, seed):
        env.task.random.seed(seed)

    def pixels(env):
        return env.physics.render(size, size, camera_id=camera)

    def frame(env):  # render() of proprio tasks (videos): dm_control's default 240x320
        return env.physics.render(240, 320, camera_id=camera)

    return DMEnv(factory, opts["repeat"], "flat" if vision else opts["obs"],
                 pixels if vision else None, (size, size, 3) if vision else None, reseed,
                 render_mode, None if vision else frame)
