"""Memory Maze (Pasukonis et al. 2022) as a gymnasium env.

`memory-maze:9x9` (also 11x11, 13x13, 15x15): 64x64x3 uint8 egocentric images with the
target color drawn as the image border, 6 discrete actions, 4 Hz control, episodes of
1000/2000/3000/4000 steps (250/500/750/1000 seconds) reported as truncations.

Built directly from the package's dm_env tasks (`memory_maze.tasks`), so no legacy gym
wrapper sits in between; the package itself still needs legacy `gym==0.26.2` to import,
which the `memory-maze` extra installs. MuJoCo renders headless (MUJOCO_GL=egl by default).
Call `env.close()` before exiting.
"""

from __future__ import annotations

import gymnasium as gym

from .dmc import DMEnv, _set_headless_gl
from .extras import require

SIZES = ("9x9", "11x11", "13x13", "15x15")
MEMORY_MAZE_DEFAULTS = dict(size=64, good_visibility=False)


def make_memory_maze(task: str, render_mode: str | None = None, **overrides) -> gym.Env:
    opts = dict(MEMORY_MAZE_DEFAULTS)
    unknown = set(overrides) - set(opts)
    if unknown:
        raise TypeError(f"unknown Memory Maze option(s) {sorted(unknown)}; options: "
                        f"{sorted(opts)}")
    opts.update(overrides)
    if task not in SIZES:
        raise ValueError(f"unknown Memory Maze size {task!r}; choose one of {', '.join(SIZES)}")
    _set_headless_gl()
    require("dm_control", "memory-maze", "memory-maze")
    tasks = require("memory_maze.tasks", "memory-maze", "memory-maze")
    build = getattr(tasks, f"memory_maze_{task}")
    size = int(opts["size"])

    def factory(seed):  # memory-maze 1.0.3 seeds a task at construction
        return build(image_only_obs=True, discrete_actions=True, camera_resolution=size,
                     good_visibility=bool(opts["good_visibility"]), seed=seed)

    return DMEnv(factory, repeat=1, obs="flat", render_mode=render_mode)
