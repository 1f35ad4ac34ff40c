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

from .extras import require

MINIGRID_DEFAULTS = dict(size=64, tile_size=16, partial=False)


def minigrid_id(task: str) -> str:
    if task.startswith(("MiniGrid-", "BabyAI-")):
        return task if task.rsplit("-", 1)[-1].startswith("v") else f"{task}-v0"
    return f"MiniGrid-{task}-v0"


def make_minigrid(task: str, render_mode: str | None = None, **overrides) -> gym.Env:
    opts = dict(MINIGRID_DEFAULTS)
    unknown = set(overrides) - set(opts)
    if unknown:
        raise TypeError(f"unknown MiniGrid option(s) {sorted(unknown)}; options: {sorted(opts)}")
    opts.update(overrides)
    require("minigrid", "minigrid", "minigrid")
    require("cv2", "minigrid", "minigrid")
    from minigrid.wrappers import ImgObsWrapper, RGBImgObsWrapper, RGBImgPartialObsWrapper
    env_id = minigrid_id(task)
    if env_id not in gym.registry:
        names = [k for k in gym.registry if k.startswith(("MiniGrid-", "BabyAI-"))]
        close = difflib.get_close_matches(env_id, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown MiniGrid task {task!r}{hint}")
    env = gym.make(env_id, render_mode=render_mode)
    wrapper = RGBImgPartialObsWrapper if opts["partial"] else RGBImgObsWrapper
    env = ImgObsWrapper(wrapper(env, tile_size=opts["tile_size"]))
    size = int(opts["size"])
    if env.observation_space.shape[:2] != (size, size):
        env = gym.wrappers.ResizeObservation(env, (size, size))
    return env
