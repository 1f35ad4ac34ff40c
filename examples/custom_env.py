"""A worked custom environment: Dict observations (an image and a vector) and MultiDiscrete
actions, trainable as it is.

    lucid train examples.custom_env:MyEnv --steps 5000        # the class
    lucid train examples.custom_env:make_env --steps 5000     # or a function returning an env

(run from the repository root; lucid adds the working directory to the import path when the
module is not installed). From Python:

    from lucid import Dreamer
    agent = Dreamer("examples.custom_env:MyEnv")  # on a CPU: preset cpu-pixels (images)

With no preset, lucid picks one for the machine: on a CPU `cpu-pixels`, its recipe for image
observations (this env has one), on a CUDA GPU the paper's settings (`default`).

The task: an agent and a goal sit on a size x size grid. The agent moves by (dx, dy), each in
{-1, 0, +1}, chosen as a MultiDiscrete([3, 3]) action. Reaching the goal gives +1 and ends the
episode (a termination); every step costs 0.01; after `max_steps` steps the episode is
truncated. Observations: "image", a 64x64x3 uint8 picture of the grid (agent red, goal green),
and "position", the float64 vector (agent x, agent y, goal x, goal y) / (size - 1).
lucid casts float64 vectors to float32 and accepts images of any size from 16 pixels a side.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class MyEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, size: int = 8, max_steps: int = 50, render_mode: str | None = None):
        if 64 % size:
            raise ValueError("size must divide 64 (the image is 64x64 pixels)")
        self.size, self.max_steps, self.render_mode = size, max_steps, render_mode
        self.cell = 64 // size
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (64, 64, 3), np.uint8),
            "position": gym.spaces.Box(0.0, 1.0, (4,), np.float64),
        })
        self.action_space = gym.spaces.MultiDiscrete([3, 3])
        self.agent = np.zeros(2, np.int64)
        self.goal = np.zeros(2, np.int64)
        self.t = 0

    def _obs(self):
        image = np.zeros((64, 64, 3), np.uint8)
        image[..., 2] = 40  # dark blue background
        for (x, y), color in ((self.goal, (0, 255, 0)), (self.agent, (255, 0, 0))):
            image[y * self.cell:(y + 1) * self.cell, x * self.cell:(x + 1) * self.cell] = color
        position = np.concatenate([self.agent, self.goal]).astype(np.float64) / (self.size - 1)
        return {"image": image, "position": position}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.agent = self.np_random.integers(0, self.size, 2)
        self.goal = self.np_random.integers(0, self.size, 2)
        while np.array_equal(self.goal, self.agent):
            self.goal = self.np_random.integers(0, self.size, 2)
        return self._obs(), {}

    def step(self, action):
        move = np.asarray(action, np.int64).reshape(2) - 1  # {0, 1, 2} -> {-1, 0, +1}
        self.agent = np.clip(self.agent + move, 0, self.size - 1)
        self.t += 1
        reached = bool(np.array_equal(self.agent, self.goal))
        reward = 1.0 if reached else -0.01
        truncated = not reached and self.t >= self.max_steps
        return self._obs(), reward, reached, truncated, {}

    def render(self):
        return self._obs()["image"]


def make_env(size: int = 8, max_steps: int = 50) -> gym.Env:
    """The same env through a factory function (`examples.custom_env:make_env`)."""
    return MyEnv(size=size, max_steps=max_steps)
