"""envpool (C++ batched envs) as a single gymnasium env: `envpool:Pong-v5`.

envpool runs the emulator in C++ threads; here one envpool env of batch size 1 is exposed as a
gymnasium env, so it fits `gymnasium.vector.SyncVectorEnv` like every other suite. For Atari
ids (`*-v5`, but not envpool's MuJoCo tasks such as `Hopper-v5`) the 2023 paper's settings
are passed: 64x64 RGB, frame skip 4 with max-pool, sticky actions 0.25, the full action set
of 18, INTER_AREA resize, no frame stacking, no episodic life, no reward clipping,
108,000-frame limit (27,000 agent steps). Extra keyword arguments go to
`envpool.make_gymnasium`.

Pixel tasks of envpool's MuJoCo/DMC (`from_pixels=True`) need libEGL loaded globally first;
this module does so. envpool's images (Atari's and these) are C x H x W; lucid's are H x W x C.
envpool has wheels for CPython 3.11 on Linux x86-64 only (the `envpool` extra is empty
elsewhere).
"""

from __future__ import annotations

import ctypes

import gymnasium as gym
import numpy as np

from .extras import require

ATARI_ENVPOOL_DEFAULTS = dict(img_height=64, img_width=64, stack_num=1, gray_scale=False,
                              frame_skip=4, repeat_action_probability=0.25, noop_max=1,
                              full_action_space=True, use_inter_area_resize=True,
                              episodic_life=False, zero_discount_on_life_loss=False,
                              reward_clip=False, max_episode_steps=27_000, use_fire_reset=False)
# envpool's MuJoCo tasks are gymnasium's v5 versions: their ids end in -v5 as its Atari games' do
MUJOCO_V5 = frozenset({"Ant", "HalfCheetah", "Hopper", "Humanoid", "HumanoidStandup",
                       "InvertedDoublePendulum", "InvertedPendulum", "Pusher", "Reacher",
                       "Swimmer", "Walker2d"})


def is_atari(task: str) -> bool:
    """Whether an envpool id names one of its Atari games (`Pong-v5`, not `Hopper-v5`)."""
    return task.endswith("-v5") and task[:-len("-v5")] not in MUJOCO_V5


def _load_egl() -> None:
    try:
        ctypes.CDLL("libEGL.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        pass


def _unbatch_space(space: gym.Space, chw: bool) -> gym.Space:
    if isinstance(space, gym.spaces.Box) and chw and len(space.shape) == 3:
        c, h, w = space.shape
        return gym.spaces.Box(0, 255, (h, w, c), np.uint8)
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({k: _unbatch_space(s, chw) for k, s in space.spaces.items()})
    return space


class EnvpoolEnv(gym.Env):
    """One envpool environment (batch size 1) with gymnasium's single-env API."""

    def __init__(self, task: str, seed: int = 0, **kwargs):
        _load_egl()
        envpool = require("envpool", "envpool", "envpool")
        self._task = task
        self._is_atari = is_atari(task)
        opts = dict(ATARI_ENVPOOL_DEFAULTS) if self._is_atari else {}
        opts.update(kwargs)
        self._kwargs = opts
        self._envpool = envpool
        self._pool = envpool.make_gymnasium(task, num_envs=1, batch_size=1, seed=seed, **opts)
        self._chw = self._is_atari or bool(opts.get("from_pixels"))  # images to transpose
        self.observation_space = _unbatch_space(self._pool.observation_space, self._chw)
        self.action_space = self._pool.action_space

    def _obs(self, obs):
        if isinstance(obs, dict):
            return {k: self._one(v) for k, v in obs.items()}
        return self._one(obs)

    def _one(self, x):
        x = np.asarray(x)[0]
        if self._chw and x.ndim == 3:
            x = np.ascontiguousarray(np.transpose(x, (1, 2, 0)))
        return x

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:  # envpool seeds at construction
            self.close()
            self._pool = self._envpool.make_gymnasium(self._task, num_envs=1, batch_size=1,
                                                      seed=int(seed), **self._kwargs)
        obs, info = self._pool.reset()
        return self._obs(obs), {}

    def step(self, action):
        obs, reward, term, trunc, info = self._pool.step(np.asarray([action]))
        return (self._obs(obs), float(np.asarray(reward)[0]), bool(np.asarray(term)[0]),
                bool(np.asarray(trunc)[0]), {})

    def close(self):
        pool = getattr(self, "_pool", None)
        if pool is not None and hasattr(pool, "close"):
            pool.close()


def make_envpool(task: str, render_mode: str | None = None, **kwargs) -> gym.Env:
    if render_mode:
        raise ValueError("envpool envs do not render; use atari:/dmc-vision: for videos")
    return EnvpoolEnv(task, **kwargs)
