"""The Nature recipe's agent (lucid/nature_agent.py): one update over every action and
observation space, gradients kept where the authors' stop-gradients put them, non-finite
steps skipped, state saved and loaded. Its losses are tests/test_nature_losses.py's, its
networks tests/test_nature_model.py's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lucid.config import make_config
from lucid.nature_agent import NatureAgent, NatureSettings
from lucid.nature_losses import image_loss, vector_loss
from lucid.specs import ActionSpec
from test_update_unchanged import ACTIONS, IMG, VEC, _batch

CASES = {"discrete": ("discrete", False), "box": ("box", False), "mixed": ("mixed", False),
         "image": ("discrete", True)}


def _agent(kind, image, seed=0, **train):
    torch.manual_seed(seed)
    act = ActionSpec.from_space(ACTIONS[kind])
    # windows from the zero state: the replay context has its own tests
    # (tests/test_replay_context.py)
    cfg = make_config("nature", model={"size": "1m"},
                      train={"lr_warmup": 0, "model_lr": 1e-3, "replay_context": 0, **train})
    return NatureAgent(IMG if image else VEC, act, cfg), act


@pytest.mark.parametrize("case", list(CASES))
def test_one_update_trains_every_network(case):
    kind, image = CASES[case]
    agent, act = _agent(kind, image)
    before = {n: p.detach().clone() for n, p in _named(agent)}
    slow = [p.detach().clone() for p in agent.critic.slow.parameters()]
    # two updates: the reward and value heads' hidden layers get gradients once their output
    # layers, zero at the start (output scale 0), are not
    for seed in (1, 2):
        m = agent.train(_batch(act, ACTIONS[kind], seed=seed, image=image))
        assert all(math.isfinite(v) for v in m.values()) and m["train/nonfinite_steps"] == 0
    unchanged = [n for n, p in _named(agent) if torch.equal(p, before[n])]
    assert not unchanged, unchanged
    # the slow critic moved 2% toward the critic (which started equal to it)
    assert any(not torch.equal(a, b) for a, b in zip(slow, agent.critic.slow.parameters()))
    assert agent.updates == 2
    obs = {"vector": torch.randn(3, 4)}
    if image:
        obs["image"] = torch.randint(0, 256, (3, 16, 16, 3), dtype=torch.uint8)
    action, state = agent.policy(obs)
    assert action.shape == (3, act.dim) and state.h.shape == (3, agent.size.deter)


def _named(agent):
    for name, m in (("wm", agent.wm), ("actor", agent.actor), ("critic", agent.critic.net)):
        for n, p in m.named_parameters():
            yield f"{name}.{n}", p


def _grads(agent, batch, scales):
    agent.s.scales = tuple(scales.items())
    torch.manual_seed(5)
    opt_step = agent.opt.step
    agent.opt.step = lambda: None  # gradients only
    try:
        agent.train_step(batch)
    finally:
        agent.opt.step = opt_step
    return {n: p.grad.clone() for n, p in _named(agent) if p.grad is not None}


def test_imagination_trains_the_actor_and_critic_only():
    """With the policy and value losses' scales at 0 the world model's gradient is the same:
    no gradient of the imagined rows reaches it (the authors' sg around imagined states);
    the actor's gradient comes from the policy loss alone."""
    agent, act = _agent("discrete", False)
    for seed in (6, 7):  # output layers away from zero (reward, value) so gradients pass
        agent.train(_batch(act, ACTIONS["discrete"], seed=seed))
    batch = _batch(act, ACTIONS["discrete"], seed=2)
    base = {"dyn": 1.0, "rep": 0.1, "rec": 1.0, "rew": 1.0, "con": 1.0, "repval": 0.3}
    full = _grads(agent, batch, {**base, "policy": 1.0, "value": 1.0})
    none = _grads(agent, batch, {**base, "policy": 0.0, "value": 0.0})
    for n, g in full.items():
        if n.startswith("wm."):
            assert torch.allclose(g, none[n], rtol=1e-4, atol=1e-5), n  # float order only
    assert all(not none[n].any() for n in none if n.startswith("actor."))
    assert any(full[n].abs().sum() > 0 for n in full if n.startswith("actor."))
    # the replay value loss reaches the world model (repval_grad)
    no_rep = _grads(agent, batch, {**base, "repval": 0.0, "policy": 0.0, "value": 0.0})
    assert any(not torch.allclose(none[n], no_rep[n]) for n in none if n.startswith("wm."))


@pytest.mark.parametrize("case", ["box", "image"])
def test_bf16_runs_the_networks_in_bf16_and_keeps_outputs_losses_and_state_fp32(case):
    """train.precision=bf16: every linear and convolution of the world model and actor runs
    in bf16, while what the losses read (logits, heads, actor, h) and the losses are fp32, as are
    parameters, optimizer state and the latents written back. From the same parameters and
    random numbers the first update's metrics are fp32's within bf16's rounding: measured up
    to 1.0% apart over the four action and image cases (the bar: 3%, or 0.01 near 0); a loss
    computed in bf16 (the two-hot mean's matmul under autocast) would read 2^-8 steps."""
    kind, image = CASES[case]
    metrics = {}
    for precision in ("fp32", "bf16"):
        agent, act = _agent(kind, image, precision=precision)
        seen = set()
        for m in [*agent.wm.modules(), *agent.actor.modules()]:
            if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):
                m.register_forward_hook(lambda m, i, out: seen.add(out.dtype))
        torch.manual_seed(7)
        metrics[precision] = agent.train(_batch(act, ACTIONS[kind], seed=1, image=image))
        assert seen == {torch.bfloat16 if precision == "bf16" else torch.float32}
    for k, v in metrics["fp32"].items():
        assert metrics["bf16"][k] == pytest.approx(v, rel=3e-2, abs=1e-2), k
    feat = torch.randn(5, agent.wm.feat_dim)
    h = torch.randn(5, agent.size.deter)
    z = torch.zeros(5, agent.size.stoch, agent.size.classes)
    with agent.autocast():
        logits, normal = agent._policy_parts(feat)
        outs = [agent.wm.reward(feat), agent.wm.cont(feat), agent.critic.net(feat),
                agent.wm.rssm.prior_logits(h), agent.wm.rssm.core(h, z, torch.zeros(5, act.dim)),
                *logits, *(normal or ())]
    batch = _batch(act, ACTIONS[kind], seed=2, image=image)
    losses, *states = agent._world_model(batch, agent.initial(batch["reward"].shape[0]))
    outs += [*losses.values(), *states,  # the decoder's losses, alone too:
             image_loss(torch.rand(2, 4, 4, 3, dtype=torch.bfloat16),
                        torch.zeros(2, 4, 4, 3, dtype=torch.uint8)),
             vector_loss(torch.rand(2, 4, dtype=torch.bfloat16), torch.zeros(2, 4))]
    assert {o.dtype for o in outs} == {torch.float32}
    state = [*agent.trained_parameters(), *agent.critic.slow.parameters(),
             *(v for st in agent.opt.state.values() for v in st.values() if torch.is_tensor(v))]
    assert {t.dtype for t in state} == {torch.float32}


def test_a_nonfinite_batch_changes_nothing():
    agent, act = _agent("box", False)
    batch = _batch(act, ACTIONS["box"], seed=3)
    batch["reward"][0, 2] = math.nan
    before = [p.detach().clone() for p in agent.trained_parameters()]
    slow = [p.detach().clone() for p in agent.critic.slow.parameters()]
    m = agent.train(batch)
    assert m["train/nonfinite_steps"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, agent.trained_parameters()))
    assert all(torch.equal(a, b) for a, b in zip(slow, agent.critic.slow.parameters()))


def test_state_saves_loads_and_refuses_the_other_recipe():
    agent, act = _agent("mixed", False)
    agent.train(_batch(act, ACTIONS["mixed"], seed=4))
    other, _ = _agent("mixed", False, seed=9)
    other.load_state_dict(agent.state_dict())
    obs = {"vector": torch.randn(2, 4)}
    acts = []
    for a in (agent, other):
        torch.manual_seed(0)  # the posterior's sample
        acts.append(a.policy(obs, explore=False)[0])
    assert torch.equal(*acts)
    assert other.updates == 1
    with pytest.raises(ValueError, match="2023 recipe"):
        other.load_state_dict({"modules": {}, "optimizers": {}})


def test_the_nature_preset_gives_the_authors_settings():
    s = NatureSettings.of(make_config("nature"))
    assert (s.lr, s.agc, s.eps, s.warmup) == (4e-5, 0.3, 1e-20, 1000)
    assert s.horizon == 15 and s.discount_horizon == pytest.approx(333.0)
    assert (s.lam, s.actent, s.slowreg, s.slow_rate) == (0.95, 3e-4, 1.0, 0.02)
    assert (s.unimix, s.free_nats, s.minstd, s.maxstd) == (0.01, 1.0, 0.1, 1.0)
    assert dict(s.scales) == {"dyn": 1.0, "rep": 0.1, "rec": 1.0, "rew": 1.0, "con": 1.0,
                              "policy": 1.0, "value": 1.0, "repval": 0.3}


def test_the_recipe_is_chosen_by_the_config_and_checked():
    from lucid.agent import Agent
    from lucid.agents import agent_class
    from lucid.config import ConfigError
    assert agent_class(make_config("nature")) is NatureAgent
    assert agent_class(make_config("default")) is Agent
    with pytest.raises(ConfigError, match="not a size of model.recipe=nature"):
        make_config("nature", model={"size": "XS"})
    with pytest.raises(ConfigError, match="did you mean 'nature'"):
        make_config(model={"recipe": "natur"})
    with pytest.raises(ConfigError, match="takes its sizes whole"):
        make_config("nature", model={"gru_units": 64})
    with pytest.raises(ConfigError, match="leave model.agent empty"):
        agent_class(make_config("nature", model={"agent": "x:Y"}))


def test_lucid_train_eval_and_resume_a_nature_run(tmp_path):
    import json

    from typer.testing import CliRunner

    from lucid.cli import app
    runner = CliRunner()
    d = tmp_path / "run"
    quick = ["train.batch_size=4", "train.batch_length=16", "train.train_ratio=16",
             "train.prefill=300", "run.logger=none", "run.progress=false"]
    r = runner.invoke(app, ["train", "CartPole-v1", "--preset", "nature", "--size", "1m",
                            "--steps", "600", "--run-dir", str(d), *quick])
    assert r.exit_code == 0, r.output
    done = json.loads(r.output.split("done: ", 1)[1])
    assert done["updates"] > 0 and (d / "report.html").exists()
    r = runner.invoke(app, ["eval", str(d), "--episodes", "2"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["episodes"] == 2
    r = runner.invoke(app, ["train", "--resume", str(d), "--steps", "800"])
    assert r.exit_code == 0, r.output
    again = json.loads(r.output.split("done: ", 1)[1])
    assert again["env_steps"] == 800 and again["updates"] > done["updates"]
    r = runner.invoke(app, ["dream", str(d), "--out", str(tmp_path / "dream.mp4")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "dream.mp4").stat().st_size > 0
    r = runner.invoke(app, ["export", str(d), "--out", str(tmp_path / "p.onnx")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "p.json").read_text())["recipe"] == "nature"
    # the Python API serves the recipe: load, act with a state, evaluate, save, resume
    from lucid import Dreamer
    agent = Dreamer.load(d)
    obs = np.zeros(4, np.float32)
    action, state = agent.predict(obs)
    assert action in (0, 1) and state.h.shape == (1, agent.agent.size.deter)
    action, state = agent.predict(obs, state)  # the state carries over
    with pytest.raises(TypeError, match="takes the state a previous predict returned"):
        agent.predict(obs, state=("h", "z"))
    assert len(agent.evaluate(episodes=1)) == 1
    agent.save(tmp_path / "agent.pt")
    again = Dreamer.load(tmp_path / "agent.pt")
    torch.manual_seed(0)  # the posterior's z is a sample, greedy actions or not
    a1, s1 = again.predict(np.ones((3, 4), np.float32))
    torch.manual_seed(0)
    a2, s2 = agent.predict(np.ones((3, 4), np.float32))
    assert torch.equal(s1.h, s2.h) and torch.equal(s1.z, s2.z)
    np.testing.assert_array_equal(a1, a2)
    with Dreamer.load(d, resume=True) as going_on:
        going_on.learn(100)
        assert going_on.trainer.counters["env_steps"] == 900


def test_dreamer_trains_the_nature_recipe(tmp_path):
    from lucid import Dreamer
    with Dreamer("CartPole-v1", preset="nature-cpu", run_dir=tmp_path / "run",
                 model__size="1m", train__prefill=100, train__batch_size=4,
                 train__batch_length=16, run__logger="none") as agent:
        agent.learn(300)
        assert agent.trainer.counters["updates"] > 0
        assert isinstance(agent.agent, NatureAgent)
