"""Crafter achievements during training: the final-info wrapper and the tracker that turns
finished episodes into the Crafter score and per-achievement success rates."""

import gymnasium as gym
import numpy as np
import pytest

from lucid.envs import env_fn, make_env
from lucid.envs.crafter import (ACHIEVEMENTS, AchievementTracker, EpisodeAchievements,
                                crafter_score, success_rates)
from lucid.runner import restarting

HAND_WORKED = [{"collect_wood": 2, "place_table": 1}, {"collect_wood": 1}, {},
               {"collect_wood": 1, "wake_up": 1, "eat_cow": 0}]


def test_tracker_matches_the_hand_worked_score_and_rates():
    tracker = AchievementTracker(window=2)
    assert tracker.metrics() == {}  # nothing logged before the first episode ends
    for recent in (False, True):
        with pytest.raises(ValueError, match="no Crafter episode"):
            tracker.rates(recent=recent)
    for ep in HAND_WORKED:
        tracker.add(ep)
    m = tracker.metrics()
    assert m["crafter/episodes"] == 4
    assert m["crafter/success/collect_wood"] == 75.0
    assert m["crafter/success/place_table"] == 25.0 and m["crafter/success/wake_up"] == 25.0
    assert m["crafter/success/eat_cow"] == 0.0
    assert sum(k.startswith("crafter/success/") for k in m) == 22
    # exp((ln 76 + 2 ln 26) / 22) - 1, as in tests/test_envs.py
    assert m["crafter/score"] == pytest.approx(0.637289, abs=1e-5)
    # the window holds the last two episodes: collect_wood 50%, wake_up 50%
    assert m["crafter/score_recent"] == pytest.approx(np.exp(2 * np.log(51) / 22) - 1)
    assert tracker.rates() == success_rates(HAND_WORKED)
    with pytest.raises(KeyError):
        tracker.add({"collect_gold": 1})


def test_tracker_reads_single_and_vector_infos_and_ignores_the_rest():
    tracker = AchievementTracker()
    assert tracker.update({}) == 0 and tracker.update({"achievements": {"collect_wood": 1}}) == 0
    assert tracker.update({"episode_achievements": {"collect_wood": 3}}) == 1  # one env
    # a 3-env vector info in which envs 0 and 2 finished; env 1's numbers are stale fill
    vec = {"episode_achievements": {"collect_wood": np.array([0, 5, 1]),
                                    "wake_up": np.array([1, 1, 0]),
                                    "_collect_wood": np.array([True, False, True]),
                                    "_wake_up": np.array([True, False, True])},
           "_episode_achievements": np.array([True, False, True])}
    assert tracker.update(vec) == 2
    assert tracker.episodes == 3
    assert tracker.rates()["collect_wood"] == pytest.approx(200 / 3)
    assert tracker.rates()["wake_up"] == pytest.approx(100 / 3)


def test_tracker_state_survives_a_resume():
    tracker = AchievementTracker(window=3)
    for ep in HAND_WORKED:
        tracker.add(ep)
    again = AchievementTracker(window=3)
    again.load_state_dict(tracker.state_dict())
    assert again.metrics() == tracker.metrics()
    for ep in HAND_WORKED[:2]:  # and goes on with the same window of 3 recent episodes
        tracker.add(ep)
        again.add(ep)
    assert again.metrics() == tracker.metrics()
    assert len(again.recent) == 3


class _Ends(gym.Env):
    """Counts up an achievement each step and terminates after 3 steps."""
    observation_space = gym.spaces.Discrete(1)
    action_space = gym.spaces.Discrete(1)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return 0, {"achievements": {name: 0 for name in ACHIEVEMENTS}}

    def step(self, action):
        self.t += 1
        info = {"achievements": {name: 0 for name in ACHIEVEMENTS}}
        info["achievements"]["collect_wood"] = self.t
        return 0, 0.0, self.t == 3, False, info


def test_wrapper_reports_the_final_counts_on_terminations_only_at_the_end():
    env = EpisodeAchievements(_Ends())
    env.reset()
    for t in range(3):
        *_, term, trunc, info = env.step(0)
        assert ("episode_achievements" in info) == (t == 2)
    assert term and info["episode_achievements"]["collect_wood"] == 3


def test_real_crafter_episodes_through_the_runners_vector_env():
    """The way lucid.runner steps envs (Restarting wrapper, SyncVectorEnv, next-step
    autoreset): the tracker counts exactly the episodes that ended, with their final counts,
    for the env's own length limit and for an outer TimeLimit."""
    fns = [restarting(env_fn("crafter", None, length=12), 3),      # crafter's own limit
           restarting(env_fn("crafter", 9, length=10_000), 3)]     # TimeLimit(9) outside
    envs = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    envs.action_space.seed(0)
    envs.reset(seed=3)
    tracker, expected, ended = AchievementTracker(), [], 0
    for _ in range(13):
        _, _, term, trunc, info = envs.step(envs.action_space.sample())
        done = term | trunc
        ended += int(done.sum())
        for i in np.flatnonzero(done):  # the final counts, read off the running counts
            expected.append({k: int(v[i]) for k, v in info["achievements"].items()
                             if not k.startswith("_")})
        assert tracker.update(info) == int(done.sum())
    envs.close()
    assert ended == 2 and tracker.episodes == 2  # env 1 at step 9, env 0 at step 12
    assert tracker.rates() == success_rates(expected)
    score = crafter_score(success_rates(expected))
    assert tracker.metrics()["crafter/score"] == pytest.approx(score)


def test_only_crafter_gets_the_wrapper():
    assert isinstance(make_env("crafter", length=5), EpisodeAchievements)
    assert not isinstance(make_env("CartPole-v1"), EpisodeAchievements)
