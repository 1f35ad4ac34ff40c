"""Environment suites: names, the paper's preprocessing, spaces, time limits, extras.

Each wrapper is checked against stepping the raw environment by hand. MuJoCo renders headless
through EGL (MUJOCO_GL is set before anything imports mujoco).
"""

import os

os.environ.setdefault("MUJOCO_GL", "egl")

import math  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import cv2  # noqa: E402
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from lucid.envs import (ActionSpec, MissingExtraError, ObsSpec, UnknownEnvError,  # noqa: E402
                        default_preset, env_fn, make_env)
from lucid.envs.crafter import ACHIEVEMENTS, crafter_score, success_rates  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _find(env, cls):
    """The wrapper of type `cls` in env's chain, or None."""
    while True:
        if isinstance(env, cls):
            return env
        if not hasattr(env, "env"):
            return None
        env = env.env


class AleSpy:
    """Stands in for an env's ALEInterface and records the action of every emulator frame
    (as an index into the env's action set)."""

    def __init__(self, env):
        self.base = env.unwrapped
        self.real = self.base.ale
        self.index = {a: i for i, a in enumerate(self.base._action_set)}
        self.actions = []
        self.base.ale = self  # AtariPreprocessing.ale reads env.unwrapped.ale

    def act(self, action, *args):
        self.actions.append(self.index[action])
        return self.real.act(action, *args)

    def __getattr__(self, name):
        return getattr(self.real, name)


# --------------------------------------------------------------------------- names, presets

def test_default_preset_maps_env_names_to_the_paper_domains():
    assert default_preset("CartPole-v1") == "default"
    assert default_preset("Pendulum-v1") == "default"
    assert default_preset("atari:Pong") == "atari"
    assert default_preset("atari100k:Breakout") == "atari100k"
    assert default_preset("dmc:walker-walk") == "dmc-proprio"
    assert default_preset("dmc-vision:cartpole-swingup") == "dmc-vision"
    assert default_preset("crafter") == "crafter"
    assert default_preset("crafter:noreward") == "crafter"
    assert default_preset("envpool:Pong-v5") == "atari"
    assert default_preset("minigrid:DoorKey-5x5") == "default"
    assert default_preset("examples.custom_env:MyEnv") == "default"
    from lucid.config import PRESETS
    for name in ("atari:Pong", "atari100k:Pong", "dmc:walker-walk", "dmc-vision:walker-walk",
                 "crafter", "minigrid:Empty-5x5", "memory-maze:9x9", "CartPole-v1"):
        assert default_preset(name) in PRESETS


def test_unknown_names_get_suggestions(monkeypatch):
    with pytest.raises(ValueError, match="Pong"):
        make_env("atari:Pongg")
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # examples/ is found from the root
    with pytest.raises(UnknownEnvError, match=r"did you mean examples\.custom_env:MyEnv\?"):
        make_env("examples.custom_env.MyEnv")
    with pytest.raises(ValueError, match="walker-walk"):
        make_env("dmc:walker-wlk")
    with pytest.raises(ValueError, match="DoorKey-5x5"):
        make_env("minigrid:DoorKey-5x6")
    with pytest.raises(UnknownEnvError, match="names no task"):
        make_env("atari:")
    with pytest.raises(TypeError, match="unknown Atari option"):
        make_env("atari:Pong", grey=True)
    with pytest.raises(TypeError, match=r"unknown DMC option\(s\) \['color'\]; options: "):
        make_env("dmc:walker-walk", color=True)
    with pytest.raises(ValueError, match="obs must be 'flat' or 'dict', got 'list'"):
        make_env("dmc:walker-walk", obs="list")
    with pytest.raises(ValueError, match="'10x10'; choose one of 9x9, 11x11, 13x13, 15x15"):
        make_env("memory-maze:10x10")
    with pytest.raises(TypeError, match=r"unknown Memory Maze option\(s\) \['gray'\]"):
        make_env("memory-maze:9x9", gray=True)
    with pytest.raises(TypeError, match=r"unknown Crafter option\(s\) \['gray'\]; options: "):
        make_env("crafter", gray=True)
    with pytest.raises(UnknownEnvError, match="unknown Crafter variant 'rewards'"):
        make_env("crafter:rewards")
    # another version of the same gymnasium env first (not tabular/CliffWalking-v0)
    with pytest.raises(UnknownEnvError, match=r"did you mean CliffWalking-v1\?"):
        make_env("CliffWalking-v0")
    with pytest.raises(UnknownEnvError, match=r"did you mean CartPole-v1"):
        make_env("CartPol-v1")


def test_a_suite_prefix_without_a_task_is_told_with_an_example_of_its_own():
    """`dmc:` names no task: the error gives one of the suite's tasks; `crafter:` needs none.
    default_preset gives the default preset for an id it cannot parse and for envpool's ids
    that are not Atari's."""
    with pytest.raises(UnknownEnvError, match="'dmc:' names no task; e.g. dmc:walker-walk$"):
        make_env("dmc:")
    assert default_preset("crafter:") == "crafter"
    assert default_preset("atari:") == "default"
    assert default_preset("envpool:CartPole-v1") == "default"
    assert default_preset("envpool:Hopper-v5") == "default"  # MuJoCo's, not Atari's


def test_a_registered_env_that_needs_a_missing_module_names_it():
    import gymnasium as gym
    gym.register("LucidTestNeedsAModule-v0", entry_point="no_such_pkg_for_lucid.envs:Env")
    try:
        with pytest.raises(ImportError, match="LucidTestNeedsAModule-v0 needs the package "
                                              r"'no_such_pkg_for_lucid'.*\(pip install "
                                              r"no_such_pkg_for_lucid\)"):
            make_env("LucidTestNeedsAModule-v0")
    finally:
        del gym.registry["LucidTestNeedsAModule-v0"]


def test_images_whose_sides_16_does_not_divide_are_images_too():
    import gymnasium as gym
    spec = ObsSpec.from_space(gym.spaces.Dict({"cam": gym.spaces.Box(0, 255, (84, 84, 3),
                                                                     np.uint8)}))
    assert spec.images == {"cam": (84, 84, 3)}


def test_env_fn_is_picklable_for_async_vector_envs():
    import pickle
    fn = pickle.loads(pickle.dumps(env_fn("atari100k:Pong", 5, gray=True)))
    env = fn()
    assert env.observation_space.shape == (64, 64, 1)
    env.reset(seed=0)
    for t in range(5):
        *_, trunc, _ = env.step(0)
    assert trunc  # max_episode_steps=5 went through
    env.close()


def test_env_info_takes_one_envs_entries_of_a_vector_info():
    """A gymnasium vector env's info holds each key as an array over the envs with a `_key`
    mask of the envs that set it: env i's info holds the keys its mask marks, as Python
    scalars, nested dicts alike."""
    from lucid.envs import env_info
    info = {"score": np.array([1.5, 0.0, 2.0]), "_score": np.array([True, False, True]),
            "final": {"x": np.array([1, 2, 3]), "_x": np.array([False, True, True])},
            "_final": np.array([True, True, False])}
    assert env_info(info, 0) == {"score": 1.5, "final": {}}
    assert env_info(info, 1) == {"final": {"x": 2}}
    assert env_info(info, 2) == {"score": 2.0}
    assert type(env_info(info, 0)["score"]) is float
    assert type(env_info(info, 1)["final"]["x"]) is int


# --------------------------------------------------------------------------- Atari

def test_atari_spaces_and_settings_of_both_benchmarks():
    env = make_env("atari:Pong")
    assert env.observation_space == gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    assert env.action_space.n == 18  # full action set
    pre = _find(env, gym.wrappers.AtariPreprocessing)
    assert pre.frame_skip == 4 and pre.noops == 0 and not pre.terminal_on_life_loss
    assert pre.noop_max == 0  # gymnasium's own no-ops (1 to noop_max) are never used
    assert pre.sticky == 0.25
    assert env.unwrapped.ale.getInt("max_num_frames_per_episode") == 108_000
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == 0.0  # ours, per frame
    obs, _ = env.reset(seed=0)
    assert obs.shape == (64, 64, 3) and obs.dtype == np.uint8 and obs.std() > 0
    env.close()

    env = make_env("atari100k:Pong")
    assert env.action_space.n == 6  # minimal action set
    assert _find(env, gym.wrappers.AtariPreprocessing).sticky == 0.0
    assert _find(env, gym.wrappers.AtariPreprocessing).noops == 30
    assert _find(env, gym.wrappers.AtariPreprocessing).noop_max == 0
    env.close()

    env = make_env("atari:Pong", gray=True)
    assert env.observation_space.shape == (64, 64, 1)
    assert env.reset(seed=0)[0].shape == (64, 64, 1)
    env.close()


def test_atari_game_names_map_to_the_ale_ids():
    from lucid.envs.atari import game_id
    assert game_id("Pong") == game_id("pong") == "ALE/Pong-v5"
    assert game_id("space_invaders") == game_id("SpaceInvaders") == "ALE/SpaceInvaders-v5"
    assert game_id("ALE/Breakout-v5") == "ALE/Breakout-v5"
    env = make_env("atari:space_invaders")
    assert env.unwrapped.spec.id == "ALE/SpaceInvaders-v5"
    env.close()


def test_atari_render_mode_draws_the_full_color_screen_for_videos():
    """render_mode="rgb_array" reaches the ALE env: render() (the videos' frames) is the
    emulator's current 210x160 RGB screen, also when the observations are 64x64 grayscale."""
    env = make_env("atari:Pong", render_mode="rgb_array", gray=True, sticky=0.0)
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        obs, *_ = env.step(0)
    frame = env.render()
    assert obs.shape == (64, 64, 1)
    assert frame.shape == (210, 160, 3) and frame.dtype == np.uint8 and frame.std() > 0
    assert np.array_equal(frame, env.unwrapped.ale.getScreenRGB())
    env.close()


def test_an_ale_id_is_made_in_a_process_that_has_not_imported_ale_py():
    """gymnasium's own `ALE/Pong-v5` needs no `import ale_py` first: make_env registers the
    ALE's envs (checked in a fresh process, as this one has imported ale_py)."""
    import subprocess
    code = ("import sys; from lucid.envs import make_env; assert 'ale_py' not in sys.modules; "
            "print(*make_env('ALE/Pong-v5').observation_space.shape)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, cwd=REPO)
    assert r.returncode == 0 and r.stdout.split() == ["210", "160", "3"], r.stderr[-2000:]


@pytest.mark.parametrize("gray", [False, True])
def test_atari_repeat_and_max_pool_match_stepping_the_raw_emulator(gray):
    import ale_py
    gym.register_envs(ale_py)
    raw = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0,
                   full_action_space=True, obs_type="grayscale" if gray else "rgb")
    env = make_env("atari:Pong", sticky=0.0, gray=gray)
    spy = AleSpy(env)

    def shrink(frame):
        out = cv2.resize(frame, (64, 64), interpolation=cv2.INTER_AREA)
        return out[..., None] if gray else out

    obs, _ = env.reset(seed=3)
    frame, _ = raw.reset(seed=3)
    assert np.array_equal(obs, shrink(frame))
    rng = np.random.default_rng(0)
    pooled_differs = 0
    total_env, total_raw, early_reward = 0.0, 0.0, 0
    for t in range(480):  # 13 points; the first not on a step's last frame at t=465
        action = int(rng.integers(18))
        frames, reward = [], 0.0
        for i in range(4):
            frame, r, term, trunc, _ = raw.step(action)
            frames.append(frame)
            reward += r
            early_reward += i < 3 and r != 0  # the step's reward is not its last frame's
        n_before = len(spy.actions)
        obs, r_env, term_env, trunc_env, _ = env.step(action)
        assert len(spy.actions) - n_before == 4 and spy.actions[-4:] == [action] * 4
        expected = shrink(np.maximum(frames[-2], frames[-1]))
        assert np.array_equal(obs, expected), f"step {t}"
        pooled_differs += not np.array_equal(expected, shrink(frames[-1]))
        assert r_env == reward and (term_env, trunc_env) == (term, trunc)
        total_env += r_env
        total_raw += reward
    assert pooled_differs > 0  # the max over two frames mattered (moving ball)
    assert total_env == total_raw and early_reward > 0  # rewards of all 4 frames (a point)
    env.close()
    raw.close()


def test_atari_sticky_actions_repeat_the_previous_frame_action_a_quarter_of_the_time():
    env = make_env("atari:Pong")
    spy = AleSpy(env)
    env.reset(seed=1)
    asked = []
    for t in range(500):  # 2000 emulator frames; the agent alternates two actions
        a = 2 + t % 2
        env.step(a)
        asked += [a] * 4
    done = spy.actions[-len(asked):]
    changes = [i for i in range(1, len(asked)) if asked[i] != done[i - 1]]
    stuck = sum(done[i] == done[i - 1] for i in changes)
    rate = stuck / len(changes)
    # binomial, n >= 500 changes: std <= 0.02
    assert 0.19 < rate < 0.31, rate
    assert all(done[i] in (asked[i], done[i - 1]) for i in range(1, len(asked)))
    env.close()

    env = make_env("atari100k:Pong")
    spy = AleSpy(env)
    env.reset(seed=1)
    n0 = len(spy.actions)
    for t in range(100):
        env.step(2 + t % 2)
    assert spy.actions[n0:] == [2 + t % 2 for t in range(100) for _ in range(4)]  # never sticky
    # a reset makes NOOP the previous action again (sticky=1 would repeat it for ever)
    _find(env, gym.wrappers.AtariPreprocessing).sticky = 1.0
    env.reset(seed=2)
    n0 = len(spy.actions)
    env.step(2)
    assert spy.actions[n0:] == [0] * 4
    env.close()


def test_atari_sticky_draws_come_from_the_seeded_env_so_a_seed_repeats_them():
    """The sticky-action draws use the env's seeded generator: two envs reset with the same
    seed execute the same emulator actions for the same agent actions, another seed gives
    other sticky frames."""
    def executed(seed):
        env = make_env("atari:Pong")
        spy = AleSpy(env)
        env.reset(seed=seed)
        n0 = len(spy.actions)
        for t in range(100):  # 400 emulator frames, ~100 of them sticky
            env.step(2 + t % 2)
        env.close()
        return spy.actions[n0:]

    first = executed(11)
    assert executed(11) == first
    assert executed(12) != first


def test_atari_sticky_must_be_a_probability_and_1_always_repeats_the_noop():
    """`sticky` is checked to lie in [0, 1]; 1.0 is allowed and repeats the action before
    the first step, NOOP, on every emulator frame."""
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="sticky"):
            make_env("atari:Pong", sticky=bad)
    env = make_env("atari:Pong", sticky=1.0)
    spy = AleSpy(env)
    env.reset(seed=0)
    n0 = len(spy.actions)
    for t in range(5):
        env.step(2 + t % 2)
    assert spy.actions[n0:] == [0] * 20
    env.close()


def _noops_at_resets(env, resets: int) -> list[int]:
    spy = AleSpy(env)
    counts = []
    for _ in range(resets):
        n0 = len(spy.actions)
        env.reset()
        counts.append(len(spy.actions) - n0)
        assert set(spy.actions[n0:]) <= {0}  # NOOP frames only
    return counts


def test_atari100k_takes_0_to_29_noops_at_reset_as_the_authors_randint_30():
    """The authors' Atari env takes `randint(noops)` NOOP frames after a reset, 0 to 29 for
    Atari100k's noops=30 (gymnasium's noop_max=30 would take 1 to 30). Over 300 resets every
    count from 0 to 29 appears and none outside; the draws follow the env's seed."""
    env = make_env("atari100k:Pong")
    env.reset(seed=0)
    counts = _noops_at_resets(env, 300)
    assert sorted(set(counts)) == list(range(30)), sorted(set(counts))
    assert 10 < np.mean(counts) < 19  # uniform over 0..29: mean 14.5, sd of the mean 0.5
    env.reset(seed=0)
    assert _noops_at_resets(env, 20) == counts[:20]
    env.close()
    env = make_env("atari100k:Pong", noops=1)  # randint(1): no no-ops at all
    assert _noops_at_resets(env, 5) == [0] * 5
    env.close()


def test_atari_frame_limit_truncates_and_the_last_observation_is_the_final_screen():
    import ale_py
    gym.register_envs(ale_py)
    raw = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0,
                   full_action_space=True, max_num_frames_per_episode=402)
    env = make_env("atari:Pong", max_frames=402, sticky=0.0)
    env.reset(seed=0)
    raw.reset(seed=0)
    for t in range(101):
        previous = obs if t else None
        obs, _, term, trunc, info = env.step(3)
        frames = []
        for _ in range(4):
            frame, _, raw_term, raw_trunc, _ = raw.step(3)
            frames.append(frame)
            if raw_term or raw_trunc:
                break
        assert not term and trunc == (t == 100)
    # 402 frames: the episode ends on the 2nd frame of the 101st agent step
    assert info["episode_frame_number"] == 402 and raw_trunc and len(frames) == 2
    want = cv2.resize(np.maximum(frames[0], frames[1]), (64, 64), interpolation=cv2.INTER_AREA)
    assert np.array_equal(obs, want) and not np.array_equal(obs, previous)
    env.close()
    raw.close()
    assert make_env("atari:Pong").unwrapped.ale.getInt("max_num_frames_per_episode") == 108_000
    # Breakout has 5 lives: losing one is no episode end without the life-loss signal.
    # Breakout has 5 lives: losing one is no episode end without the life-loss signal.
    env = make_env("atari:Breakout", sticky=0.0)
    env.reset(seed=0)
    lives, lost_without_end = env.unwrapped.ale.lives(), False
    assert lives == 5
    for _ in range(600):
        _, _, term, trunc, _ = env.step(1)  # FIRE in place: the ball is soon missed
        now = env.unwrapped.ale.lives()
        if now < lives:
            lost_without_end = not (term or trunc)
            break
    assert lost_without_end
    env.close()


def test_an_episode_that_ends_on_a_steps_first_or_second_frame_shows_its_final_screen():
    """The frame limit falls on the 1st (101 frames) or the 2nd (102) emulator frame of an
    agent step, while the paddle and the ball move: the last observation is the final screen
    alone, not pooled with a frame of the previous agent step."""
    import ale_py
    gym.register_envs(ale_py)

    def shrink(frame):
        return cv2.resize(frame, (64, 64), interpolation=cv2.INTER_AREA)

    for max_frames in (101, 102):
        raw = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0,
                       full_action_space=True, max_num_frames_per_episode=max_frames)
        env = make_env("atari:Pong", max_frames=max_frames, sticky=0.0)
        env.reset(seed=0)
        raw.reset(seed=0)
        frames, t, done = [], 0, False
        while not done:
            action = 3 if t % 8 < 4 else 4  # up and down
            obs, _, term, trunc, _ = env.step(action)
            done, t = term or trunc, t + 1
            for _ in range(4):
                frame, _, raw_term, raw_trunc, _ = raw.step(action)
                frames.append(frame)
                if raw_term or raw_trunc:
                    break
        assert trunc and len(frames) == max_frames and t == 26
        assert np.array_equal(obs, shrink(frames[-1]))
        earlier = frames[-2 - max_frames % 4]  # the previous step's second-to-last frame
        assert not np.array_equal(shrink(np.maximum(earlier, frames[-1])), obs)
        env.close()
        raw.close()


def test_atari_life_loss_option_ends_the_episode_where_a_life_is_lost():
    """life_loss=True: the agent step in which the game takes one of Breakout's 5 lives is a
    termination (by default, tested above, it ends nothing), and no step before it."""
    env = make_env("atari:Breakout", sticky=0.0, life_loss=True)
    env.reset(seed=0)
    ale = env.unwrapped.ale
    lives = ale.lives()
    for _ in range(600):
        _, _, term, trunc, _ = env.step(1)  # FIRE in place: the ball is soon missed
        if ale.lives() < lives:
            break
        assert not (term or trunc)
    assert ale.lives() == lives - 1 and not ale.game_over()
    assert term and not trunc
    env.close()


# --------------------------------------------------------------------------- DMC

def test_dmc_proprio_action_repeat_matches_raw_dm_control_and_time_limit():
    from dm_control import suite
    raw = suite.load("walker", "walk", task_kwargs={"random": 5})
    env = make_env("dmc:walker-walk")
    assert env.observation_space == gym.spaces.Box(-np.inf, np.inf, (24,), np.float32)
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
    obs, _ = env.reset(seed=5)
    ts = raw.reset()

    def flat(o):
        return np.concatenate([np.asarray(v, np.float32).ravel() for v in o.values()])

    assert obs.dtype == np.float32 and np.array_equal(obs, flat(ts.observation))
    rng = np.random.default_rng(0)
    for t in range(500):
        a = rng.uniform(-1, 1, 6).astype(np.float32)
        obs, r, term, trunc, _ = env.step(a)
        reward = 0.0
        for _ in range(2):
            ts = raw.step(a)
            reward += ts.reward
        if t < 20:
            assert np.allclose(obs, flat(ts.observation)) and math.isclose(r, reward)
        if t < 499:
            assert not (term or trunc)
    assert trunc and not term  # 1000 control steps = 500 agent steps, a time limit
    with pytest.raises(RuntimeError, match="reset"):
        env.step(a)
    env.close()

    env = make_env("dmc:walker-walk", obs="dict")
    assert set(env.observation_space.spaces) == {"orientations", "height", "velocity"}
    assert env.observation_space["height"].shape == (1,)
    spec = ObsSpec.from_space(env.observation_space)
    assert spec.vector_dim == 24
    obs, _ = env.reset(seed=0)
    assert all(v.dtype == np.float32 for v in obs.values())


def test_dm_env_adapter_terminations_truncations_and_repeat_stop_early():
    import dm_env
    from dm_env import specs

    from lucid.envs.dmc import DMEnv

    class Fake(dm_env.Environment):
        def __init__(self, end, discount):
            self.t, self.end, self.discount = 0, end, discount

        def reset(self):
            self.t = 0
            return dm_env.restart({"x": np.zeros(2), "y": np.float64(0.0)})

        def step(self, action):
            self.t += 1
            obs = {"x": np.full(2, self.t, np.float64), "y": np.float64(-self.t)}
            if self.t == self.end:
                return dm_env.termination(1.0, obs) if self.discount == 0 else \
                    dm_env.truncation(1.0, obs)
            return dm_env.transition(1.0, obs)

        def observation_spec(self):
            return {"x": specs.Array((2,), np.float64), "y": specs.Array((), np.float64)}

        def action_spec(self):
            return specs.BoundedArray((1,), np.float64, -2.0, 2.0)

    for discount, want in ((0.0, (True, False)), (1.0, (False, True))):
        env = DMEnv(lambda seed: Fake(3, discount), repeat=2)
        assert env.action_space == gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
        obs, _ = env.reset()
        assert obs.shape == (3,) and obs.dtype == np.float32
        obs, r, term, trunc, _ = env.step(np.zeros(1))
        assert r == 2.0 and (term, trunc) == (False, False) and obs.tolist() == [2, 2, -2]
        obs, r, term, trunc, info = env.step(np.zeros(1))
        assert r == 1.0 and (term, trunc) == want and obs.tolist() == [3, 3, -3]
        assert info["discount"] == discount


def test_dm_env_adapter_maps_single_array_specs_and_a_last_step_without_discount():
    """An env whose observation is one array rather than a dict: a DiscreteArray becomes a
    Discrete space with int observations, an unbounded uint8 Array a 0..255 uint8 Box; a
    DiscreteArray action spec a Discrete action space. A LAST step whose discount is None is
    not a discount-0 end, so it is a truncation."""
    import dm_env
    from dm_env import specs

    from lucid.envs.dmc import DMEnv

    class Single(dm_env.Environment):
        def __init__(self, spec):
            self.spec, self.t = spec, 0

        def _obs(self):
            if isinstance(self.spec, specs.DiscreteArray):
                return np.int32(self.t % 5)
            return np.full(self.spec.shape, 10 * self.t, np.uint8)

        def reset(self):
            self.t = 0
            return dm_env.restart(self._obs())

        def step(self, action):
            self.t += 1
            if self.t == 3:
                return dm_env.TimeStep(dm_env.StepType.LAST, 0.5, None, self._obs())
            return dm_env.transition(0.5, self._obs())

        def observation_spec(self):
            return self.spec

        def action_spec(self):
            return specs.DiscreteArray(4)

    env = DMEnv(lambda seed: Single(specs.DiscreteArray(5)))
    assert env.observation_space == gym.spaces.Discrete(5)
    assert env.action_space == gym.spaces.Discrete(4)
    obs, _ = env.reset()
    assert obs == 0 and type(obs) is int
    obs, r, term, trunc, _ = env.step(1)
    assert obs == 1 and type(obs) is int and r == 0.5 and not (term or trunc)

    env = DMEnv(lambda seed: Single(specs.Array((2, 3), np.uint8)), repeat=2)
    assert env.observation_space == gym.spaces.Box(0, 255, (2, 3), np.uint8)
    obs, _ = env.reset()
    assert obs.dtype == np.uint8 and obs.shape == (2, 3)
    obs, r, term, trunc, info = env.step(0)
    assert r == 1.0 and obs.dtype == np.uint8 and (obs == 20).all()
    obs, r, term, trunc, info = env.step(0)  # the LAST step without a discount
    assert r == 0.5 and (term, trunc) == (False, True) and info["discount"] == 1.0


def test_dmc_pixels_render_headless_with_egl_when_mujoco_gl_is_unset():
    """With MUJOCO_GL unset, making a DMC env sets it (and PyOpenGL's platform) to egl
    before mujoco is imported, and the 64x64 pixels render (checked in a fresh process, as
    this module sets MUJOCO_GL itself)."""
    import subprocess
    code = ("import os; from lucid.envs import make_env; "
            "env = make_env('dmc-vision:cartpole-swingup', fast_render=True); "
            "obs, _ = env.reset(seed=0); "
            "print(os.environ['MUJOCO_GL'], os.environ['PYOPENGL_PLATFORM'], obs.shape, "
            "obs.std() > 1)")
    environ = {k: v for k, v in os.environ.items()
               if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, cwd=REPO, env=environ)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["egl", "egl", "(64,", "64,", "3)", "True"], r.stdout


def test_an_existing_mujoco_gl_choice_is_kept(monkeypatch):
    """A MUJOCO_GL the user set (osmesa) is not replaced by egl, and PyOpenGL's platform
    follows it; a windowed backend (glfw) gets no PyOpenGL platform."""
    from lucid.envs.dmc import _set_headless_gl
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    monkeypatch.delenv("PYOPENGL_PLATFORM", raising=False)
    _set_headless_gl()
    assert os.environ["MUJOCO_GL"] == "osmesa" and os.environ["PYOPENGL_PLATFORM"] == "osmesa"
    monkeypatch.setenv("MUJOCO_GL", "glfw")
    monkeypatch.delenv("PYOPENGL_PLATFORM")
    _set_headless_gl()
    assert os.environ["MUJOCO_GL"] == "glfw" and "PYOPENGL_PLATFORM" not in os.environ


def test_dmc_vision_renders_64x64_pixels_headless_like_the_raw_renderer():
    from dm_control import suite
    env = make_env("dmc-vision:cartpole-swingup", fast_render=True)
    assert env.observation_space == gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    quality = env.unwrapped.dm_env.physics.model.vis.quality
    assert quality.shadowsize == 256 and quality.offsamples == 0  # fast_render
    raw = suite.load("cartpole", "swingup", task_kwargs={"random": 2})
    raw.physics.model.vis.quality.shadowsize = 256
    raw.physics.model.vis.quality.offsamples = 0
    obs, _ = env.reset(seed=2)
    raw.reset()
    assert obs.dtype == np.uint8 and obs.shape == (64, 64, 3) and obs.std() > 1
    first = obs
    for _ in range(3):
        obs, r, term, trunc, _ = env.step(np.ones(1, np.float32))
        raw.step(np.ones(1))
        raw.step(np.ones(1))
    want = raw.physics.render(64, 64, camera_id=0)
    assert np.abs(obs.astype(int) - want.astype(int)).mean() < 1.0
    assert not np.array_equal(first, obs)  # the cart moved
    assert os.environ["MUJOCO_GL"] in ("egl", "osmesa")
    env.close()


def test_dmc_proprio_renders_the_camera_for_videos():
    """`dmc:` observations are vectors; render() draws the scene (the videos' frames) as the
    raw suite's camera shows it, and the vector observations are unchanged by it."""
    from dm_control import suite
    env = make_env("dmc:cartpole-swingup", render_mode="rgb_array")
    raw = suite.load("cartpole", "swingup", task_kwargs={"random": 4})
    obs, _ = env.reset(seed=4)
    raw.reset()
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.shape == (240, 320, 3) and frame.std() > 1
    want = raw.physics.render(240, 320, camera_id=0)
    assert np.abs(frame.astype(int) - want.astype(int)).mean() < 1.0
    assert np.array_equal(env.render(), frame) and env.observation_space.contains(obs)
    env.close()


def test_dmc_task_names_and_the_quadrupeds_camera():
    from lucid.envs.dmc import parse_task
    assert parse_task("walker-walk") == parse_task("walker_walk") == ("walker", "walk")
    assert parse_task("cup-catch") == parse_task("ball_in_cup-catch") == ("ball_in_cup", "catch")
    assert parse_task("pointmass-easy") == ("point_mass", "easy")
    assert parse_task("cartpole-balance-sparse") == ("cartpole", "balance_sparse")
    # quadruped: camera 2, as the authors' code does (camera 0 for the others, tested above)
    env = make_env("dmc-vision:quadruped-walk", fast_render=True)
    obs, _ = env.reset(seed=1)
    physics = env.unwrapped.dm_env.physics
    assert np.array_equal(obs, physics.render(64, 64, camera_id=2))
    assert not np.array_equal(obs, physics.render(64, 64, camera_id=0))
    env.close()
    # render() of the proprio task (videos) draws the same camera
    env = make_env("dmc:quadruped-walk", render_mode="rgb_array")
    env.reset(seed=1)
    physics = env.unwrapped.dm_env.physics
    assert np.array_equal(env.render(), physics.render(240, 320, camera_id=2))
    env.close()


def test_dmc_camera_option_picks_the_camera_and_fast_render_is_for_pixels_only():
    """camera=1 renders the observations from camera 1, not the default 0; fast_render
    lowers the render quality of dmc-vision only, not of a proprio task's video frames."""
    env = make_env("dmc-vision:cartpole-swingup", camera=1, fast_render=True)
    obs, _ = env.reset(seed=0)
    physics = env.unwrapped.dm_env.physics
    assert np.array_equal(obs, physics.render(64, 64, camera_id=1))
    assert not np.array_equal(obs, physics.render(64, 64, camera_id=0))
    env.close()
    from dm_control import suite
    want = suite.load("cartpole", "swingup").physics.model.vis.quality
    assert (want.shadowsize, want.offsamples) != (256, 0)
    env = make_env("dmc:cartpole-swingup", fast_render=True)
    quality = env.unwrapped.dm_env.physics.model.vis.quality
    assert (quality.shadowsize, quality.offsamples) == (want.shadowsize, want.offsamples)
    env.close()


# --------------------------------------------------------------------------- Crafter

def test_crafter_matches_the_raw_env_with_achievements_and_time_limit():
    import crafter
    env = make_env("crafter", length=30)
    assert env.observation_space == gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    assert env.action_space.n == 17
    raw = crafter.Env(size=(64, 64), length=30, seed=7)
    obs, info = env.reset(seed=7)
    assert np.array_equal(obs, raw.reset()) and set(info["achievements"]) == set(ACHIEVEMENTS)
    rng = np.random.default_rng(0)
    for t in range(30):
        a = int(rng.integers(17))
        obs, r, term, trunc, info = env.step(a)
        raw_obs, raw_r, done, raw_info = raw.step(a)
        assert np.array_equal(obs, raw_obs) and r == raw_r
        assert info["achievements"] == raw_info["achievements"]
        assert info["inventory"] == raw_info["inventory"]
        assert info["discount"] == raw_info["discount"]
        assert obs.dtype == np.uint8
        if t < 29:
            assert not (term or trunc)
    assert trunc and not term  # the length limit; a death would be a termination
    assert make_env("crafter:noreward").reset(seed=0)[0].shape == (64, 64, 3)


def test_crafter_noreward_gives_zero_rewards_and_a_seed_gives_its_world_again():
    """crafter:noreward: the same steps without rewards; render() (videos) shows the last
    observation; reset(seed) starts that seed's world again."""
    env = make_env("crafter", render_mode="rgb_array")
    quiet = make_env("crafter:noreward")
    first, _ = env.reset(seed=2)
    quiet.reset(seed=2)
    rng = np.random.default_rng(0)
    rewards, quiet_rewards = [], []
    for _ in range(60):
        a = int(rng.integers(17))
        obs, r, *_ = env.step(a)
        rewards.append(r)
        quiet_rewards.append(quiet.step(a)[1])
    assert any(rewards) and not any(quiet_rewards)  # an achievement's reward in 60 steps
    assert np.array_equal(env.render(), obs) and not np.array_equal(obs, first)
    # reset(seed) starts the same world again; the next reset without a seed another one
    assert np.array_equal(env.reset(seed=2)[0], first)
    assert not np.array_equal(env.reset()[0], first)


def test_crafter_death_is_a_termination():
    """The player's health reaching 0 ends the episode as a termination (discount 0); the
    reward counts health changes, a tenth per point: 9 -> 0 is -0.9."""
    env = make_env("crafter")
    env.reset(seed=0)
    env.unwrapped._env._player.inventory["health"] = 0
    _, r, term, trunc, info = env.step(0)
    assert term and not trunc and info["discount"] == 0.0
    assert r == pytest.approx(-0.9)


def test_crafter_episodes_last_10000_steps_by_default():
    """Without `length`, the episode is truncated at step 10,000 and not before (the step
    counter is moved on to spare the 9,998 steps)."""
    env = make_env("crafter")
    env.reset(seed=0)
    env.unwrapped._env._step = 9_998
    _, _, term, trunc, _ = env.step(0)  # step 9,999
    assert not (term or trunc)
    _, _, term, trunc, _ = env.step(0)  # step 10,000
    assert trunc and not term


def test_crafter_score_hand_worked():
    assert crafter_score([0.0] * 22) == 0.0
    assert crafter_score([100.0] * 22) == pytest.approx(100.0)
    assert crafter_score([0.0, 3.0]) == pytest.approx(1.0)  # exp((ln 1 + ln 4) / 2) - 1 = 1
    assert crafter_score([100.0, 0.0]) == pytest.approx(math.sqrt(101) - 1)
    episodes = [{"collect_wood": 2, "place_table": 1}, {"collect_wood": 1}, {},
                {"collect_wood": 1, "wake_up": 1, "eat_cow": 0}]
    rates = success_rates(episodes)
    assert rates["collect_wood"] == 75.0 and rates["place_table"] == 25.0
    assert rates["wake_up"] == 25.0 and rates["eat_cow"] == 0.0 and len(rates) == 22
    # exp((ln 76 + 2 ln 26) / 22) - 1 = exp(10.846927 / 22) - 1 = exp(0.4930421) - 1
    assert crafter_score(rates) == pytest.approx(0.637289, abs=1e-5)
    with pytest.raises(KeyError):
        crafter_score({"collect_gold": 10.0})
    # a mapping's missing achievements count as 0%: exp(ln 101 / 22) - 1
    assert crafter_score({"collect_wood": 100.0}) == pytest.approx(math.exp(math.log(101) / 22) - 1)
    for bad in ([120.0], [100.5], [-0.5], []):
        with pytest.raises(ValueError):
            crafter_score(bad)
    with pytest.raises(ValueError):
        success_rates([])


# --------------------------------------------------------------------------- MiniGrid

def test_minigrid_is_the_resized_rgb_grid_with_its_time_limit_and_goal():
    from minigrid.wrappers import ImgObsWrapper, RGBImgObsWrapper
    env = make_env("minigrid:DoorKey-5x5")
    assert env.observation_space == gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    assert env.action_space.n == 7
    raw = ImgObsWrapper(RGBImgObsWrapper(gym.make("MiniGrid-DoorKey-5x5-v0"), tile_size=16))
    obs, _ = env.reset(seed=4)
    raw_obs, _ = raw.reset(seed=4)
    assert raw_obs.shape == (80, 80, 3)
    assert np.array_equal(obs, cv2.resize(raw_obs, (64, 64), interpolation=cv2.INTER_AREA))
    for a in (2, 1, 2, 0):
        obs, *_ = env.step(a)
        raw_obs, *_ = raw.step(a)
        assert np.array_equal(obs, cv2.resize(raw_obs, (64, 64), interpolation=cv2.INTER_AREA))

    env = make_env("minigrid:Empty-5x5")
    env.reset(seed=0)
    for t in range(100):  # turning in place never reaches the goal: truncated at max_steps
        _, r, term, trunc, _ = env.step(0)
        assert not term and (trunc == (t == 99))
    env.reset(seed=0)  # start (1, 1) facing right, goal (3, 3)
    for a in (2, 2, 1, 2):
        assert env.step(a)[2] is False
    _, r, term, trunc, _ = env.step(2)
    assert term and not trunc and r == pytest.approx(1 - 0.9 * 5 / 100)


def test_minigrid_takes_full_and_babyai_ids_its_options_and_render_mode():
    """Full ids with or without their version and BabyAI ids name the same envs as short
    names; size= and tile_size= set the image, unknown options are refused, and
    render_mode="rgb_array" renders the env's frames (for videos)."""
    from lucid.envs.minigrid import minigrid_id
    assert {minigrid_id(t) for t in ("DoorKey-5x5", "MiniGrid-DoorKey-5x5",
                                     "MiniGrid-DoorKey-5x5-v0")} == {"MiniGrid-DoorKey-5x5-v0"}
    assert minigrid_id("BabyAI-GoToRedBall") == "BabyAI-GoToRedBall-v0"
    baby = make_env("minigrid:BabyAI-GoToRedBall")
    assert baby.unwrapped.spec.id == "BabyAI-GoToRedBall-v0"
    assert baby.observation_space == gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    small = make_env("minigrid:MiniGrid-DoorKey-5x5", size=32)
    assert small.observation_space.shape == (32, 32, 3)
    assert small.reset(seed=0)[0].shape == (32, 32, 3)
    with pytest.raises(TypeError, match=r"unknown MiniGrid option\(s\) \['gray'\]"):
        make_env("minigrid:DoorKey-5x5", gray=True)
    env = make_env("minigrid:DoorKey-5x5", render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[-1] == 3


# --------------------------------------------------------------------------- extras

@pytest.mark.parametrize("env_id,module,extra", [
    ("atari:Pong", "ale_py", "atari"),
    ("atari100k:Pong", "ale_py", "atari"),
    ("dmc:walker-walk", "mujoco", "dmc"),
    ("dmc-vision:walker-walk", "dm_control.suite", "dmc"),
    ("crafter", "crafter", "crafter"),
    ("minigrid:DoorKey-5x5", "minigrid", "minigrid"),
    ("memory-maze:9x9", "memory_maze.tasks", "memory-maze"),
    ("envpool:Pong-v5", "envpool", "envpool"),
])
def test_a_missing_optional_package_names_the_extra_to_install(monkeypatch, env_id, module,
                                                                extra):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(MissingExtraError) as err:
        make_env(env_id)
    assert f"pip install 'lucid-rl[{extra}]'" in str(err.value)
    assert module in str(err.value)
    # an ImportError, and a ValueError so the CLI prints it as a one-line error
    assert isinstance(err.value, ImportError) and isinstance(err.value, ValueError)


def test_memory_maze_wrapper_matches_the_dm_env_task_and_truncates():
    pytest.importorskip("memory_maze", reason="memory-maze not installed")
    from memory_maze import tasks

    from lucid.envs.dmc import DMEnv
    env = make_env("memory-maze:9x9")
    assert env.observation_space == gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    assert env.action_space == gym.spaces.Discrete(6)
    opts = dict(image_only_obs=True, discrete_actions=True, camera_resolution=64,
                good_visibility=False)
    raw = tasks.memory_maze_9x9(seed=5, **opts)
    try:
        obs, _ = env.reset(seed=5)
        ts = raw.reset()
        assert obs.dtype == np.uint8 and np.array_equal(obs, ts.observation)
        rng = np.random.default_rng(0)
        for t in range(12):
            a = int(rng.integers(6))
            obs, reward, term, trunc, _ = env.step(a)
            ts = raw.step(a)
            assert np.array_equal(obs, ts.observation), f"step {t}"
            assert reward == (ts.reward or 0.0) and not (term or trunc)
    finally:
        env.close()
        raw.close()
    # The episode's time limit (here 2.5 s = 10 steps at 4 Hz instead of 250 s) is a
    # truncation, through the same adapter make_env uses.
    short = DMEnv(lambda seed: tasks._memory_maze(9, 3, 2.5, seed=seed, **opts), repeat=1,
                  obs="flat")
    try:
        short.reset(seed=0)
        for t in range(10):
            _, _, term, trunc, _ = short.step(0)
            assert not term and trunc == (t == 9)
    finally:
        short.close()


def test_memory_maze_size_option_sets_the_camera_resolution():
    """size=32 gives 32x32 camera images, the observations and their space alike."""
    pytest.importorskip("memory_maze", reason="memory-maze not installed")
    env = make_env("memory-maze:9x9", size=32)
    try:
        assert env.observation_space == gym.spaces.Box(0, 255, (32, 32, 3), np.uint8)
        obs, _ = env.reset(seed=0)
        assert obs.shape == (32, 32, 3) and obs.dtype == np.uint8 and obs.std() > 1
    finally:
        env.close()


def test_envpool_wrapper_matches_raw_envpool_with_the_paper_settings():
    envpool = pytest.importorskip("envpool", reason="envpool has no wheel for this platform")
    from lucid.envs.envpool import ATARI_ENVPOOL_DEFAULTS
    env = make_env("envpool:Pong-v5")
    assert env.observation_space == gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    assert env.action_space == gym.spaces.Discrete(18)  # the full action set, as atari:
    cfg = env.unwrapped._pool.config
    assert cfg["repeat_action_probability"] == 0.25 and cfg["frame_skip"] == 4
    assert cfg["stack_num"] == 1 and not cfg["episodic_life"] and not cfg["reward_clip"]
    assert cfg["max_episode_steps"] == 27_000 and cfg["full_action_space"]
    raw = envpool.make_gymnasium("Pong-v5", num_envs=1, batch_size=1, seed=7,
                                 **ATARI_ENVPOOL_DEFAULTS)
    try:
        obs, _ = env.reset(seed=7)
        raw_obs, _ = raw.reset()
        assert np.array_equal(obs, raw_obs[0].transpose(1, 2, 0))
        rng = np.random.default_rng(0)
        total = 0.0
        for t in range(400):  # random play loses points in Pong within a few hundred steps
            a = int(rng.integers(18))
            obs, reward, term, trunc, _ = env.step(a)
            raw_obs, raw_r, raw_term, raw_trunc, _ = raw.step(np.array([a]))
            assert np.array_equal(obs, raw_obs[0].transpose(1, 2, 0)), f"step {t}"
            assert reward == float(raw_r[0])
            assert (term, trunc) == (bool(raw_term[0]), bool(raw_trunc[0]))
            total += reward
        assert total < 0  # rewards passed through unclipped and unchanged
    finally:
        env.close()
        raw.close()

    env = make_env("envpool:Pong-v5", max_episode_steps=10)
    try:
        env.reset(seed=0)
        for t in range(10):
            _, _, term, trunc, _ = env.step(0)
            assert not term and trunc == (t == 9)  # a time limit is a truncation
    finally:
        env.close()


def test_envpool_atari_settings_are_the_papers():
    """Every Atari setting, written out here (the test above builds its raw envpool env from
    ATARI_ENVPOOL_DEFAULTS itself, so it cannot see one of them change)."""
    pytest.importorskip("envpool", reason="envpool has no wheel for this platform")
    env = make_env("envpool:Pong-v5")
    try:
        cfg = env.unwrapped._pool.config
        paper = dict(img_height=64, img_width=64, stack_num=1, gray_scale=False, frame_skip=4,
                     repeat_action_probability=0.25, noop_max=1, full_action_space=True,
                     use_inter_area_resize=True, episodic_life=False,
                     zero_discount_on_life_loss=False, reward_clip=False,
                     max_episode_steps=27_000, use_fire_reset=False)
        assert {k: cfg[k] for k in paper} == paper
    finally:
        env.close()


def test_an_envpool_task_other_than_atari_is_passed_through(monkeypatch):
    """envpool:CartPole-v1 gets no Atari settings and keeps envpool's spaces (a vector, not
    transposed); a reset with a seed starts as a fresh envpool env with that seed, closing the
    old one; steps give Python floats and bools and empty infos, and a fall is a
    termination; options reach envpool; a render_mode is refused."""
    envpool = pytest.importorskip("envpool", reason="envpool has no wheel for this platform")
    env = make_env("envpool:CartPole-v1")
    raw = envpool.make_gymnasium("CartPole-v1", num_envs=1, batch_size=1, seed=3)
    try:
        assert env.observation_space == raw.observation_space
        assert env.action_space == raw.action_space == gym.spaces.Discrete(2)
        closed = []
        old = env.unwrapped._pool
        monkeypatch.setattr(old, "close", lambda: closed.append("old"))
        obs, info = env.reset(seed=3)
        raw_obs, _ = raw.reset()
        assert closed == ["old"] and env.unwrapped._pool is not old
        assert info == {} and obs.shape == (4,) and np.array_equal(obs, raw_obs[0])
        for t in range(100):  # always pushing right: the pole falls within 100 steps
            obs, reward, term, trunc, info = env.step(1)
            raw_obs, raw_r, raw_term, raw_trunc, _ = raw.step(np.array([1]))
            assert type(reward) is float and type(term) is bool and type(trunc) is bool
            assert info == {} and np.array_equal(obs, raw_obs[0])
            assert (reward, term, trunc) == (float(raw_r[0]), bool(raw_term[0]),
                                             bool(raw_trunc[0]))
            if term:
                break
        assert term and not trunc
        monkeypatch.setattr(env.unwrapped._pool, "close", lambda: closed.append("new"))
        env.close()
        assert closed == ["old", "new"]
    finally:
        raw.close()

    seeded = make_env("envpool:CartPole-v1", seed=3)  # an option: the pool's own seed
    try:
        assert np.array_equal(seeded.reset()[0], _envpool_first_obs(envpool, 3))
    finally:
        seeded.close()
    from lucid.envs.envpool import EnvpoolEnv
    limited = EnvpoolEnv("CartPole-v1", max_episode_steps=5)  # an envpool option
    try:
        assert limited._pool.config["max_episode_steps"] == 5
        limited.reset(seed=0)
        ends = [limited.step(t % 2)[2:4] for t in range(5)]  # left, right: it stays up
        assert ends == [(False, False)] * 4 + [(False, True)]
        assert limited._pool.config["max_episode_steps"] == 5  # also after the reset
    finally:
        limited.close()
    with pytest.raises(ValueError, match="envpool envs do not render"):
        make_env("envpool:CartPole-v1", render_mode="rgb_array")


def _envpool_first_obs(envpool, seed):
    """The first observation of a fresh envpool CartPole-v1 env seeded `seed`."""
    raw = envpool.make_gymnasium("CartPole-v1", num_envs=1, batch_size=1, seed=seed)
    try:
        return raw.reset()[0][0]
    finally:
        raw.close()


def test_envpool_mujoco_v5_tasks_are_not_taken_for_atari():
    """envpool's MuJoCo ids end in -v5 as its Atari games' do: `envpool:Hopper-v5` gets no
    Atari settings (envpool refused them: a TypeError at construction; nor the atari preset,
    see above); is_atari agrees with envpool's own registry on every id it has."""
    pytest.importorskip("envpool", reason="envpool has no wheel for this platform")
    from envpool.registration import registry
    env = make_env("envpool:Hopper-v5")
    try:
        assert env.observation_space.shape == (11,) and env.action_space.shape == (3,)
        obs, _ = env.reset(seed=0)
        assert obs.shape == (11,) and len(env.step(env.action_space.sample())) == 5
    finally:
        env.close()
    from lucid.envs.envpool import is_atari
    assert {t for t in registry.list_all_envs() if is_atari(t)} == \
        {t for t in registry.list_all_envs() if registry.specs[t][0] == "envpool.atari"}


def test_envpool_pixel_tasks_give_h_x_w_x_c_images():
    """envpool's MuJoCo/DMC pixel tasks (from_pixels=True) are C x H x W, as its Atari games:
    they are transposed too, into images lucid takes (it refused the C x H x W ones)."""
    envpool = pytest.importorskip("envpool", reason="envpool has no wheel for this platform")
    opts = dict(from_pixels=True, render_width=64, render_height=64)
    env = make_env("envpool:CartpoleBalance-v1", **opts)
    raw = envpool.make_gymnasium("CartpoleBalance-v1", num_envs=1, batch_size=1, seed=2, **opts)
    try:
        assert env.observation_space == gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
        assert ObsSpec.from_space(env.observation_space).images == {"image": (64, 64, 3)}
        obs, _ = env.reset(seed=2)
        raw_obs, _ = raw.reset()
        assert np.array_equal(obs, raw_obs[0].transpose(1, 2, 0)) and obs.std() > 1
        obs = env.step(np.zeros(1))[0]
        assert np.array_equal(obs, raw.step(np.zeros((1, 1)))[0][0].transpose(1, 2, 0))
    finally:
        env.close()
        raw.close()


def test_envpool_images_that_are_h_x_w_x_c_already_are_kept():
    """Only envpool's C x H x W images (Atari's, the pixel tasks') are transposed: CarRacing's
    96 x 96 x 3 frames keep their space and values."""
    envpool = pytest.importorskip("envpool", reason="envpool has no wheel for this platform")
    env = make_env("envpool:CarRacing-v3")
    raw = envpool.make_gymnasium("CarRacing-v3", num_envs=1, batch_size=1, seed=4)
    try:
        assert env.observation_space == raw.observation_space
        assert env.observation_space.shape == (96, 96, 3)
        obs, _ = env.reset(seed=4)
        raw_obs, _ = raw.reset()
        assert obs.shape == (96, 96, 3) and np.array_equal(obs, raw_obs[0])
    finally:
        env.close()
        raw.close()


# --------------------------------------------------------------------------- custom envs

def test_custom_env_example_loads_from_the_working_directory(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if p not in ("", ".", str(REPO))])
    for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
        monkeypatch.delitem(sys.modules, name)
    for spec in ("examples.custom_env:MyEnv", "examples.custom_env:make_env"):
        env = make_env(spec, max_episode_steps=7)
        obs, _ = env.reset(seed=0)
        assert obs["image"].shape == (64, 64, 3) and obs["position"].dtype == np.float64
        for t in range(7):
            *_, term, trunc, _ = env.step(np.array([1, 1]))  # stand still
        assert trunc and not term
    with pytest.raises(UnknownEnvError, match="module.path:EnvClass"):
        make_env("examples.custom_env:NoSuchEnv")
    with pytest.raises(UnknownEnvError, match="No module named 'no_such_mod'.*PYTHONPATH"):
        make_env("no_such_mod:MyEnv")


# --------------------------------------------------------------------------- vector envs

@pytest.mark.parametrize("env_id,options", [
    ("atari:Pong", {}),
    ("atari100k:Pong", {"gray": True}),
    ("dmc:walker-walk", {"obs": "dict"}),
    ("dmc-vision:cartpole-swingup", {"fast_render": True}),
    ("crafter", {}),
    ("minigrid:DoorKey-5x5", {}),
    ("examples.custom_env:MyEnv", {}),
])
def test_suites_step_through_sync_vector_env_and_obs_spec(env_id, options, monkeypatch):
    monkeypatch.chdir(REPO)
    envs = gym.vector.SyncVectorEnv([env_fn(env_id, None, **options)] * 2,
                                    autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    obs_spec = ObsSpec.from_space(envs.single_observation_space)
    act_spec = ActionSpec.from_space(envs.single_action_space)
    envs.action_space.seed(0)
    obs, _ = envs.reset(seed=0)
    for _ in range(3):
        model_action = act_spec.from_env(envs.action_space.sample())
        obs, reward, term, trunc, _ = envs.step(act_spec.to_env(model_action))
        arrays = obs_spec.convert(obs, (2,))
        assert reward.shape == (2,) and np.all(np.isfinite(reward))
    for key, shape in obs_spec.images.items():
        assert arrays[key].shape == (2, *shape) and arrays[key].dtype == np.uint8
        assert shape[:2] == (64, 64)
    for key, size in obs_spec.vectors.items():
        assert arrays[key].shape == (2, size) and arrays[key].dtype == np.float32
    envs.close()


def test_custom_env_trains_through_the_python_api(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    from lucid import Dreamer
    agent = Dreamer("examples.custom_env:MyEnv", preset="cpu-control", size="nano",
                    run_dir=tmp_path / "run",
                    train={"batch_size": 2, "batch_length": 8, "prefill": 64,
                           "train_ratio": 8, "replay_capacity": 1000})
    assert agent.trainer.obs_spec.images == {"image": (64, 64, 3)}
    assert agent.trainer.obs_spec.vectors == {"position": 4}
    assert agent.trainer.act_spec.discrete == [3, 3]
    agent.learn(96)
    assert agent.trainer.counters["env_steps"] >= 96 and agent.trainer.counters["updates"] >= 10
    env = make_env("examples.custom_env:MyEnv")
    obs, _ = env.reset(seed=0)
    action, _ = agent.predict(obs, deterministic=True)
    assert env.action_space.contains(np.asarray(action, np.int64))
    agent.trainer.close()


def test_a_module_next_to_an_env_file_that_imports_it_gets_the_same_classes(tmp_path,
                                                                              monkeypatch):
    """`lucid train proj/grid.py:Grid` where proj/wrappers.py says `from grid import Grid`:
    one module, so its classes are the env's (a second copy fails isinstance). A file whose
    name is taken by another module (`json.py`) is not put in that module's place."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    (tmp_path / "grid.py").write_text(
        "import gymnasium as gym\n"
        "class Grid(gym.Env):\n"
        "    observation_space = gym.spaces.Box(0, 1, (1,))\n"
        "    action_space = gym.spaces.Discrete(2)\n"
        "def make():\n"
        "    import wrappers\n"
        "    return wrappers.Tagged(Grid())\n")
    (tmp_path / "wrappers.py").write_text(
        "import gymnasium as gym\n"
        "from grid import Grid\n"
        "class Tagged(gym.Wrapper):\n"
        "    def __init__(self, env):\n"
        "        assert isinstance(env, Grid), 'a second copy of grid.Grid'\n"
        "        super().__init__(env)\n")
    env = make_env(f"{tmp_path}/grid.py:make")
    assert type(env.unwrapped).__name__ == "Grid"
    (tmp_path / "json.py").write_text((tmp_path / "grid.py").read_text())
    import json
    make_env(f"{tmp_path}/json.py:Grid")
    assert sys.modules["json"] is json


def test_gymnasium_module_colon_id_makes_the_env_the_module_registers(tmp_path, monkeypatch):
    """`my_reg:my_reg/Grid-v0`, as gym.make takes it: the module registers the id on import
    (gym.register), and the registered env is made with its own time limit, or ours."""
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    monkeypatch.setattr(gym.envs.registration, "registry", dict(gym.registry))
    monkeypatch.setattr(gym, "registry", gym.envs.registration.registry)
    (tmp_path / "my_reg.py").write_text(
        "import gymnasium as gym\n"
        "class Grid(gym.Env):\n"
        "    observation_space = gym.spaces.Box(0, 1, (2,))\n"
        "    action_space = gym.spaces.Discrete(3)\n"
        "gym.register('my_reg/Grid-v0', entry_point=Grid, max_episode_steps=7)\n")
    env = make_env("my_reg:my_reg/Grid-v0")
    assert type(env.unwrapped).__name__ == "Grid" and env.spec.max_episode_steps == 7
    assert make_env("my_reg:my_reg/Grid-v0", max_episode_steps=3).spec.max_episode_steps == 3
    with pytest.raises(UnknownEnvError, match="importing my_reg did not register the gymnasium id "
                       "'my_reg/Grid-v9'; did you mean my_reg/Grid-v0"):
        make_env("my_reg:my_reg/Grid-v9")


def test_a_missing_import_of_an_env_module_is_told_from_a_missing_module(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    (tmp_path / "with_dep.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(UnknownEnvError, match="it imports 'no_such_dependency_xyz', which is "
                                              "not installed"):
        make_env("with_dep:Env")
    with pytest.raises(UnknownEnvError, match="No module named 'no_such_module_xyz' "
                                              r"\(modules are imported from the current"):
        make_env("no_such_module_xyz:Env")


def test_an_env_file_with_dots_in_its_name_pickles_and_a_missing_class_is_named(tmp_path,
                                                                               monkeypatch):
    """The file is imported under a module name pickle can import again (`my.env.py` has
    dots); a class the file lacks is named with the file, not the internal module name."""
    import pickle
    monkeypatch.setattr(sys, "path", list(sys.path))  # the file's directory joins it
    (tmp_path / "my.env.py").write_text(
        "import gymnasium as gym\n"
        "class Still(gym.Env):\n"
        "    observation_space = gym.spaces.Box(0, 1, (1,))\n"
        "    action_space = gym.spaces.Discrete(2)\n")
    env = make_env(f"{tmp_path}/my.env.py:Still")
    assert type(pickle.loads(pickle.dumps(env))).__name__ == "Still"
    with pytest.raises(UnknownEnvError, match=r"my\.env\.py defines no 'Stil'"):
        make_env(f"{tmp_path}/my.env.py:Stil")


def test_env_files_are_imported_once_per_path_and_their_folder_goes_first(tmp_path,
                                                                        monkeypatch):
    """Two env files of one name in two folders are two modules, and one file gives the same
    classes on every import; `~` is the home directory and a folder's name may hold a colon
    (the attribute follows the last one). The file's folder goes first on the import path,
    as for `python file.py`: a module next to it wins over one of the same name further
    down; where a module of the file's own name comes first, or one was imported already,
    `import` keeps giving that one."""
    from lucid.plugins import import_attr, resolve_id
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    for folder, n in (("a", 1), ("b:2", 2)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "same_name_env.py").write_text(
            "import gymnasium as gym\n"
            "class Env(gym.Env):\n"
            f"    observation_space = gym.spaces.Box(0, 1, ({n},))\n"
            "    action_space = gym.spaces.Discrete(2)\n")
    a, b = (f"{tmp_path / folder}/same_name_env.py:Env" for folder in ("a", "b:2"))
    assert make_env(a).observation_space.shape == (1,)
    assert make_env(b).observation_space.shape == (2,)
    assert import_attr(a) is import_attr(a) is type(make_env(a).unwrapped)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_id("~/a/same_name_env.py:Env") == resolve_id(a)
    proj, other = tmp_path / "proj", tmp_path / "other"
    proj.mkdir(), other.mkdir()
    (other / "lucid_probe_sibling.py").write_text("WHERE = 'other'\n")
    (proj / "lucid_probe_sibling.py").write_text("WHERE = 'proj'\n")
    (proj / "probe_env.py").write_text("from lucid_probe_sibling import WHERE\n")
    (other / "lucid_probe_dup.py").write_text("WHERE = 'other'\n")
    (proj / "lucid_probe_dup.py").write_text("WHERE = 'proj'\n")
    sys.path.insert(0, str(other))
    assert import_attr(f"{proj}/probe_env.py:WHERE") == "proj"
    sibling = sys.modules["lucid_probe_sibling"]  # imported as a module: it stays that one
    assert import_attr(f"{proj}/lucid_probe_sibling.py:WHERE") == "proj"
    assert sys.modules["lucid_probe_sibling"] is sibling
    sys.path.insert(0, str(other))  # before proj, which the import above put first
    assert import_attr(f"{proj}/lucid_probe_dup.py:WHERE") == "proj"
    import lucid_probe_dup
    assert lucid_probe_dup.WHERE == "other"


def test_an_env_file_that_fails_to_import_leaves_nothing_behind(tmp_path, monkeypatch):
    """A file raising on import leaves sys.modules and sys.path as they were (so it imports
    once fixed); a file that is not there is named as such, with no module-path advice."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    env_file = tmp_path / "half_done.py"
    env_file.write_text("raise RuntimeError('half done')\n")
    modules = set(sys.modules)
    with pytest.raises(RuntimeError, match="half done"):
        make_env(f"{env_file}:Env")
    assert str(tmp_path) not in sys.path and set(sys.modules) == modules
    env_file.write_text("import gymnasium as gym\n"
                        "class Env(gym.Env):\n"
                        "    observation_space = gym.spaces.Box(0, 1, (1,))\n"
                        "    action_space = gym.spaces.Discrete(2)\n")
    assert type(make_env(f"{env_file}:Env").unwrapped).__name__ == "Env"
    with pytest.raises(UnknownEnvError, match=r"there is no file .*nothing_here\.py \(if it "
                                              r"moved") as err:
        make_env(f"{tmp_path}/nothing_here.py:Env")
    assert "PYTHONPATH" not in str(err.value)


def test_a_module_import_that_fails_leaves_the_path_and_names_what_is_missing(tmp_path,
                                                                              monkeypatch):
    """A module looked for in the working directory too, and not found, leaves sys.path as
    it was; a missing import whose name begins like the module's own is still an import of
    the module, and an env file's missing import is told as a module's is; a module that
    needs a suite's extra raises MissingExtraError, which names it; a module that raises on
    import, named by gymnasium's module:Id syntax, is named with its error and leaves the
    working directory off sys.path."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownEnvError, match=r"No module named 'no_such_module_xyz'.*or a "
                                              r"suite prefix \(atari:, atari100k:, dmc:, "):
        make_env("no_such_module_xyz:Env")
    assert str(tmp_path) not in sys.path
    (tmp_path / "lucid_probe_env_x.py").write_text("import lucid_probe_env\n")
    with pytest.raises(UnknownEnvError, match="it imports 'lucid_probe_env', which is not "
                                              "installed"):
        make_env("lucid_probe_env_x:Env")
    with pytest.raises(UnknownEnvError, match="it imports 'lucid_probe_env', which is not "
                                              "installed"):  # an env file's import too
        make_env(f"{tmp_path}/lucid_probe_env_x.py:Env")
    (tmp_path / "needs_extra.py").write_text("from lucid.envs.extras import require\n"
                                             "require('no_such_pkg_xyz', 'xyz')\n")
    with pytest.raises(MissingExtraError, match=r"pip install 'lucid-rl\[xyz\]'"):
        make_env("needs_extra:Env")
    # gymnasium's module:Id syntax: a module that raises on import is named with its error
    (tmp_path / "lucid_probe_reg.py").write_text("raise AttributeError('no such setting')\n")
    with pytest.raises(UnknownEnvError, match="cannot load environment "
                                              "'lucid_probe_reg:probe/Env-v0': no such setting"):
        make_env("lucid_probe_reg:probe/Env-v0")
    assert str(tmp_path) not in sys.path  # found in the working directory, then it raised


USER_ENVS = """
import gymnasium as gym

NOT_CALLABLE = 3


def not_an_env():
    return {"obs": 0}


class Picky(gym.Env):
    observation_space = gym.spaces.Box(0, 1, (1,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None, size=1):
        self.render_mode = render_mode
        self.size = size + 0  # the env's own TypeError for size=None
"""


def test_what_a_user_env_name_gives_must_be_an_env_and_its_type_errors_stay_its_own(
        tmp_path, monkeypatch):
    """Something not callable, or a function returning no gymnasium.Env, is named; a
    TypeError of an env that takes render_mode (a bad keyword, its own bug) is its own, not
    the note on render_mode."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    path = tmp_path / "user_envs.py"
    path.write_text(USER_ENVS)
    with pytest.raises(UnknownEnvError, match=r"user_envs\.py:NOT_CALLABLE' is a int, not an "
                                              "env class"):
        make_env(f"{path}:NOT_CALLABLE")
    with pytest.raises(UnknownEnvError, match=r"not_an_env' returned dict, not a gymnasium"):
        make_env(f"{path}:not_an_env")
    with pytest.raises(TypeError, match="unexpected keyword argument 'sise'"):
        make_env(f"{path}:Picky", sise=2)
    with pytest.raises(TypeError, match="unsupported operand"):
        make_env(f"{path}:Picky", render_mode="rgb_array", size=None)
    assert make_env(f"{path}:Picky", render_mode="rgb_array").render_mode == "rgb_array"


def test_an_env_instance_is_named_by_its_class_and_its_constructor_keeps_the_options():
    """An env instance given to Dreamer: its id names its class (an id without one names
    itself), a process without the instance says how to load the run, and env_fn's
    constructor of it applies the time limit and options it is given."""
    from lucid.envs import env_label, instances
    from lucid.envs.instances import PREFIX as INSTANCE_PREFIX
    assert env_label(f"{INSTANCE_PREFIX}3_CartPoleEnv") == "CartPoleEnv"
    # runs saved before instances had a module of their own name them so
    assert env_label("lucid.api:_env_instance_3_CartPoleEnv") == "CartPoleEnv"
    assert instances.is_instance("lucid.api:_env_instance_3_CartPoleEnv")
    assert env_label(f"{INSTANCE_PREFIX}3") == f"{INSTANCE_PREFIX}3"
    assert env_label(f"{REPO}/examples/custom_env.py:MyEnv") == "custom_env.py:MyEnv"
    with pytest.raises(UnknownEnvError, match=r"on an env instance \(Dreamer\(Lost\(\.\.\.\)\)\), "
                       r"which no other process can rebuild; load it with Dreamer\.load\(path, "
                       r"env=Lost\(\.\.\.\)\)"):
        make_env(f"{INSTANCE_PREFIX}999999_Lost")
    env_id = instances.register(gym.make("CartPole-v1"))
    env = env_fn(env_id, 5)()
    env.reset(seed=0)
    assert [env.step(t % 2)[3] for t in range(5)] == [False] * 4 + [True]
    with pytest.raises(TypeError, match="made with render_mode=None"):
        env_fn(env_id, None, render_mode="rgb_array")()


def test_rgb_array_frames_need_no_display(monkeypatch):
    """render_mode="rgb_array" draws off-screen: pygame is told to need no display."""
    monkeypatch.setenv("SDL_VIDEODRIVER", "placeholder")
    monkeypatch.delenv("SDL_VIDEODRIVER")
    make_env("CartPole-v1", render_mode="rgb_array").close()
    assert os.environ["SDL_VIDEODRIVER"] == "dummy"
