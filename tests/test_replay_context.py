"""The Nature recipe's replay context (`train.replay_context`): each step's latent state is
stored in the replay when the policy acts and rewritten by each update that replays the step,
and a training window starts from the state stored with the step before it (the authors'
`Agent._apply_replay_context` and `replay.update`).

Checked here: the replay says where sampled steps live and writes there (skipping evicted
steps), also after a restore; a window's first posterior continues the stored state exactly
as the policy's next step did; and a run stores, rewrites and resumes with the latents."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lucid.config import ConfigError, make_config
from lucid.nature_agent import NatureAgent
from lucid.replay import Replay, to_batch
from lucid.specs import ActionSpec
from test_update_unchanged import ACTIONS, VEC

FIELDS = {"obs/n": ((), np.int64), "action": ((1,), np.float32), "reward": ((), np.float32),
          "is_first": ((), np.bool_), "is_last": ((), np.bool_), "is_terminal": ((), np.bool_),
          "latent/h": ((3,), np.float32)}


def _add(replay: Replay, n: int) -> None:
    """Step n of every env: obs/n holds n, no latent given (an optional field)."""
    e = replay.num_envs
    replay.add({"obs/n": np.full(e, n), "action": np.zeros((e, 1), np.float32),
                "reward": np.zeros(e, np.float32), "is_first": np.zeros(e, bool),
                "is_last": np.zeros(e, bool), "is_terminal": np.zeros(e, bool)})


@pytest.mark.parametrize("added", [7, 10, 23, 41])  # before, at and past a full ring
def test_sampled_steps_are_located_and_written_back(added, tmp_path):
    replay = Replay(2 * 10, 2, FIELDS, seed=0, directory=tmp_path, chunk_length=4,
                    optional=("latent/h",))
    for n in range(added):
        _add(replay, n)
    assert not replay.data["latent/h"].any()  # stored as zeros where not given
    s = replay.sample(16, 5, locate=True)
    # each step's number is what was stored there
    np.testing.assert_array_equal(s["_step"], s["obs/n"])
    assert s["_env"].shape == (16,) and set(s["_env"]) <= {0, 1}
    # a value per step (a step sampled twice gets the same one)
    values = np.repeat((1 + 1000 * s["_env"][:, None] + s["_step"])[..., None], 3, -1)
    assert replay.write(s["_env"], s["_step"], {"latent/h": values.astype(np.float32)}) == 80
    h = replay.data["latent/h"]
    for b, t in np.ndindex(16, 5):
        e, n = s["_env"][b], s["_step"][b, t]
        assert (h[e, n % replay.per_env] == 1 + 1000 * e + n).all()
    assert np.count_nonzero(h.any(-1)) == len({(e, n) for e, row in zip(s["_env"], s["_step"])
                                               for n in row})  # nothing else was written
    # to_batch keeps where the steps live as numpy, the rest becomes tensors
    batch = to_batch(s, torch.device("cpu"))
    assert isinstance(batch["_step"], np.ndarray) and isinstance(batch["reward"], torch.Tensor)


def test_steps_evicted_since_the_sample_are_not_written():
    replay = Replay(8, 1, FIELDS, optional=("latent/h",))
    for n in range(8):
        _add(replay, n)
    s = replay.sample(1, 4, locate=True)
    for n in range(8, 8 + int(s["_step"][0, 1]) + 1):  # evicts the window's first two steps
        _add(replay, n)
    wrote = replay.write(s["_env"], s["_step"], {"latent/h": np.ones((1, 4, 3), np.float32)})
    assert wrote == 2
    # only the two steps still held got the value: no newer step was overwritten
    held = replay.sample(1, 8, locate=True)  # the whole ring, oldest first
    written = held["latent/h"].any(-1)[0]
    np.testing.assert_array_equal(held["_step"][0][written], s["_step"][0, 2:])


def test_restored_replays_locate_their_steps(tmp_path):
    replay = Replay(12, 1, FIELDS, directory=tmp_path, chunk_length=5, optional=("latent/h",))
    for n in range(30):
        _add(replay, n)
    replay.flush()
    back = Replay(12, 1, FIELDS, directory=tmp_path, chunk_length=5, optional=("latent/h",))
    assert back.restore() == 12
    s = back.sample(8, 6, locate=True)
    np.testing.assert_array_equal(s["_step"], s["obs/n"])
    assert back.write(s["_env"], s["_step"], {"latent/h": np.ones((8, 6, 3), np.float32)}) == 48


def test_a_missing_field_that_is_not_optional_is_still_an_error():
    replay = Replay(8, 1, FIELDS, optional=("latent/h",))
    with pytest.raises(KeyError, match="reward"):
        replay.add({"obs/n": np.zeros(1), "action": np.zeros((1, 1))})


def _agent(context: int, seed: int = 0) -> tuple[NatureAgent, ActionSpec]:
    torch.manual_seed(seed)
    act = ActionSpec.from_space(ACTIONS["discrete"])
    cfg = make_config("nature", model={"size": "1m"},
                      train={"lr_warmup": 0, "replay_context": context})
    return NatureAgent(VEC, act, cfg), act


def _acted(agent: NatureAgent, T: int, seed: int = 0):
    """T steps of one env acted by the policy from an episode's start: observations,
    actions and each step's stored latents (what the Collector puts in the replay)."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, 2, 4, generator=g)  # 2 envs
    state, rows = None, []
    for t in range(T):
        first = torch.full((2,), t == 0)
        action, state = agent.policy({"vector": obs[t]}, state, True, first)
        assert not state.h.requires_grad  # acting records no graph
        rows.append((action, agent.replay_record(state), state.h.clone()))
    action = torch.stack([r[0] for r in rows], 1)  # (2, T, A)
    latents = {k: np.stack([r[1][k] for r in rows], 1) for k in rows[0][1]}
    return obs.transpose(0, 1), action, latents, torch.stack([r[2] for r in rows], 1)


def _batch(obs, action, latents, start: int, T: int, is_first_at: int | None = None) -> dict:
    sl = slice(start, start + T + 1)  # the step before the window, then T steps
    B = obs.shape[0]
    is_first = torch.zeros(B, T + 1, dtype=torch.bool)
    if is_first_at is not None:
        is_first[:, is_first_at] = True
    flags = torch.zeros(B, T + 1, dtype=torch.bool)
    return {"obs": {"vector": obs[:, sl]}, "action": action[:, sl],
            "reward": torch.zeros(B, T + 1), "is_first": is_first, "is_terminal": flags,
            "is_last": flags, "latent/h": torch.as_tensor(latents["latent/h"][:, sl]),
            "latent/z": torch.as_tensor(latents["latent/z"][:, sl])}


def test_a_window_continues_the_state_stored_before_it():
    """The update's first deterministic state of a window is h' = core(h, z, a) of the stored
    state and action of the step before it, which is what the policy computed at that step:
    the update's h equals the acting h, and z round-trips through its stored form."""
    agent, _ = _agent(context=1)
    obs, action, latents, acted_h = _acted(agent, 12)
    T = 6
    agent.train(_batch(obs, action, latents, start=3, T=T))
    wrote = agent.replay_writes()
    assert wrote["latent/h"].shape == (2, T, agent.size.deter)
    # weights changed by the update; the writes are of the posterior before it
    np.testing.assert_allclose(wrote["latent/h"][:, 0], acted_h[:, 4].numpy(), rtol=1e-5,
                               atol=1e-5)
    # the stored codes are 1 + the class of each latent, and decode to the one-hots
    z = agent._unstored(torch.as_tensor(latents["latent/z"]))
    assert z.sum(-1).eq(1).all() and (latents["latent/z"] >= 1).all()
    assert (latents["latent/z"] <= agent.size.classes).all()


def test_without_a_stored_state_or_at_an_episode_start_the_window_starts_from_zeros():
    agent, _ = _agent(context=1)
    obs, action, latents, acted_h = _acted(agent, 12)
    none = {k: np.zeros_like(v) for k, v in latents.items()}  # steps of random actions
    agent.train(_batch(obs, action, none, start=3, T=4))
    zero_start = agent.replay_writes()["latent/h"][:, 0]
    deter = agent.size.deter
    # independent: the core of a fresh agent of the same seed (the update has changed the
    # weights since) from zeros with the step's action
    fresh, _ = _agent(context=1)
    with torch.no_grad():
        expect = fresh.wm.rssm.core(torch.zeros(2, deter),
                                    torch.zeros(2, fresh.size.stoch, fresh.size.classes),
                                    action[:, 3])
    np.testing.assert_allclose(zero_start, expect.numpy(), rtol=1e-5, atol=1e-5)
    # a window whose first step starts an episode ignores the stored state: same as zeros
    # with no action
    fresh, _ = _agent(context=1)
    fresh.train(_batch(obs, action, latents, start=3, T=4, is_first_at=1))
    again, _ = _agent(context=1)
    with torch.no_grad():
        reset = again.wm.rssm.core(torch.zeros(2, deter),
                                   torch.zeros(2, again.size.stoch, again.size.classes),
                                   torch.zeros(2, action.shape[-1]))
    np.testing.assert_allclose(fresh.replay_writes()["latent/h"][:, 0], reset.numpy(),
                               rtol=1e-5, atol=1e-5)
    assert not np.allclose(reset.numpy(), acted_h[:, 4].numpy(), atol=1e-3)


def test_a_batch_without_latents_is_refused_with_the_fix():
    agent, act = _agent(context=1)
    obs, action, latents, _ = _acted(agent, 6)
    batch = _batch(obs, action, latents, start=0, T=4)
    del batch["latent/h"]
    with pytest.raises(KeyError, match="train.replay_context=0"):
        agent.train(batch)


def test_context_is_the_nature_recipes_and_zero_or_one():
    assert make_config("nature").train.replay_context == 1
    assert make_config("default").train.replay_context == 0
    with pytest.raises(ConfigError, match="learned initial state"):
        make_config(train={"replay_context": 1})
    with pytest.raises(ConfigError, match="must be 0"):
        make_config("nature", train={"replay_context": 2})


def test_a_run_stores_rewrites_and_resumes_with_latents(tmp_path):
    """Prefill steps (random actions) reach the disk without latents; the updates that replay
    them write their posterior latents into the ring; a resumed run reads the chunks back."""
    from lucid.train import Trainer
    cfg = make_config("nature", model={"size": "1m"}, env={"id": "CartPole-v1"},
                      train={"batch_size": 4, "batch_length": 8, "train_ratio": 16,
                             "prefill": 64, "replay_chunk": 32},
                      run={"steps": 160, "logger": "none", "progress": False, "eval_every": 0})
    tr = Trainer(cfg, tmp_path / "run")
    try:
        tr.run()
        assert tr.counters["updates"] > 0
        first = np.load(sorted((tmp_path / "run" / "replay").glob("chunk-*.npz"))[0])
        assert (first["latent/z"][0, :32] == 0).all()  # flushed during the prefill
        ring = tr.replay.data["latent/z"][0]
        acted = ring[64:160]  # the policy's steps got their latents when acted
        assert (acted > 0).all()
        rewritten = (ring[:64] > 0).all(-1).mean()
        assert rewritten > 0.5, rewritten  # most prefill steps were in a window since
    finally:
        tr.close()
    tr = Trainer(cfg, tmp_path / "run", resume=True)
    try:
        assert (tr.replay.data["latent/z"][0, 64:160] > 0).all()
    finally:
        tr.close()


@pytest.mark.parametrize("random", [True, False])
def test_the_prefill_acts_at_random_or_with_the_policy(random, tmp_path):
    """train.prefill_random=false (the Nature suites'): the policy acts from the first step,
    so even the prefill's steps have latents; true: random actions, none stored. Either way
    no update comes before train.prefill steps."""
    from lucid.train import Trainer
    cfg = make_config("nature", model={"size": "1m"}, env={"id": "CartPole-v1"},
                      train={"batch_size": 2, "batch_length": 8, "prefill": 40,
                             "prefill_random": random},
                      run={"steps": 40, "logger": "none", "progress": False, "eval_every": 0})
    with Trainer(cfg, tmp_path / "run") as tr:
        tr.run()
        assert tr.counters["updates"] == 0
        codes = tr.replay.data["latent/z"][0, :40]
        assert (codes == 0).all() if random else (codes > 0).all()


def test_a_replay_group_locates_and_writes_into_its_parts():
    """Ray runners' replay: `_env` numbers the streams of all parts in order, and a write
    reaches the part and stream each row came from."""
    from lucid.replay import ReplayGroup
    parts = [Replay(10, 1, FIELDS, seed=1, optional=("latent/h",)),
             Replay(20, 2, FIELDS, seed=2, optional=("latent/h",))]
    group = ReplayGroup(parts, seed=0)
    for n in range(10):
        for p in parts:
            _add(p, n)
    s = group.sample(64, 4, locate=True)
    assert set(s["_env"]) == {0, 1, 2}  # part 0's stream, then part 1's two
    np.testing.assert_array_equal(s["_step"], s["obs/n"])
    values = np.repeat((1 + 100 * s["_env"][:, None] + s["_step"])[..., None], 3, -1)
    assert group.write(s["_env"], s["_step"], {"latent/h": values.astype(np.float32)}) == 256
    for b, t in np.ndindex(64, 4):
        e, n = s["_env"][b], s["_step"][b, t]
        part, stream = (parts[0], 0) if e == 0 else (parts[1], e - 1)
        assert (part.data["latent/h"][stream, n % part.per_env] == 1 + 100 * e + n).all()


def test_ray_runners_store_the_nature_recipes_latents(tmp_path):
    pytest.importorskip("ray")
    from lucid.train import Trainer
    cfg = make_config("nature-cpu", env={"id": "CartPole-v1"},
                      train={"batch_size": 2, "batch_length": 8, "prefill": 32,
                             "train_ratio": 4, "prefill_random": False},
                      run={"steps": 128, "log_every": 0.0, "progress": False,
                           "run_dir": str(tmp_path), "runners": "ray", "num_runners": 2,
                           "envs_per_runner": 2, "runner_chunk": 8, "ray_num_cpus": 2,
                           "videos": False, "weight_sync_every": 2})
    tr = Trainer(cfg)
    try:
        tr.run()
        assert tr.counters["updates"] > 0
        # steps acted by the runners' policy (once they had weights) came with latents
        for p in tr.replay.parts:
            assert (p.data["latent/z"][:, :p.stored] > 0).all(-1).any()
    finally:
        tr.close()
