"""MiniGrid as 64x64x3 uint8 RGB images.

`minigrid:DoorKey-5x5` (or the full id `MiniGrid-DoorKey-5x5-v0`): the fully observable RGB
rendering of the grid (RGBImgObsWrapper, 16 pixels per tile; the mission string dropped by
ImgObsWrapper), resized to 64x64 with cv2 INTER_AREA (ResizeObservation). Actions are the 7
discrete MiniGrid actions; episodes end at the env's own `max_steps` (a truncation) or when
the goal is reached (a termination, reward 1 - 0.9 * steps / max_steps).
`partial=True` uses the agent's egocentric 7x7 view (RGBImgPartialObsWrapper) instead.
"""

from __future__ import annotations

import difflib

import gymnasium as gym
import numpy as np

from .extras import require

MINIGRID_DEFAULTS = dict(size=64, tile_size=16, partial=False)


def minigrid_id(task: str) -> str:
    if task.startswith(("MiniGrid-", "BabyAI-")):
        return task if task.rsplit("-", 1)[-1].startswith("v") else f"{task}-v0"
    return f"MiniGrid-{task}-v0"


class PixelObservation(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """MiniGrid's grid drawn as `size` x `size` x 3 uint8 pixels: the whole grid
    (RGBImgObsWrapper's frame) or the agent's view (`partial`, RGBImgPartialObsWrapper's), the
    mission string dropped (ImgObsWrapper), resized with cv2 INTER_AREA (ResizeObservation).
    One wrapper that records its arguments, so that gymnasium can remake the env from its
    spec (`check_env` does), which minigrid's own wrappers do not allow."""

    def __init__(self, env: gym.Env, size: int = 64, tile_size: int = 16, partial: bool = False):
        gym.utils.RecordConstructorArgs.__init__(self, size=size, tile_size=tile_size,
                                                 partial=partial)
        gym.ObservationWrapper.__init__(self, env)
        self.size, self.tile_size, self.partial = int(size), int(tile_size), bool(partial)
        self.observation_space = gym.spaces.Box(0, 255, (self.size, self.size, 3), np.uint8)

    def observation(self, obs):
        env = self.unwrapped
        if self.partial:
            frame = env.get_frame(tile_size=self.tile_size, agent_pov=True)
        else:
            frame = env.get_frame(highlight=env.highlight, tile_size=self.tile_size)
        if frame.shape[:2] != (self.size, self.size):
            import cv2
            frame = cv2.resize(frame, (self.size, self.size), interpolation=cv2.INTER_AREA)
        return frame.reshape(self.observation_space.shape)


def make_minigrid(task: str, render_mode: str | None = None, **overrides) -> gym.Env:
    opts = dict(MINIGRID_DEFAULTS)
    unknown = set(overrides) - set(opts)
    if unknown:
        raise TypeError(f"unknown MiniGrid option(s) {sorted(unknown)}; options: {sorted(opts)}")
    opts.update(overrides)
    require("minigrid", "minigrid", "minigrid")
    require("cv2", "minigrid", "minigrid")
    env_id = minigrid_id(task)
    if env_id not in gym.registry:
        names = [k for k in gym.registry if k.startswith(("MiniGrid-", "BabyAI-"))]
        close = difflib.get_close_matches(env_id, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown MiniGrid task {task!r}{hint}")
    env = gym.make(env_id, render_mode=render_mode)
    return PixelObservation(env, opts["size"], opts["tile_size"], opts["partial"])
