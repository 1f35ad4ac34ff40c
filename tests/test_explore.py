"""Plan2Explore (lucid/explore.py, lucid/explore_agent.py): the ensemble's maths against numpy,
its disagreement as a novelty signal, and the isolation of the exploring learners from the
paper's world model, task actor and task critic."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from determinism import deterministic_sampling
from lucid.agent import Agent
from lucid.agents import agent_class
from lucid.config import ConfigError, make_config
from lucid.explore import Disagreement, RunningMean
from lucid.explore_agent import ExploreAgent, Explorer
from lucid.specs import ActionSpec
from test_update_unchanged import ACTIONS, VEC, _batch


def _np_member(params: dict, m: int, x: np.ndarray, layers: int) -> np.ndarray:
    """Member m of the ensemble as a plain loop of numpy layers (LayerNorm eps 1e-3)."""
    h = x
    for i in range(layers):
        h = h @ params[f"net.{3 * i}.weight"][m]
        mu = h.mean(-1, keepdims=True)
        var = h.var(-1, keepdims=True)
        h = (h - mu) / np.sqrt(var + 1e-3)
        h = h * params[f"net.{3 * i + 1}.weight"][m] + params[f"net.{3 * i + 1}.bias"][m]
        h = h / (1.0 + np.exp(-h))  # SiLU
    last = 3 * layers
    return h @ params[f"net.{last}.weight"][m] + params[f"net.{last}.bias"][m]


def _randomized(ens: Disagreement, seed: int = 0) -> Disagreement:
    """Norm scales and biases away from their initial 1 and 0, so that a test sees them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in ens.named_parameters():
            if "bias" in name or name.endswith(("1.weight", "4.weight")):
                p.copy_(p + 0.3 * torch.randn(p.shape, generator=g))
    return ens


def test_ensemble_matches_numpy():
    torch.manual_seed(0)
    M, L, IN, OUT = 4, 2, 7, 5
    ens = _randomized(Disagreement(IN, OUT, members=M, layers=L, units=6))
    x = torch.randn(3, 9, IN, dtype=torch.float64)
    target = torch.randn(3, 9, OUT, dtype=torch.float64)
    mask = torch.rand(3, 9) > 0.3
    ens = ens.double()
    params = {k: v.detach().numpy() for k, v in ens.state_dict().items()}
    ref = np.stack([_np_member(params, m, x.numpy(), L) for m in range(M)])
    np.testing.assert_allclose(ens(x).detach().numpy(), ref, rtol=1e-10, atol=1e-10)
    # the reward: population variance over members, mean over dimensions
    np.testing.assert_allclose(ens.disagreement(x).detach().numpy(),
                               ref.var(0).mean(-1), rtol=1e-10, atol=1e-12)
    # the loss: squared error summed over dimensions and members, mean over kept rows
    err = ((ref - target.numpy()) ** 2).sum(-1).sum(0)
    keep = mask.numpy()
    np.testing.assert_allclose(ens.loss(x, target, mask).item(), err[keep].mean(), rtol=1e-10)
    np.testing.assert_allclose(ens.loss(x, target).item(), err.mean(), rtol=1e-10)


def test_disagreement_zero_when_members_agree_and_grows_with_spread():
    torch.manual_seed(1)
    ens = Disagreement(6, 4, members=5, layers=2, units=8)
    with torch.no_grad():  # every member a copy of member 0
        for p in ens.parameters():
            p.copy_(p[:1].expand_as(p))
    x = torch.randn(20, 6)
    assert ens.disagreement(x).abs().max().item() == 0.0
    offsets = torch.randn(5, 1, 4)  # then members' outputs apart by s * offsets
    out = ens.net[-1].bias
    base = out.detach().clone()
    seen = []
    for s in (0.1, 0.5, 2.0):
        with torch.no_grad():
            out.copy_(base + s * offsets)
        d = ens.disagreement(x)
        expected = (s * offsets).squeeze(1).var(0, unbiased=False).mean()
        torch.testing.assert_close(d, expected.expand(20), rtol=1e-5, atol=1e-7)
        seen.append(d.mean().item())
    assert seen[0] < seen[1] < seen[2]


def test_disagreement_falls_on_trained_inputs():
    """Trained on one region of inputs, the members agree there and not elsewhere: the
    reward of trained inputs falls to a small fraction of its start and of novel ones'."""
    torch.manual_seed(2)
    ens = Disagreement(4, 8, members=8, layers=2, units=64)
    opt = torch.optim.Adam(ens.parameters(), lr=3e-3)
    proj = torch.randn(4, 8)
    seen = torch.randn(256, 4) * 0.5 + 2.0  # the "visited" region
    novel = torch.randn(256, 4) * 0.5 - 2.0
    before = ens.disagreement(seen).mean().item()
    for _ in range(300):
        loss = ens.loss(seen, torch.tanh(seen @ proj))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        trained, new = ens.disagreement(seen).mean().item(), ens.disagreement(novel).mean().item()
    # measured over 5 seeds: trained falls to 0.06-0.1% of `before`, novel inputs stay
    # 1,100-1,900x the trained ones
    assert trained < 0.1 * before, (trained, before)
    assert new > 5 * trained, (new, trained)


def test_running_mean_follows_numpy_and_normalizes():
    """The first batch sets the mean, later ones move it by an EMA (checked against a numpy
    loop), a non-finite batch leaves it, and a stream divided by it averages about 1 whatever
    its scale (the disagreement's is ~1e-4)."""
    rng = np.random.default_rng(0)
    rm, ref = RunningMean(0.9), None
    for i in range(30):
        x = rng.gamma(2.0, 1e-4, size=(15, 16))
        rm.update(torch.tensor(x))
        ref = x.mean() if ref is None else 0.9 * ref + 0.1 * x.mean()
        if i == 0:
            assert rm.value.item() == pytest.approx(x.mean(), rel=1e-6)
    assert rm.value.item() == pytest.approx(ref, rel=1e-5)
    rm.update(torch.tensor([float("nan"), 1.0]))
    assert rm.value.item() == pytest.approx(ref, rel=1e-5)
    x = torch.tensor(rng.gamma(2.0, 1e-4, size=(15, 16)))
    assert rm.normalize(x).mean().item() == pytest.approx(1.0, rel=0.2)
    batch = RunningMean(0.0)  # decay 0: each batch's own mean
    for _ in range(3):
        x = torch.tensor(rng.gamma(2.0, 1e-4, size=(15, 16)))
        batch.update(x)
        assert batch.value.item() == pytest.approx(x.mean().item(), rel=1e-6)
        assert batch.normalize(x).mean().item() == pytest.approx(1.0, rel=1e-6)


def _agents(kind: str, explore: dict | None = None):
    """A plain Agent and an ExploreAgent of the same seed (their shared networks start
    equal: the exploring parts are built after them)."""
    space = ACTIONS[kind]
    act = ActionSpec.from_space(space)
    base = {"model": {"size": "nano"}, "train": {"horizon": 5}}
    out = []
    for method in ("none", "p2e"):
        torch.manual_seed(0)
        cfg = make_config(overrides=[f"explore.method={method}", "explore.units=16"]
                          + [f"explore.{k}={v}" for k, v in (explore or {}).items()], **base)
        out.append(agent_class(cfg)(VEC, act, cfg))
        with torch.no_grad():  # rewards and values that vary (output layers start at 0)
            a = out[-1]
            heads = [a.wm.reward.out, a.critic.net.out]
            if isinstance(a, ExploreAgent):
                heads += [c.net.out for c in a.expl_critics.values()]
            for i, head in enumerate(heads):
                head.weight.copy_(0.5 * torch.randn(head.weight.shape,
                                                    generator=torch.Generator().manual_seed(i)))
    return out[0], out[1], act, space


def _state(modules) -> dict:
    return {f"{name}.{k}": v.detach().clone() for name, m in modules.items()
            for k, v in m.state_dict().items()}


@pytest.mark.parametrize("kind", ["discrete", "box"])
def test_explore_losses_leave_the_task_learners_alone(kind, monkeypatch):
    """Two updates: the world model, task actor, task critic and return norm of the exploring
    agent end exactly as the plain agent's, no gradient of the exploring losses is left on
    them, and the ensemble, explorer and exploration critics did learn. Box actions: the
    explorer learns through the (frozen) dynamics, the ensemble and the critics."""
    deterministic_sampling(monkeypatch.setattr)
    decay = 0.0 if kind == "discrete" else 0.9  # the batch's mean (default), a running one
    plain, explorer, act, space = _agents(kind, {"intr_norm_decay": decay})
    assert isinstance(explorer, ExploreAgent) and type(plain) is Agent
    task = ("world_model", "actor", "critic", "return_norm")
    extra = ("ensemble", "explore_actor", "explore_critics")
    start = _state({k: explorer.modules()[k] for k in extra})
    for update in range(2):
        batch = _batch(act, space, seed=update)
        for agent in (plain, explorer):
            torch.manual_seed(100 + update)  # the task's draws come first in both
            m = agent.train(batch)
        assert m["train/nonfinite_steps"] == 0 and m["explore/intrinsic_reward_mean"] > 0
        # the explorer's reward is the disagreement over its running mean, which the first
        # batch sets (exactly 1 on average then), as does every batch with decay 0
        r, d = m["explore/intrinsic_reward_mean"], m["explore/disagreement_mean"]
        mean = explorer.intr_mean.value.item()
        assert r == pytest.approx(d / mean, rel=1e-4), (update, r, d)
        if update == 0 or decay == 0:
            assert r == pytest.approx(1.0, rel=1e-4) and mean == pytest.approx(d, rel=1e-4)
        else:
            assert mean != pytest.approx(d, rel=1e-3), "a running mean of 0.9 took the batch's"
    mine, theirs = _state({k: explorer.modules()[k] for k in task}), _state(plain.modules())
    assert mine.keys() == theirs.keys()
    for k in mine:
        torch.testing.assert_close(mine[k], theirs[k], rtol=0, atol=0, msg=k)
    for k in task[:3]:
        for name, p in explorer.modules()[k].named_parameters():
            assert p.grad is None, f"{k}.{name} holds a gradient after the update"
    after = _state({k: explorer.modules()[k] for k in extra})
    for prefix in ("ensemble.", "explore_actor.", "explore_critics.intr.net.",
                   "explore_critics.extr.net."):
        moved = [k for k in after if k.startswith(prefix) and not torch.equal(after[k], start[k])]
        assert moved, f"no parameter of {prefix[:-1]} changed"


def _ensemble_rows(monkeypatch, explore: dict, seed: int = 4):
    """The agent, batch, encoder embedding and what one update fed the ensemble's loss."""
    _, agent, act, space = _agents("discrete", explore)
    batch = _batch(act, space, seed=seed)
    with torch.no_grad():
        embed = agent.wm.encoder(batch["obs"])
    seen = {}
    loss = agent.ensemble.loss
    monkeypatch.setattr(agent.ensemble, "loss",
                        lambda x, t, mask=None: seen.update(x=x, t=t, mask=mask) or loss(x, t, mask))
    torch.manual_seed(11)
    agent.train(batch)
    return agent, batch, embed, seen, act


@pytest.mark.parametrize("target", ["embed", "latent"])
def test_the_ensemble_learns_the_next_step_of_the_replay(target, monkeypatch):
    """Its rows are [h_t, z_t, a_t] of the replayed posterior, its targets the next step's
    embedding (the encoder's output before this update) or posterior latent, and the rows
    whose next step starts an episode are masked out."""
    deterministic_sampling(monkeypatch.setattr)
    agent, batch, embed, seen, act = _ensemble_rows(monkeypatch, {"target": target,
                                                                  "inputs": "feat"})
    wm = agent.wm
    B, T = batch["is_first"].shape
    assert seen["x"].shape == (B, T - 1, wm.feat_dim + act.dim)
    torch.testing.assert_close(seen["x"][..., wm.feat_dim:], batch["action"][:, :-1])
    assert seen["mask"].tolist() == (~batch["is_first"][:, 1:]).tolist()
    if target == "embed":
        torch.testing.assert_close(seen["t"], embed[:, 1:], rtol=1e-5, atol=1e-5)
    else:  # straight-through one-hots: G groups of K, one 1 each
        z = seen["t"].reshape(B, T - 1, wm.G, wm.K)
        torch.testing.assert_close(z.max(-1).values, torch.ones(B, T - 1, wm.G))
        torch.testing.assert_close(z.sum(-1), torch.ones(B, T - 1, wm.G))


def test_the_ensemble_can_read_h_alone(monkeypatch):
    """explore.inputs=deter (the default): the members read [h_t, a_t], the same h and
    actions as the [h_t, z_t, a_t] rows of explore.inputs=feat, and are built that wide; in
    imagination too (a wrong width would fail there)."""
    deterministic_sampling(monkeypatch.setattr)
    full, _, _, rows, _ = _ensemble_rows(monkeypatch, {"inputs": "feat"})
    agent, batch, _, seen, act = _ensemble_rows(monkeypatch, {})
    D = agent.wm.D
    B, T = batch["is_first"].shape
    assert agent.ensemble.net[0].weight.shape[-2:] == (D + act.dim, 16)
    assert full.ensemble.net[0].weight.shape[-2:] == (full.wm.feat_dim + act.dim, 16)
    assert seen["x"].shape == (B, T - 1, D + act.dim)
    torch.testing.assert_close(seen["x"][..., :D], rows["x"][..., :D], rtol=0, atol=0)
    torch.testing.assert_close(seen["x"][..., D:], batch["action"][:, :-1])
    torch.testing.assert_close(seen["t"], rows["t"], rtol=0, atol=0)


def test_each_optimizer_holds_only_its_own_parameters():
    _, agent, _, _ = _agents("discrete")
    owners = {"world_model": agent.wm, "actor": agent.actor, "critic": agent.critic.net,
              "ensemble": agent.ensemble, "explore_actor": agent.explorer,
              "explore_critic_intr": agent.expl_critics["intr"].net,
              "explore_critic_extr": agent.expl_critics["extr"].net}
    opts = agent.optimizers()
    assert opts.keys() == owners.keys()
    seen: set = set()
    for name, opt in opts.items():
        held = {id(p) for g in opt.param_groups for p in g["params"]}
        assert held == {id(p) for p in owners[name].parameters()}, name
        assert not held & seen, f"{name} shares parameters with another optimizer"
        seen |= held


def test_which_policy_acts_follows_the_phase():
    _, agent, act, _ = _agents("discrete", {"reward_free_steps": 100, "then": "task"})
    assert isinstance(agent.acting(0), Explorer) and agent.reward_free.item() == 1.0
    assert isinstance(agent.acting(99), Explorer)
    assert agent.acting(100) is agent and agent.reward_free.item() == 0.0
    assert not agent.exploring
    # the explorer acts with its own actor: make the two actors choose differently
    with torch.no_grad():
        agent.actor.head.out.bias.copy_(torch.tensor([9.0, 0.0, 0.0]))
        agent.explorer.head.out.bias.copy_(torch.tensor([0.0, 0.0, 9.0]))
    obs = {"vector": torch.zeros(4, 4)}
    task, _ = agent.policy(obs, explore=False)
    explore, _ = agent.acting(0).policy(obs, explore=False)
    assert task.argmax(-1).tolist() == [0] * 4 and explore.argmax(-1).tolist() == [2] * 4
    _, always, _, _ = _agents("discrete", {"reward_free_steps": 100})  # then=explore
    assert isinstance(always.acting(10_000), Explorer) and always.reward_free.item() == 0.0


def test_extrinsic_weight_is_zero_in_the_reward_free_phase(monkeypatch):
    """In the phase the explorer's advantage is the intrinsic one alone: with the extrinsic
    critic's values scaled 1000x (so any share of its advantage would show), its actor
    loss is unchanged; after the phase it changes."""
    deterministic_sampling(monkeypatch.setattr)
    _, agent, act, space = _agents("discrete", {"reward_free_steps": 10})
    batch = _batch(act, space, seed=3)

    def explorer_loss(phase_steps: int, scale_extr: float) -> float:
        a = _agents("discrete", {"reward_free_steps": 10})[1]
        with torch.no_grad():
            a.expl_critics["extr"].net.out.weight.mul_(scale_extr)
            a.expl_critics["extr"].slow.load_state_dict(a.expl_critics["extr"].net.state_dict())
        a.acting(phase_steps)
        torch.manual_seed(7)
        return a.train(batch)["explore/actor_loss"]

    assert explorer_loss(0, 1.0) == pytest.approx(explorer_loss(0, 1000.0), rel=1e-6)
    assert explorer_loss(10, 1.0) != pytest.approx(explorer_loss(10, 1000.0), rel=1e-3)


def test_the_explorer_has_its_own_entropy_scale(monkeypatch):
    """explore.entropy weighs the exploration actor's entropy bonus alone: its loss moves
    linearly with the scale, and the task actor's loss does not move."""
    deterministic_sampling(monkeypatch.setattr)
    losses = {}
    for scale in (0.0, 1.0, 2.0):
        _, agent, act, space = _agents("discrete", {"entropy": scale})
        torch.manual_seed(7)
        m = agent.train(_batch(act, space, seed=3))
        losses[scale] = (m["explore/actor_loss"], m["actor/loss"])
    step = losses[1.0][0] - losses[0.0][0]
    assert step < -1e-3  # a bonus: more entropy scale, lower loss
    assert losses[2.0][0] - losses[0.0][0] == pytest.approx(2 * step, rel=1e-4)
    assert losses[0.0][1] == losses[1.0][1] == losses[2.0][1]


def test_checkpoint_round_trip_and_refusal():
    _, agent, act, space = _agents("discrete")
    torch.manual_seed(5)
    agent.train(_batch(act, space, seed=1))
    state = agent.state_dict()
    assert {"ensemble", "explore_actor", "explore_critics",
            "explore_return_norms", "explore_intr_mean"} <= state["modules"].keys()
    assert state["modules"]["explore_intr_mean"]["value"] > 0
    _, fresh, _, _ = _agents("discrete")
    fresh.load_state_dict(state)
    assert _state(fresh.modules()).keys() == _state(agent.modules()).keys()
    for k, v in _state(agent.modules()).items():
        assert torch.equal(v, _state(fresh.modules())[k]), k
    plain = _agents("discrete")[0].state_dict()
    with pytest.raises(ValueError, match="explore.method=p2e"):
        fresh.load_state_dict(plain)


@pytest.mark.parametrize("overrides, message", [
    (["explore.method=p2x"], "explore.method must be one of none, p2e"),
    (["explore.target=obs"], "explore.target must be 'embed' or 'latent'"),
    (["explore.inputs=h"], "explore.inputs must be 'feat' or 'deter'"),
    (["explore.method=p2e", "explore.then=task"], "never lets the exploration policy act"),
    (["explore.method=p2e", "explore.intr_scale=0"], "explore.intr_scale must be > 0"),
    (["explore.method=p2e", "explore.members=1"], "explore.members must be >= 2"),
    (["explore.entropy=-1"], "explore.entropy must be >= 0"),
    (["explore.intr_norm_decay=1"], "explore.intr_norm_decay must be in [0, 1)"),
    (["explore.method=p2e", "model.recipe=nature", "model.size=1m"], "2023 recipe"),
    (["explore.method=p2e", "run.runners=ray"], "run.runners=local"),
])
def test_bad_explore_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_config(overrides=overrides)


def test_a_p2e_run_logs_who_acted_and_resumes(tmp_path):
    """`lucid train` with explore.method=p2e: the explorer acts in the reward-free phase and
    the task policy after it (explore/explorer_acts in the metric rows), the exploring
    learners' metrics are logged, and a resume restores the ensemble and the explorer."""
    from lucid.train import Trainer
    run = tmp_path / "run"
    cfg = make_config("default", overrides=[
        "env.id=CartPole-v1", "model.size=nano", "train.batch_size=4", "train.batch_length=8",
        "train.horizon=5", "train.prefill=40", "train.train_ratio=8", "run.steps=200",
        "run.log_every=0", "run.progress=false", "run.logger=none", "run.videos=false",
        f"run.run_dir={run}", "explore.method=p2e", "explore.units=16",
        "explore.reward_free_steps=120", "explore.then=task"])
    with Trainer(cfg) as tr:
        tr.run()
        ensemble = _state({"e": tr.agent.ensemble, "x": tr.agent.explorer})
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    acts = [(r["env_steps"], r["explore/explorer_acts"]) for r in rows
            if "explore/explorer_acts" in r]
    assert acts and {a for s, a in acts if s <= 120} == {1.0}, acts
    assert {a for s, a in acts if s > 130} == {0.0}, acts
    assert all(r["explore/intrinsic_reward_mean"] > 0 for r in rows
               if "explore/intrinsic_reward_mean" in r)
    resumed = Trainer(make_config("default", overrides=["run.steps=220"]), run, resume=True)
    with resumed:
        again = _state({"e": resumed.agent.ensemble, "x": resumed.agent.explorer})
        assert isinstance(resumed.agent, ExploreAgent)
        for k, v in ensemble.items():
            assert torch.equal(v, again[k]), k
        resumed.run()
    assert resumed.counters["env_steps"] >= 220


def test_sparse_room_rewards_only_the_far_corner_and_counts_cells():
    """examples/sparse_room.py, the exploration benchmark's env: the far corner alone pays
    (and ends the episode), walls hold, coordinates span [-1, 1], `cells_seen` counts the
    distinct cells over every episode, and `lucid check` accepts it."""
    from typer.testing import CliRunner

    from examples.sparse_room import SparseRoom
    from lucid.cli import app
    env = SparseRoom(size=5, max_steps=12)
    obs, info = env.reset(seed=0)
    assert obs.tolist() == [-1.0, -1.0] and info["cells_seen"] == 1
    _, r, term, trunc, info = env.step(1)  # into the wall: stays at (0, 0)
    assert (r, term, trunc, info["cells_seen"], env.pos.tolist()) == (0.0, False, False, 1, [0, 0])
    rewards = []
    for a in [0] * 4 + [2] * 3:  # up to (0, 4), right to (3, 4): no reward yet
        _, r, term, _, info = env.step(a)
        rewards.append(r)
        assert not term
    assert rewards == [0.0] * 7 and info["cells_seen"] == 8
    obs, r, term, trunc, info = env.step(2)  # (4, 4): the far corner, at step 9 of 12
    assert obs.tolist() == [1.0, 1.0] and (r, term, trunc) == (1.0, True, False)
    env.reset()
    for _ in range(12):
        *_, trunc, info = env.step(0)
    assert trunc and info["cells_seen"] == 9  # the episodes' cells counted together
    r = CliRunner().invoke(app, ["check", "examples/sparse_room.py:SparseRoom", "--steps", "50"])
    assert r.exit_code == 0 and "ok: lucid can train" in r.output, r.output
