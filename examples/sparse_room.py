"""A sparse-reward room for exploration (docs/exploration.md): a gymnasium env of its own.

The agent starts each episode in the corner (0, 0) of a `size` x `size` grid and moves up,
down, left or right; it sees its two coordinates scaled to [-1, 1]. Reaching the far corner
gives reward 1 and ends the episode; every other step gives 0, and an episode is cut after
`max_steps`. A random walk from the corner almost never gets there, so an agent that only
follows the reward sees none. Each step's info counts the distinct cells this env has
visited since it was made (`cells_seen`, over all its episodes): the coverage of exploration.

    lucid train examples/sparse_room.py:SparseRoom --preset cpu-control explore.method=p2e \
        explore.reward_free_steps=20000 run.steps=20000 train.train_ratio=64
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

MOVES = np.array([(0, 1), (0, -1), (1, 0), (-1, 0)])


class SparseRoom(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, size: int = 31, max_steps: int = 100, render_mode=None):
        if size < 2:
            raise ValueError(f"SparseRoom needs size >= 2, not {size}")
        self.size, self.max_steps = size, max_steps
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(4)
        self.pos = np.zeros(2, np.int64)
        self.t = 0
        self.seen: set[tuple[int, int]] = set()

    def _obs(self) -> np.ndarray:
        return (2.0 * self.pos / (self.size - 1) - 1.0).astype(np.float32)

    def _info(self) -> dict:
        return {"cells_seen": len(self.seen)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos[:] = 0
        self.t = 0
        self.seen.add((0, 0))
        return self._obs(), self._info()

    def step(self, action):
        self.pos = np.clip(self.pos + MOVES[int(action)], 0, self.size - 1)
        self.t += 1
        self.seen.add((int(self.pos[0]), int(self.pos[1])))
        goal = bool(self.pos[0] == self.pos[1] == self.size - 1)
        return self._obs(), float(goal), goal, self.t >= self.max_steps, self._info()
