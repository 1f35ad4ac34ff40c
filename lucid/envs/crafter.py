"""Crafter (Hafner 2021) as a gymnasium env, and the Crafter score.

`crafter` (or `crafter:reward`): 64x64x3 uint8 images, 17 discrete actions, reward for
unlocking achievements and for health changes, episodes of at most 10,000 steps (reported as a
truncation; the player's death is a termination). `crafter:noreward` gives zero rewards.
`info["achievements"]` holds the running count of every achievement in the episode.

The Crafter score (Hafner 2021, Eq. 1): S = exp(mean_i ln(1 + s_i)) - 1, where s_i in
[0, 100] is the success rate in percent of achievement i, i.e. the share of episodes in
which it was unlocked at least once, over all 22 achievements.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import gymnasium as gym
import numpy as np

from .extras import require

# The 22 achievements of crafter 1.8 (crafter.constants.achievements), sorted.
ACHIEVEMENTS = (
    "collect_coal", "collect_diamond", "collect_drink", "collect_iron", "collect_sapling",
    "collect_stone", "collect_wood", "defeat_skeleton", "defeat_zombie", "eat_cow",
    "eat_plant", "make_iron_pickaxe", "make_iron_sword", "make_stone_pickaxe",
    "make_stone_sword", "make_wood_pickaxe", "make_wood_sword", "place_furnace",
    "place_plant", "place_stone", "place_table", "wake_up",
)


class CrafterEnv(gym.Env):
    """crafter.Env (old 4-tuple gym API) in the gymnasium 1.x API."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, reward: bool = True, size: int = 64, length: int = 10_000,
                 area: tuple[int, int] = (64, 64), view: tuple[int, int] = (9, 9),
                 seed: int | None = None, render_mode: str | None = None):
        crafter = require("crafter", "crafter", "crafter")
        self._env = crafter.Env(area=area, view=view, size=(size, size), reward=reward,
                                length=length, seed=seed)
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(len(self._env.action_names))
        self.action_names = list(self._env.action_names)
        self._last = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:  # crafter seeds each world from (seed, episode index)
            self._env._seed, self._env._episode = int(seed), 0
        obs = self._env.reset()
        self._last = obs
        return np.asarray(obs, np.uint8), {"achievements": {k: 0 for k in ACHIEVEMENTS}}

    def step(self, action):
        obs, reward, done, info = self._env.step(int(action))
        self._last = obs
        terminated = bool(done) and info["discount"] == 0.0
        truncated = bool(done) and not terminated
        out = {"achievements": dict(info["achievements"]), "discount": info["discount"],
               "inventory": dict(info["inventory"])}
        return np.asarray(obs, np.uint8), float(reward), terminated, truncated, out

    def render(self):
        return self._last


def success_rates(episodes: Iterable[Mapping[str, int]]) -> dict[str, float]:
    """Per-achievement success rates in percent from each episode's final `achievements`
    counts (an achievement succeeds in an episode when its count is >= 1)."""
    episodes = list(episodes)
    if not episodes:
        raise ValueError("success_rates needs at least one episode")
    return {name: 100.0 * sum(1 for ep in episodes if ep.get(name, 0) >= 1) / len(episodes)
            for name in ACHIEVEMENTS}


def crafter_score(rates: Mapping[str, float] | Sequence[float]) -> float:
    """The Crafter score from success rates in percent (all 22 achievements for the
    benchmark's number; a missing achievement in a mapping counts as 0%)."""
    if isinstance(rates, Mapping):
        unknown = set(rates) - set(ACHIEVEMENTS)
        if unknown:
            raise KeyError(f"unknown Crafter achievement(s) {sorted(unknown)}")
        values = [float(rates.get(name, 0.0)) for name in ACHIEVEMENTS]
    else:
        values = [float(v) for v in rates]
    if not values or any(not 0.0 <= v <= 100.0 for v in values):
        raise ValueError("success rates must be percentages in [0, 100]")
    return math.exp(sum(math.log1p(v) for v in values) / len(values)) - 1.0
