"""Tiny deterministic environments for tests."""

import os
import signal

import gymnasium as gym
import numpy as np


class CountEnv(gym.Env):
    """obs = [step index, episode index]; reward = step index; terminates after `length`
    steps (when `terminate`), else runs until a TimeLimit truncates it."""

    def __init__(self, length: int = 3, terminate: bool = True):
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.length, self.terminate = length, terminate
        self.t, self.episode = 0, -1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.episode += 1
        return np.array([self.t, self.episode], np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.terminate and self.t >= self.length
        return np.array([self.t, self.episode], np.float32), float(self.t), done, False, {}


class EchoEnv(gym.Env):
    """obs = [the action just taken (-1 after a reset), step index]; reward = 10 x that
    action; Discrete(3) actions; episodes of `length` steps."""

    def __init__(self, length: int = 5):
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([-1, 0], np.float32), {}

    def step(self, action):
        self.t += 1
        a = int(action)
        return (np.array([a, self.t], np.float32), 10.0 * a, self.t >= self.length, False, {})


def truncating_env():
    return gym.wrappers.TimeLimit(CountEnv(length=100, terminate=False), max_episode_steps=4)


class BrokenEnv(CountEnv):
    """CountEnv with one of the mistakes custom envs make (`mistake`)."""

    def __init__(self, mistake: str = "none"):
        super().__init__(length=5)
        self.mistake = mistake

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        if self.mistake == "reset_without_info":
            return obs
        if self.mistake == "reset_info_none":
            return obs, None
        return (np.zeros(3, np.float32) if self.mistake == "reset_shape" else obs), info

    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        if self.mistake == "four_tuple":
            return obs, reward, term, info
        if self.mistake == "vector_reward":
            reward = np.array([reward, reward])
        if self.mistake == "terminated_none":
            term = None
        if self.mistake == "terminated_two":
            term = 2  # an int flag other than 0 or 1
        if self.mistake == "step_shape":
            obs = np.zeros(3, np.float32)
        if self.mistake == "complex_reward":
            reward = complex(reward, 1.0)
        if self.mistake == "info_none":
            info = None
        if self.mistake == "bool_reward":  # not a mistake: gymnasium takes it (bool is an int)
            reward = self.t % 2 == 0
        return obs, reward, term, trunc, info


class CloseRaisesEnv(CountEnv):
    """CountEnv whose close() raises (a simulator that fails to shut down)."""

    def close(self):
        raise RuntimeError("no close")


class OldResetEnv(CountEnv):
    """CountEnv with the reset(self) of gym < 0.26, which takes no seed."""

    def reset(self):
        return super().reset()


class RenderNoneEnv(CountEnv):
    """CountEnv that takes render_mode="rgb_array" but whose render() draws nothing."""
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode=None):
        super().__init__(length=5)
        self.render_mode = render_mode

    def render(self):
        return None


class NestedEnv(gym.Env):
    """Observations in a Tuple of a nested Dict, a MultiDiscrete and a MultiBinary; actions
    MultiBinary(3). The bits of the observation are the previous action; reward = number of
    action bits equal to the observation's `target` bits."""

    def __init__(self):
        self.observation_space = gym.spaces.Tuple((
            gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32),
                             "inner": gym.spaces.Dict({"mode": gym.spaces.Discrete(3, start=1)})}),
            gym.spaces.MultiDiscrete([[2, 3], [4, 2]]),
            gym.spaces.MultiBinary(3)))
        self.action_space = gym.spaces.MultiBinary(3)
        self.t = 0
        self.last = np.zeros(3, np.int8)

    def _obs(self):
        rng = self.np_random
        return ({"pos": rng.uniform(-1, 1, 2).astype(np.float32),
                 "inner": {"mode": int(rng.integers(1, 4))}},
                np.array([[rng.integers(2), rng.integers(3)], [rng.integers(4), 1]]),
                self.last.copy())

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.last = 0, np.zeros(3, np.int8)
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        self.last = np.asarray(action, np.int8)
        return self._obs(), float(self.last.sum()), False, self.t >= 12, {}


class LaterBrokenEnv(gym.Env):
    """Dict observations {"cam": 16x16x3 uint8, "b": Box(3,)} that fit their space until step
    `at`, then show one `mistake`: "shape" (b has 4 values), "missing_key" (no b) or "dtype"
    (cam as float64 pixels). With at=0 the first observation already has it."""

    def __init__(self, mistake: str = "none", at: int = 3):
        self.observation_space = gym.spaces.Dict({
            "cam": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8),
            "b": gym.spaces.Box(-1, 1, (3,), np.float32)})
        self.action_space = gym.spaces.Discrete(2)
        self.mistake, self.at, self.t = mistake, at, 0

    def _obs(self):
        obs = {"cam": np.full((16, 16, 3), self.t % 255, np.uint8),
               "b": np.zeros(3, np.float32)}
        if self.t >= self.at:
            if self.mistake == "shape":
                obs["b"] = np.zeros(4, np.float32)
            elif self.mistake == "missing_key":
                del obs["b"]
            elif self.mistake == "dtype":
                obs["cam"] = obs["cam"].astype(np.float64)
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, False, self.t >= 50, {}


class ClosedEnv(CountEnv):
    """CountEnv that keeps its instances (class attribute `made`), each with `closed` set by
    close(), as a simulator whose process lives until it is closed; `fail_at` > 0 raises in
    that step of an episode."""
    made: list = []

    def __init__(self, fail_at: int = 0, render_mode=None):
        super().__init__()
        self.fail_at, self.closed, self.render_mode = fail_at, False, render_mode
        type(self).made.append(self)

    def render(self):
        return np.zeros((4, 4, 3), np.uint8) if self.render_mode == "rgb_array" else None

    def step(self, action):
        if self.t + 1 == self.fail_at:
            raise RuntimeError("ClosedEnv: the simulator died")
        return super().step(action)

    def close(self):
        self.closed = True


class SignalOnRenderEnv(CountEnv):
    """CountEnv whose first render() of the process sends the process SIGTERM: a run stopped
    while it writes its end-of-run videos (training renders nothing)."""
    sent = False

    def __init__(self, render_mode=None):
        super().__init__()
        self.render_mode = render_mode

    def render(self):
        if not SignalOnRenderEnv.sent:
            SignalOnRenderEnv.sent = True
            os.kill(os.getpid(), signal.SIGTERM)
        return np.zeros((16, 16, 3), np.uint8)


class SignalAtStepEnv(CountEnv):
    """CountEnv that sends the process SIGTERM at the process's `at`-th step, once: a run
    stopped in the middle of training (`timeout`, a cluster's scheduler, Ctrl-C)."""
    steps = 0

    def __init__(self, at: int = 60):
        super().__init__()
        self.at = at

    def step(self, action):
        SignalAtStepEnv.steps += 1
        if SignalAtStepEnv.steps == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().step(action)


class OneInstanceEnv(CountEnv):
    """CountEnv that can be built once per process (the start-up check), as a simulator whose
    licence allows one instance: the training env's construction raises."""
    made = 0

    def __init__(self):
        type(self).made += 1
        if type(self).made > 1:
            raise RuntimeError("OneInstanceEnv: one instance per process")
        super().__init__()


DICT_ACTIONS = {
    "discrete": lambda: gym.spaces.Dict({
        "move": gym.spaces.Discrete(3, start=1), "grip": gym.spaces.MultiBinary(2),
        "arm": gym.spaces.Tuple((gym.spaces.MultiDiscrete([2, 4]),))}),
    "box": lambda: gym.spaces.Tuple((
        gym.spaces.Box(-2, 2, (2,), np.float32),
        gym.spaces.Dict({"x": gym.spaces.Box(0, 1, (1,), np.float32)}))),
    # leaves in order: gear (discrete), steer (Box), turbo (discrete); the model's action
    # puts the one-hots of gear and turbo first, then steer's two dimensions
    "mixed": lambda: gym.spaces.Dict({
        "gear": gym.spaces.Discrete(3, start=1), "steer": gym.spaces.Box(-2, 2, (2,), np.float32),
        "turbo": gym.spaces.MultiBinary(1)}),
    "gear_steer": lambda: gym.spaces.Dict({"gear": gym.spaces.Discrete(3),
                                           "steer": gym.spaces.Box(-1, 1, (1,), np.float32)}),
}


class DictActionEnv(gym.Env):
    """Actions in a Dict/Tuple space (`kind`: "discrete", all categorical leaves; "box", all
    Box leaves; "mixed", both); refuses any action outside it. Observation: a step counter;
    10-step episodes; reward: the first leaf's first entry."""

    def __init__(self, kind: str = "discrete"):
        self.action_space = DICT_ACTIONS[kind]()
        self.observation_space = gym.spaces.Box(0, 10, (1,), np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        first = (action[0][0] if isinstance(action, tuple) else action["arm"][0][0]
                 if "arm" in action else action["gear"])
        return np.array([self.t], np.float32), float(first), self.t >= 10, False, {}


class GearSteerEnv(DictActionEnv):
    """A bandit with a Dict action of a Discrete and a Box leaf, to learn both: reward per
    step 1[gear == 2] + 1 - |steer - 0.5|, at most 2. The random policy gets ~0.71 (1/3 +
    0.375); one leaf learned alone at most 1.375 (gear; 1.33 steer). Observation: the step
    counter; 10-step episodes, ended by truncation."""

    def __init__(self):
        super().__init__("gear_steer")

    def step(self, action):
        self.t += 1
        reward = float(action["gear"] == 2) + 1.0 - abs(float(action["steer"][0]) - 0.5)
        return np.array([self.t], np.float32), reward, False, self.t >= 10, {}


class FallingReturnsEnv(gym.Env):
    """Episodes of 2 steps whose return falls by 10 each episode: 100, 90, 80, ..."""
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.t, self.episode = 0, -1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.episode = 0, self.episode + 1
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        end = self.t == 2
        return np.zeros(1, np.float32), 100.0 - 10 * self.episode if end else 0.0, end, False, {}


class AchievingEnv(FallingReturnsEnv):
    """FallingReturnsEnv whose episodes end with Crafter's `episode_achievements` info:
    `collect_wood` in every other episode, `place_table` in every third."""

    def step(self, action):
        obs, reward, end, truncated, info = super().step(action)
        if end:
            info = {"episode_achievements": {"collect_wood": int(self.episode % 2 == 0),
                                             "place_table": int(self.episode % 3 == 0)}}
        return obs, reward, end, truncated, info


class SeededReturnEnv(gym.Env):
    """Episodes of 2 steps whose return is drawn from the env's seeded generator at reset,
    whatever the actions: episodes from the same seeds have the same returns."""
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.ret = 0, float(self.np_random.integers(1_000_000))
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        end = self.t == 2
        return np.zeros(1, np.float32), self.ret if end else 0.0, end, False, {}


class DescribedEnv(gym.Env):
    """For `lucid check`: Discrete and MultiDiscrete observations next to a Box one, an action
    Box whose bounds differ per dim; 4-step episodes, episode k paying k x its step index
    (returns 10, 20, ...); the Box observation lies below its bounds at the 3rd step and above
    them at the 5th. `bad_reset` makes the second reset's observation NaN, `nan_reward` the
    reward of that step NaN; rgb_array frames of `channels` channels, once reset."""
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode=None, bad_reset=False, nan_reward=0, channels=3):
        self.observation_space = gym.spaces.Dict({
            "d": gym.spaces.Discrete(3), "m": gym.spaces.MultiDiscrete([2, 3]),
            "v": gym.spaces.Box(-1, 1, (1,), np.float32)})
        self.action_space = gym.spaces.Box(np.zeros(5, np.float32),
                                           np.arange(1, 6, dtype=np.float32))
        self.render_mode, self.bad_reset = render_mode, bad_reset
        self.nan_reward, self.channels = nan_reward, channels
        self.total, self.episodes = 0, 0

    def _obs(self, v):
        return {"d": 1, "m": np.array([1, 2]), "v": np.array([v], np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.episodes = 0, self.episodes + 1
        return self._obs(np.nan if self.bad_reset and self.episodes == 2 else 0.0), {}

    def step(self, action):
        self.t, self.total = self.t + 1, self.total + 1
        v = -2.0 if self.total == 3 else 2.0 if self.total == 5 else 0.5
        reward = np.nan if self.total == self.nan_reward else float(self.episodes * self.t)
        return self._obs(v), reward, self.t == 4, False, {}

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        return np.full((8, 8, self.channels), self.t, np.uint8)  # self.t: made by reset()


class ColorCueEnv(gym.Env):
    """A pixel bandit: each step shows a 16x16 RGB image filled with one of `n` colors,
    drawn uniformly and independently of everything before; the action of the color's index
    pays 1, any other 0. `length`-step episodes, ended by truncation. A policy that does not
    read the image is right with probability exactly 1/n per step, whatever it does (the cue
    is independent of the past and of the step counter): an expected return of length / n."""
    COLORS = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0]], np.uint8)

    def __init__(self, n: int = 3, length: int = 10):
        assert 2 <= n <= len(self.COLORS)
        self.observation_space = gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)
        self.action_space = gym.spaces.Discrete(n)
        self.n, self.length, self.t, self.cue = n, length, 0, 0

    def _obs(self):
        self.cue = int(self.np_random.integers(self.n))
        return np.broadcast_to(self.COLORS[self.cue], (16, 16, 3)).copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        reward = float(int(action) == self.cue)
        return self._obs(), reward, False, self.t >= self.length, {}
