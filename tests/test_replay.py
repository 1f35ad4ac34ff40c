import numpy as np
import pytest
import torch

from lucid.envs import ActionSpec, ObsSpec
from lucid.replay import Replay, to_batch
from lucid.runner import Collector

from envs_for_tests import CountEnv, EchoEnv, truncating_env


def _replay(capacity, num_envs, seed=0):
    fields = {"obs/vector": ((1,), np.float32), "action": ((1,), np.float32),
              "reward": ((), np.float32), "is_first": ((), bool), "is_last": ((), bool),
              "is_terminal": ((), bool)}
    return Replay(capacity, num_envs, fields, seed)


def _fill(rep, steps, num_envs):
    for t in range(steps):
        rep.add({"obs/vector": np.array([[t + 1000 * e] for e in range(num_envs)], np.float32),
                 "action": np.zeros((num_envs, 1), np.float32),
                 "reward": np.full(num_envs, t, np.float32),
                 "is_first": np.full(num_envs, t % 7 == 0), "is_last": np.zeros(num_envs, bool),
                 "is_terminal": np.zeros(num_envs, bool)})


def test_windows_are_contiguous_and_evicted_steps_never_return():
    rep = _replay(capacity=2 * 50, num_envs=2)
    _fill(rep, 130, 2)  # 80 steps per env evicted
    assert len(rep) == 100
    s = rep.sample(256, 10)
    steps = s["reward"]
    assert np.all(np.diff(steps, axis=1) == 1)  # in order, no wrap-around seams
    assert steps.min() >= 80 and steps.max() <= 129
    env = (s["obs/vector"][..., 0] - steps) / 1000
    assert np.all(env == env[:, :1])  # a window never mixes environments
    assert set(np.unique(env)) == {0.0, 1.0}


def test_sampling_is_uniform_over_all_windows():
    rep = _replay(capacity=2 * 40, num_envs=2, seed=1)
    _fill(rep, 40, 2)
    T, n = 8, 66_000
    s = rep.sample(n, T)
    env = ((s["obs/vector"][:, 0, 0] - s["reward"][:, 0]) / 1000).astype(int)
    start = s["reward"][:, 0].astype(int)
    cells = env * (40 - T + 1) + start  # 2 x 33 possible windows
    counts = np.bincount(cells, minlength=66)
    expected = n / 66
    chi2 = ((counts - expected) ** 2 / expected).sum()
    # 65 degrees of freedom: the 99.9% quantile of chi-square(65) is about 107.
    assert chi2 < 107, chi2


def test_windows_cross_episode_boundaries():
    rep = _replay(capacity=200, num_envs=1)
    _fill(rep, 200, 1)
    s = rep.sample(500, 16)
    assert s["is_first"][:, 1:].any()  # episodes start inside windows, not only at their start


def _on_disk(capacity, num_envs, directory, seed=0, fields=None):
    fields = fields or _replay(capacity, num_envs).fields
    return Replay(capacity, num_envs, fields, seed, directory=directory)


def test_save_load_round_trip(tmp_path):
    rep = _on_disk(2 * 30, 2, tmp_path, seed=3)
    _fill(rep, 47, 2)
    rep.flush()
    other = _on_disk(2 * 30, 2, tmp_path, seed=3)
    other.restore()
    assert other.count == rep.count and len(other) == len(rep)
    a, b = rep.sample(64, 5), other.sample(64, 5)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_load_refuses_other_spaces(tmp_path):
    rep = _on_disk(20, 1, tmp_path)
    _fill(rep, 10, 1)
    rep.flush()
    fields = dict(rep.fields)
    fields["obs/image"] = ((8, 8, 3), np.uint8)
    other = _on_disk(20, 1, tmp_path, fields=fields)
    with pytest.raises(ValueError, match="obs/image"):
        other.restore()


def test_images_stay_uint8_and_batches_keep_dtype():
    obs = ObsSpec(images={"image": (16, 16, 3)}, vectors={"state": 2})
    rep = Replay.for_spaces(obs, 3, capacity=100, num_envs=1)
    assert rep.data["obs/image"].dtype == np.uint8
    assert rep.data["obs/image"].nbytes == 100 * 16 * 16 * 3
    g = np.random.default_rng(0)
    for t in range(10):
        rep.add({"obs/image": g.integers(0, 256, (1, 16, 16, 3), np.uint8),
                 "obs/state": g.normal(size=(1, 2)).astype(np.float32),
                 "action": g.normal(size=(1, 3)).astype(np.float32),
                 "reward": np.full(1, t, np.float32), "is_first": np.full(1, t == 0),
                 "is_last": np.zeros(1, bool), "is_terminal": np.zeros(1, bool)})
    sample = rep.sample(2, 4)
    want = {"obs/image": np.uint8, "obs/state": np.float32, "action": np.float32,
            "reward": np.float32, "is_first": np.bool_, "is_last": np.bool_,
            "is_terminal": np.bool_}
    assert {k: v.dtype for k, v in sample.items()} == {k: np.dtype(d) for k, d in want.items()}
    assert sample["obs/image"].shape == (2, 4, 16, 16, 3)
    # pixels reach the agent as uint8 (scaled in the encoder), flags as bools
    batch = to_batch(sample, "cpu")
    assert batch["obs"]["image"].dtype == torch.uint8 and batch["is_first"].dtype == torch.bool
    assert torch.equal(batch["obs"]["image"], torch.from_numpy(sample["obs/image"]))


def _collect(env_fns, steps):
    probe = env_fns[0]()
    col = Collector(env_fns, ObsSpec.from_space(probe.observation_space),
                    ActionSpec.from_space(probe.action_space))
    records = [col.step(None)[0] for _ in range(steps)]
    col.close()
    return records


def _echo_specs_and_agent():
    """EchoEnv's observation and action specs, and a nano agent for them (seed 0)."""
    from lucid.agent import Agent
    from lucid.config import make_config
    probe = EchoEnv()
    obs_spec = ObsSpec.from_space(probe.observation_space)
    act_spec = ActionSpec.from_space(probe.action_space)
    torch.manual_seed(0)
    return obs_spec, act_spec, Agent(obs_spec, act_spec,
                                     make_config("default", model={"size": "nano"}))


@pytest.mark.parametrize("policy", ["random", "agent"])
def test_a_records_action_is_the_one_taken_after_its_observation(policy):
    """record[t]["action"] is the action chosen on seeing obs[t]: the env echoes it in
    obs[t+1] and pays 10x it as reward[t+1] (the data convention of docs/algorithm.md)."""
    obs_spec, act_spec, agent = _echo_specs_and_agent()
    agent = agent if policy == "agent" else None
    col = Collector([EchoEnv, EchoEnv], obs_spec, act_spec, seed=3)
    recs = [col.step(agent)[0] for _ in range(40)]
    col.close()
    checked = set()
    for now, nxt in zip(recs, recs[1:]):
        for e in range(2):
            if now["is_last"][e]:  # the next record is a reset
                assert nxt["is_first"][e] and nxt["obs/vector"][e, 0] == -1
                continue
            taken = int(now["action"][e].argmax())
            assert now["action"][e].sum() == 1
            assert nxt["obs/vector"][e, 0] == taken and nxt["reward"][e] == 10 * taken
            checked.add(taken)
    assert checked == {0, 1, 2}  # every action was seen, so the check means something


def test_the_policy_is_told_which_envs_start_an_episode():
    """Each step hands the agent that step's is_first, so that its state starts again in
    the envs that just reset (one env's reset while the other carries on included)."""
    obs_spec, act_spec, agent = _echo_specs_and_agent()
    real, seen = agent.policy, []

    def policy(obs, state, explore, is_first):
        seen.append(is_first.tolist())
        return real(obs, state, explore, is_first)

    agent.policy = policy
    col = Collector([lambda: EchoEnv(3), lambda: EchoEnv(4)], obs_spec, act_spec, seed=3)
    recs = [col.step(agent)[0] for _ in range(12)]
    col.close()
    assert seen == [r["is_first"].tolist() for r in recs]
    assert [True, False] in seen and [False, True] in seen


def test_terminal_and_first_flags_flow_from_env_to_records():
    recs = _collect([lambda: CountEnv(length=3)], 9)
    t = [int(r["obs/vector"][0, 0]) for r in recs]
    assert t == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert [bool(r["is_first"][0]) for r in recs] == [1, 0, 0, 0, 1, 0, 0, 0, 1]
    assert [bool(r["is_terminal"][0]) for r in recs] == [0, 0, 0, 1, 0, 0, 0, 1, 0]
    assert [bool(r["is_last"][0]) for r in recs] == [0, 0, 0, 1, 0, 0, 0, 1, 0]
    # reward[t] belongs to arriving at obs[t]; a reset step has reward 0
    assert [float(r["reward"][0]) for r in recs] == [0, 1, 2, 3, 0, 1, 2, 3, 0]


def test_truncation_is_last_but_not_terminal():
    recs = _collect([truncating_env, truncating_env], 7)
    for e in range(2):
        assert [bool(r["is_last"][e]) for r in recs] == [0, 0, 0, 0, 1, 0, 0]
        assert not any(bool(r["is_terminal"][e]) for r in recs)
        assert [bool(r["is_first"][e]) for r in recs] == [1, 0, 0, 0, 0, 1, 0]


def test_batches_from_replay_carry_the_flags():
    import torch
    recs = _collect([lambda: CountEnv(length=3)], 40)
    probe = CountEnv()
    rep = Replay.for_spaces(ObsSpec.from_space(probe.observation_space), 2, 100, 1)
    for r in recs:
        rep.add(r)
    batch = to_batch(rep.sample(32, 8), torch.device("cpu"))
    t = batch["obs"]["vector"][..., 0]
    assert torch.equal(batch["is_first"], t == 0)
    assert torch.equal(batch["is_terminal"], t == 3)
    assert torch.equal(batch["reward"], t)


def test_random_actions_follow_the_collectors_seed():
    """The prefill's random actions come from the collector's seed: the same seed gives the
    same actions, another seed others."""
    obs_spec, act_spec, _ = _echo_specs_and_agent()

    def actions(seed):
        col = Collector([EchoEnv, EchoEnv], obs_spec, act_spec, seed=seed)
        out = np.stack([col.step(None)[0]["action"] for _ in range(12)])
        col.close()
        return out

    assert np.array_equal(actions(3), actions(3)) and not np.array_equal(actions(3), actions(4))


def test_a_nan_reward_is_refused_where_it_is_collected():
    """A NaN reward is named at the collector's step that received it, before it reaches the
    replay (where it would make every update non-finite)."""
    class NaNReward(CountEnv):
        def step(self, action):
            obs, reward, term, trunc, info = super().step(action)
            return obs, float("nan") if self.t == 2 else reward, term, trunc, info

    probe = NaNReward()
    col = Collector([NaNReward], ObsSpec.from_space(probe.observation_space),
                    ActionSpec.from_space(probe.action_space))
    col.step(None)
    with pytest.raises(ValueError, match="NaN or Inf reward"):
        col.step(None)
    col.close()


def test_evaluation_runs_whole_episodes_and_closes_its_env():
    """evaluate() returns the episodes asked for, steps the env no further than they take,
    and closes the env it made."""
    from lucid.runner import evaluate
    obs_spec, act_spec, agent = _echo_specs_and_agent()
    made = []

    class Closing(EchoEnv):
        closed, steps = False, 0

        def step(self, action):
            self.steps += 1
            return super().step(action)

        def close(self):
            self.closed = True

    def make():
        made.append(Closing())
        return made[-1]

    eps = evaluate(agent, make, obs_spec, act_spec, 2)
    assert [e.length for e in eps] == [5, 5] and all(e.ret % 10 == 0 for e in eps)
    assert len(made) == 1 and made[0].steps == 10 and made[0].closed
