"""Crafter (Hafner 2021) as a gymnasium env, and the Crafter score.

`crafter` (or `crafter:reward`): 64x64x3 uint8 images, 17 discrete actions, reward for
unlocking achievements and for health changes, episodes of at most 10,000 steps (reported as a
truncation; the player's death is a termination). `crafter:noreward` gives zero rewards.
`info["achievements"]` holds the running count of every achievement in the episode.

The Crafter score (Hafner 2021, Eq. 1): S = exp(mean_i ln(1 + s_i)) - 1, where s_i in
[0, 100] is the success rate in percent of achievement i, i.e. the share of episodes in
which it was unlocked at least once, over all 22 achievements.

During training: `EpisodeAchievements` (applied by `make_env("crafter")`) puts the episode's
final achievement counts into the info of the step that ends it, as
`info["episode_achievements"]`; `AchievementTracker.update(info)` takes single-env or
vector-env infos and `metrics()` gives the Crafter score and the success rates for the log.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Iterable, Mapping, Sequence

import gymnasium as gym
import numpy as np

from . import env_info
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


# --------------------------------------------------------------------------- logging in training

EPISODE_KEY = "episode_achievements"


class EpisodeAchievements(gym.Wrapper):
    """Adds `info["episode_achievements"]` ({name: count} for all 22 achievements, the
    episode's final counts) to the info of the step that ends an episode, by termination or
    truncation, and to no other step. It must sit outside any TimeLimit so that it sees
    time-limit ends too (`make_env` puts it outermost). In a gymnasium vector env the key
    arrives as a dict of per-env arrays with the mask `info["_episode_achievements"]`."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            counts = info.get("achievements", {})
            info = dict(info)
            info[EPISODE_KEY] = {name: int(counts.get(name, 0)) for name in ACHIEVEMENTS}
        return obs, reward, terminated, truncated, info


class AchievementTracker:
    """Success rates and the Crafter score of the episodes seen so far, for the training log.

    `update(info)` reads the finished episodes out of one step's info: a single env's info
    (with `episode_achievements` a {name: count} dict) or a gymnasium vector env's info (a
    dict of per-env arrays with the `_episode_achievements` mask). Infos without the key
    (other envs, steps that end no episode) are ignored, so the tracker can be fed every
    step of any env. `metrics()` gives, once an episode has ended:

        crafter/score          Crafter score over all episodes so far (the benchmark's number)
        crafter/score_recent   the same over the last `window` episodes
        crafter/episodes       episodes counted
        crafter/success/NAME   success rate of each achievement in percent, all episodes

    and {} before that. `state_dict()` / `load_state_dict()` carry it across a resume.
    """

    def __init__(self, window: int = 100, prefix: str = "crafter/"):
        self.window, self.prefix = int(window), prefix
        self.episodes = 0
        self.successes = {name: 0 for name in ACHIEVEMENTS}
        self.recent: deque[tuple[str, ...]] = deque(maxlen=self.window)

    def add(self, achievements: Mapping[str, Any]) -> None:
        """Count one finished episode from its final achievement counts."""
        unknown = set(achievements) - set(ACHIEVEMENTS)
        if unknown:
            raise KeyError(f"unknown Crafter achievement(s) {sorted(unknown)}")
        done = tuple(name for name in ACHIEVEMENTS if int(achievements.get(name, 0)) >= 1)
        self.episodes += 1
        for name in done:
            self.successes[name] += 1
        self.recent.append(done)

    def update(self, info: Mapping[str, Any]) -> int:
        """Count the episodes that ended in this step's info; returns how many."""
        eps = info.get(EPISODE_KEY) if info else None
        if not eps:
            return 0
        mask = info.get("_" + EPISODE_KEY)
        if mask is None:  # a single env's info: one finished episode
            self.add(eps)
            return 1
        added = 0
        for i in np.flatnonzero(np.asarray(mask, bool)):
            self.add(env_info(info, i)[EPISODE_KEY])
            added += 1
        return added

    def rates(self, recent: bool = False) -> dict[str, float]:
        """Success rates in percent over all counted episodes (or the last `window`)."""
        if recent:
            n = len(self.recent)
            hits = {name: 0 for name in ACHIEVEMENTS}
            for done in self.recent:
                for name in done:
                    hits[name] += 1
        else:
            n, hits = self.episodes, self.successes
        if not n:
            raise ValueError("no Crafter episode has ended yet")
        return {name: 100.0 * hits[name] / n for name in ACHIEVEMENTS}

    def metrics(self) -> dict[str, float]:
        if not self.episodes:
            return {}
        p = self.prefix
        rates = self.rates()
        out = {f"{p}score": crafter_score(rates),
               f"{p}score_recent": crafter_score(self.rates(recent=True)),
               f"{p}episodes": self.episodes}
        out.update({f"{p}success/{name}": rate for name, rate in rates.items()})
        return out

    def state_dict(self) -> dict:
        return {"episodes": self.episodes, "successes": dict(self.successes),
                "recent": [list(done) for done in self.recent]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.episodes = int(state["episodes"])
        self.successes = {name: int(state["successes"].get(name, 0)) for name in ACHIEVEMENTS}
        self.recent = deque((tuple(d) for d in state["recent"]), maxlen=self.window)
