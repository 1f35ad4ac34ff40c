"""Several seeds in one batched update (lucid/batched.py) against K separate single-seed agents.

The exactness guard: K agents of different initializations, each with its own batch, updated
by `BatchedAgents.train` give each seed the losses, metrics and parameters that the same agent
updated alone gets (deterministic sampling, tests/determinism.py, so both draw the same
samples). The tolerance, 2e-4 relative on metrics and 1e-4 absolute on parameters after three
updates, admits the reassociation of batched matrix products (measured worst: 7e-5 on a
grad norm), not a changed term: a seed that took another seed's batch or gradient, or a
gradient clipped over all seeds, is off by far more (the test with a NaN batch shows seeds
kept apart).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from determinism import deterministic_sampling
from lucid.agent import Agent
from lucid.batched import BatchedAgents, batches_by_default, stack_batches
from lucid.config import make_config
from lucid.specs import ActionSpec
from test_update_unchanged import ACTIONS, CASES, IMG, VEC, _batch

K = 3


def _agent(seed: int, kind: str, train: dict, image: bool) -> Agent:
    torch.manual_seed(seed)
    cfg = make_config(model={"size": "nano"}, train={"horizon": 5, **train})
    agent = Agent(IMG if image else VEC, ActionSpec.from_space(ACTIONS[kind]), cfg)
    with torch.no_grad():  # rewards and values that vary (the output layers start at zero)
        for head in (agent.wm.reward.out, agent.critic.net.out, agent.critic.slow.out):
            head.weight.normal_(0, 0.5)
    return agent


def _pair(case: str, monkeypatch):
    kind, train = CASES[case]
    deterministic_sampling(monkeypatch.setattr)
    image = case.startswith("image")
    singles = [_agent(k, kind, train, image) for k in range(K)]
    batched = BatchedAgents([_agent(k, kind, train, image) for k in range(K)], vmap=True)
    space = ACTIONS[kind]
    act = ActionSpec.from_space(space)

    def batches(update: int) -> list[dict]:
        return [_batch(act, space, seed=10 * update + k, image=image) for k in range(K)]
    return singles, batched, batches


def _params(agent: Agent) -> dict[str, torch.Tensor]:
    return {f"{m}.{n}": t.detach().clone() for m, module in agent.modules().items()
            for n, t in module.state_dict().items() if t.is_floating_point()}


def _equals_separate(singles, batched: BatchedAgents, batches, rtol=lambda name: 0.0):
    """Three updates, batched and separate: each seed's metrics agree (rel 2e-4), then its
    parameters (abs 1e-4; `rtol(name)` relative), and the seeds stayed apart."""
    for update in range(3):
        bs = batches(update)
        got = batched.train(stack_batches(bs))
        assert len(got) == K
        for k in range(K):
            want = singles[k].train(bs[k])
            assert sorted(got[k]) == sorted(want)
            for name, v in want.items():
                assert got[k][name] == pytest.approx(v, rel=2e-4, abs=1e-6), \
                    f"update {update}, seed {k}: {name}"
    for k in range(K):
        mine, theirs = _params(batched.agents[k]), _params(singles[k])
        assert mine.keys() == theirs.keys()
        for name, v in theirs.items():
            assert torch.allclose(mine[name], v, rtol=rtol(name), atol=1e-4), \
                f"seed {k}: {name}"
        assert batched.agents[k].updates == singles[k].updates == 3
    # the seeds learned apart: different initializations stay different
    a, b = _params(batched.agents[0]), _params(batched.agents[1])
    assert any(not torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("case", list(CASES))
def test_batched_update_equals_separate_updates(case, monkeypatch):
    _equals_separate(*_pair(case, monkeypatch))


def test_a_nonfinite_batch_skips_only_its_seed(monkeypatch):
    singles, batched, batches = _pair("discrete", monkeypatch)
    before = [_params(a) for a in batched.agents]
    bs = batches(0)
    bs[1]["reward"] = bs[1]["reward"].clone()
    bs[1]["reward"][0, 3] = math.nan
    got = batched.train(stack_batches(bs))
    assert got[1]["train/nonfinite_steps"] >= 1  # the world model's step, at least
    assert got[0]["train/nonfinite_steps"] == got[2]["train/nonfinite_steps"] == 0
    after = _params(batched.agents[1])
    for name in before[1]:
        if name.startswith("world_model."):
            assert torch.equal(after[name], before[1][name]), name
    for k in (0, 2):  # the other seeds took their ordinary step
        want = singles[k].train(bs[k])
        assert got[k]["world_model/loss"] == pytest.approx(want["world_model/loss"], rel=2e-4)
        mine, theirs = _params(batched.agents[k]), _params(singles[k])
        for name, v in theirs.items():
            assert torch.allclose(mine[name], v, rtol=0, atol=1e-4), f"seed {k}: {name}"


def test_each_seed_saves_and_loads_as_a_single_agent(monkeypatch):
    _, batched, batches = _pair("box-dynamics", monkeypatch)
    for update in range(2):
        batched.train(stack_batches(batches(update)))
    obs = {"vector": torch.randn(5, 4)}
    for k, agent in enumerate(batched.agents):
        state = agent.state_dict()
        fresh = _agent(100 + k, "box", {}, image=False)
        fresh.load_state_dict(state)
        assert fresh.updates == 2
        with torch.no_grad():
            a1, _ = agent.policy(obs, explore=False)
            a2, _ = fresh.policy(obs, explore=False)
        assert torch.equal(a1, a2)
        # the optimizer state goes with it: Adam's moments of this seed
        moments = [s["exp_avg"] for s in agent.opt_actor.state.values()]
        loaded = [s["exp_avg"] for s in fresh.opt_actor.state.values()]
        assert len(moments) == len(loaded) > 0
        assert all(torch.equal(m, n) for m, n in zip(moments, loaded))


def test_an_agent_loaded_before_batching_keeps_its_state(monkeypatch):
    """Resume: K agents loaded from their checkpoints, then batched, go on from there."""
    singles, _, batches = _pair("discrete", monkeypatch)
    singles[0].train(batches(0)[0])
    state = singles[0].state_dict()
    fresh = [_agent(50 + k, "discrete", {}, image=False) for k in range(2)]
    fresh[0].load_state_dict(state)
    batched = BatchedAgents(fresh, vmap=True)
    bs = batches(1)[:2]
    got = batched.train(stack_batches(bs))
    want = singles[0].train(bs[0])
    assert got[0]["world_model/loss"] == pytest.approx(want["world_model/loss"], rel=2e-4)
    assert got[0]["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=2e-4)


def test_agents_that_differ_are_refused():
    a = _agent(0, "discrete", {}, image=False)
    b = _agent(1, "box", {}, image=False)
    with pytest.raises(ValueError, match="same class, spaces"):
        BatchedAgents([a, b])


def test_the_compiled_batched_update_equals_separate_updates(monkeypatch):
    """train.compile with the batched update (vmap): each batched step compiled as a whole
    gives each seed the metrics and parameters of the same agent updated alone and eager,
    at the tolerance above. Box actions through the dynamics with the replay value loss:
    the actor's and the critic's backward passes both go through imagination's compiled
    node, the critic's replay loss takes the posterior states detached from the world
    model's."""
    singles, _, batches = _pair("box-replay-value", monkeypatch)
    kind, train = CASES["box-replay-value"]
    agents = [_agent(k, kind, {**train, "compile": True}, image=False) for k in range(K)]
    batched = BatchedAgents(agents, vmap=True)
    assert batched.compiled
    _equals_separate(singles, batched, batches)


def test_the_graph_leaves_batching_to_the_device():
    """Under train.cuda_graph the seeds batch where they would without it: the batched update
    is captured as one graph (tests/test_cuda_graph.py), or each agent's own in turn."""
    t = make_config(train={"cuda_graph": True, "batch_size": 2, "batch_length": 8}).train
    for graph in (True, False):
        g = dataclasses.replace(t, cuda_graph=graph)
        assert batches_by_default(torch.device("cuda"), g)
        assert batches_by_default(torch.device("cpu"), g)
        assert not batches_by_default(torch.device("cpu"), dataclasses.replace(
            g, batch_size=16, batch_length=64))


def test_agents_updated_in_turn_equal_separate_updates(monkeypatch):
    """The mode a CPU takes for large batches (BatchedAgents(vmap=False)): the same results."""
    singles, _, batches = _pair("box-dynamics", monkeypatch)
    turn = BatchedAgents([_agent(k, "box", {}, image=False) for k in range(K)], vmap=False)
    for update in range(2):
        bs = batches(update)
        got = turn.train(stack_batches(bs))
        for k in range(K):
            want = singles[k].train(bs[k])
            assert got[k] == pytest.approx(want, rel=1e-6, abs=1e-7)
    assert [a.updates for a in turn.agents] == [2] * K


def test_the_nature_recipes_seeds_batch_as_separate_updates(monkeypatch):
    """The Nature recipe's agents (one loss, one LaProp step: `loss` under vmap, then each
    agent's `apply`): K seeds batched give each seed the metrics and parameters of the same
    agent updated alone, over three updates, at the tolerance above; the slow critics and
    return normalisers move per seed. (Each seed's latents reach its own replay:
    tests/test_multiseed.py.)"""
    from lucid.nature_agent import NatureAgent

    deterministic_sampling(monkeypatch.setattr)
    space = ACTIONS["discrete"]
    act = ActionSpec.from_space(space)

    def agent(seed):
        torch.manual_seed(seed)
        cfg = make_config("nature", model={"size": "1m"},
                          train={"horizon": 5, "lr_warmup": 0, "replay_context": 0})
        a = NatureAgent(VEC, act, cfg)
        with torch.no_grad():  # rewards and values that vary (the output layers start at 0),
            # kept small: the symexp bins reach 5e8, where 2023's symlog bins end at 20
            for head in (a.wm.reward.out, a.critic.net.out, a.critic.slow.out):
                head.weight.normal_(0, 0.02)
        return a

    singles = [agent(k) for k in range(K)]
    batched = BatchedAgents([agent(k) for k in range(K)], vmap=True)
    # the return normaliser's percentiles: returns read through symexp bins (up to 5e8)
    # carry rounding as the metrics do
    _equals_separate(singles, batched,
                     lambda update: [_batch(act, space, seed=10 * update + k) for k in range(K)],
                     rtol=lambda name: 2e-4 if name.startswith("return_norm.") else 0.0)
