"""Extending the agent (docs/extending.md): a subclass of lucid.agent.Agent named in
`model.agent` builds its own networks, which train, checkpoint, resume and evaluate; a
network swapped in after the optimizers were made is refused instead of silently frozen."""

import re
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lucid.agent import Agent, agent_class
from lucid.cli import app
from lucid.config import ConfigError, make_config
from lucid.train import Trainer

# The code of docs/extending.md, as it stands there: a plain torch network (no lucid layers)
# as the actor, which receives dense features, also where imagination keeps z as class
# indices (train.onehot_gather, on by default); and a world model with an extra loss term.
DOC = Path(__file__).resolve().parent.parent / "docs" / "extending.md"
AGENT_FILE, INVERSE_FILE = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def _cfg(run_dir, **model):
    return make_config("default", env={"id": "CartPole-v1"},
                       model={"size": "nano", **model},
                       train={"batch_size": 2, "batch_length": 8, "horizon": 3, "prefill": 20,
                              "train_ratio": 16},
                       run={"steps": 60, "progress": False, "run_dir": str(run_dir),
                            "log_every": 0.0, "videos": False})


def test_a_subclassed_agent_trains_its_own_network_resumes_and_evaluates(tmp_path):
    (tmp_path / "my_agent.py").write_text(AGENT_FILE)
    spec = f"{tmp_path / 'my_agent.py'}:MyAgent"
    tr = Trainer(_cfg(tmp_path / "run", agent=spec))
    assert type(tr.agent).__name__ == "MyAgent"
    head = tr.agent.actor.head
    assert type(head).__name__ == "SmallNet"
    before = [p.detach().clone() for p in head.parameters()]
    tr.run()
    tr.close()
    assert tr.counters["updates"] > 0
    assert all(not torch.equal(a, b) for a, b in zip(before, head.parameters()))  # it trained
    # the run's config names the class: a resume builds the same agent, with its weights
    again = Trainer(make_config("default", run={"steps": 80}), tmp_path / "run", resume=True)
    assert type(again.agent.actor.head).__name__ == "SmallNet"
    for a, b in zip(head.parameters(), again.agent.actor.head.parameters()):
        assert torch.equal(a, b)
    again.run()
    again.close()
    assert again.counters["env_steps"] == 80
    r = CliRunner().invoke(app, ["eval", str(tmp_path / "run"), "--episodes", "1"])
    assert r.exit_code == 0, r.output
    # the file moved with its project: its new path in config.yaml, and the run goes on
    (tmp_path / "moved").mkdir()
    (tmp_path / "my_agent.py").rename(tmp_path / "moved" / "my_agent.py")
    with pytest.raises(ConfigError, match=r"there is no file .*my_agent\.py.*model\.agent"):
        Trainer(make_config("default", run={"steps": 90}), tmp_path / "run", resume=True)
    config = tmp_path / "run" / "config.yaml"
    config.write_text(config.read_text().replace(str(tmp_path / "my_agent.py"),
                                                 str(tmp_path / "moved" / "my_agent.py")))
    moved = Trainer(make_config("default", run={"steps": 90}), tmp_path / "run", resume=True)
    assert type(moved.agent.actor.head).__name__ == "SmallNet"
    moved.close()


@pytest.mark.parametrize("net", ["SmallNet(self.wm.feat_dim, self.config.model.num_bins)",
                                 "Head(self.wm.feat_dim, 16, 1, self.config.model.num_bins)"],
                         ids=["other-network", "same-layout-not-zero"])
def test_a_subclassed_critic_network_gets_a_slow_copy_of_its_own(tmp_path, net):
    """The slow critic starts as a copy of the critic's network as build_critic returned it
    (also of one with the default's layout but other weights: lucid's starts at zero); it
    moves 2% of the way to it per update."""
    (tmp_path / "my_agent.py").write_text(AGENT_FILE + textwrap.dedent(f'''
        from lucid.nets import Head


        class MyCritic(Agent):
            def build_critic(self):
                critic = super().build_critic()
                critic.net = {net}
                return critic
    '''))
    cfg = _cfg("unused", agent=f"{tmp_path / 'my_agent.py'}:MyCritic")
    agent = agent_class(cfg)(*_spaces(), cfg)
    net, slow = agent.critic.net, agent.critic.slow
    assert type(slow) is type(net) and slow is not net
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), slow.parameters()))
    assert not any(p.requires_grad for p in slow.parameters())
    assert {id(p) for g in agent.opt_critic.param_groups for p in g["params"]} == \
        {id(p) for p in net.parameters()}
    before = [p.detach().clone() for p in slow.parameters()]
    agent.train(_batch(agent))
    for s0, f1, s1 in zip(before, net.parameters(), slow.parameters()):
        torch.testing.assert_close(s1, 0.98 * s0 + 0.02 * f1.detach(), atol=1e-7, rtol=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(before, slow.parameters()))


def test_a_world_model_subclass_adds_a_loss_term_that_trains_and_is_logged(tmp_path):
    """docs/extending.md's code: a WorldModel subclass whose loss() adds a term (here an
    inverse-dynamics head: action[t] from the embeddings of obs[t] and obs[t+1]) and names it
    in the metrics; its head trains with the world model and the metric reaches
    metrics.jsonl."""
    import json
    (tmp_path / "inverse.py").write_text(INVERSE_FILE)
    tr = Trainer(_cfg(tmp_path / "run", agent=f"{tmp_path / 'inverse.py'}:InverseAgent"))
    head = tr.agent.wm.inverse
    before = [p.detach().clone() for p in head.parameters()]
    tr.run()
    tr.close()
    assert all(not torch.equal(a, b) for a, b in zip(before, head.parameters()))
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    logged = [r["world_model/inverse"] for r in rows if "world_model/inverse" in r]
    assert logged and all(v > 0 for v in logged)


def test_a_prior_changed_in_prior_logits_reaches_every_path_and_derived_overrides_are_refused():
    from lucid.world_model import WorldModel

    class ClassZero(WorldModel):  # a prior sure of class 0 in every group
        def prior_logits(self, h):
            x = super().prior_logits(h)
            return torch.zeros_like(x).index_fill(-1, torch.tensor([0]), 30.0) + 0 * x

    class Built(Agent):
        def build_world_model(self):
            return ClassZero(self.obs_spec, self.act_spec.dim, self.config.model)

    torch.manual_seed(0)
    agent = Built(*_spaces(), _cfg("unused"))
    wm, batch = agent.wm, _batch(agent)
    h, z, post, prior, _ = wm.observe(wm.encoder(batch["obs"]), batch["action"],
                                      batch["is_first"])
    assert (prior.argmax(-1) == 0).all()  # the KL's prior
    assert (wm.initial(3).z.argmax(-1) == 0).all()  # the initial state's mode
    start_h, start_z = h.flatten(0, 1).detach(), z.flatten(0, 1).detach()
    for gather in (False, True):  # without gradients (REINFORCE), dense and with class indices
        feats, _ = wm.imagine_no_grad(agent.actor, start_h, start_z, 4, gather=gather)
        zs = feats.idx if gather else feats[..., wm.D:].unflatten(-1, (wm.G, wm.K))
        zs = zs if not zs.is_floating_point() else zs.argmax(-1)
        assert (zs[1:] == 0).float().mean() > 0.97  # all but the 1% unimix share
    feats, _ = wm.imagine(lambda f: agent.actor.sample(agent.actor.params(f)), start_h,
                          start_z, 4)
    zs = feats[..., wm.D:].unflatten(-1, (wm.G, wm.K)).argmax(-1)
    assert (zs[1:] == 0).float().mean() > 0.97
    for name, instead in (("prior_logp", "prior_logits"), ("post_logp", "post_logp_split")):
        with pytest.raises(TypeError, match=rf"overrides WorldModel\.{name}.*override {instead}"):
            type("Mine", (WorldModel,), {name: lambda self, *a: None})


SWAPPED = r"actor's parameters are not the ones its optimizer was made over.*Agent\.build_actor"


def test_a_network_swapped_in_after_the_optimizers_were_made_is_refused(tmp_path):
    """At the first update of an agent at hand, and before a run starts (no directory left
    behind, one `error:` line from the CLI) for a subclass that assigns a network after
    Agent.__init__ made the optimizers; one that only adds parameters to an optimizer
    (another param group) is not refused."""
    agent = Agent(*_spaces(), _cfg("unused"))
    agent.actor.head = torch.nn.Linear(agent.wm.feat_dim, 2)  # the optimizer holds the old one
    batch = _batch(agent)
    with pytest.raises(ConfigError, match=SWAPPED + r".*model\.agent"):
        agent.train(batch)
    with pytest.raises(ConfigError, match=SWAPPED):
        agent.check_optimizers()
    (tmp_path / "late.py").write_text(textwrap.dedent("""
        import torch
        from lucid.agent import Agent

        class LateAgent(Agent):
            def __init__(self, *args, **kw):
                super().__init__(*args, **kw)
                self.critic.net.extra = torch.nn.Linear(3, 3)  # after the optimizers

        class MoreAgent(Agent):  # an extra parameter its world-model optimizer steps too
            def __init__(self, *args, **kw):
                super().__init__(*args, **kw)
                self.temperature = torch.nn.Parameter(torch.ones(()))
                self.opt_wm.add_param_group({"params": [self.temperature]})
    """))
    with pytest.raises(ConfigError, match=r"critic's parameters are not the ones its optimizer"):
        Trainer(_cfg(tmp_path / "run", agent=f"{tmp_path / 'late.py'}:LateAgent"))
    assert not (tmp_path / "run").exists()
    r = CliRunner().invoke(app, ["train", "CartPole-v1", "--size", "nano", "--run-dir",
                                 str(tmp_path / "cli"), f"model.agent={tmp_path}/late.py:LateAgent"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "error: the critic's parameters are not the ones" in r.output
    assert not (tmp_path / "cli").exists()
    cfg = _cfg("unused", agent=f"{tmp_path / 'late.py'}:MoreAgent")
    more = agent_class(cfg)(*_spaces(), cfg)
    more.check_optimizers()
    more.train(_batch(more))  # the update's check too


def test_a_checkpoint_of_other_networks_names_what_differs(tmp_path):
    (tmp_path / "my_agent.py").write_text(AGENT_FILE)
    cfg = _cfg("unused", agent=f"{tmp_path / 'my_agent.py'}:MyAgent")
    mine = agent_class(cfg)(*_spaces(), cfg)
    plain = Agent(*_spaces(), _cfg("unused"))
    # nano's actor head: one hidden layer (Linear without bias, LayerNorm) and `out`
    with pytest.raises(ValueError, match=r"this agent's actor: it lacks actor\.head\.mlp\.net"
                                         r"\.0\.weight, actor\.head\.mlp\.net\.1\.bias, "
                                         r"actor\.head\.mlp\.net\.1\.weight; it holds "
                                         r"actor\.head\.inp\.bias, actor\.head\.inp\.weight, "
                                         r"which this agent has not;.*"
                                         r"\(model\.agent=lucid\.agent:Agent\)"):
        plain.load_state_dict(mine.state_dict())
    # the subclass's network edited since (32 -> 48 units): its shapes differ, and the
    # message names model.agent among what must stay as it was (not for lucid's own Agent)
    assert AGENT_FILE.count("32") == 2
    (tmp_path / "wider.py").write_text(AGENT_FILE.replace("32", "48"))
    wider_cfg = _cfg("unused", agent=f"{tmp_path / 'wider.py'}:MyAgent")
    wider = agent_class(wider_cfg)(*_spaces(), wider_cfg)
    with pytest.raises(ValueError, match=r"actor\.head\.inp\.weight has shape \(32, \d+\) there "
                                         r"but \(48, \d+\) here.*and networks of model\.agent="
                                         r".*wider\.py:MyAgent as they were when it was saved"):
        wider.load_state_dict(mine.state_dict())
    other = Agent(*_spaces(), _cfg("unused", size="micro"))
    with pytest.raises(ValueError, match=r"observation/action spaces$"):
        other.load_state_dict(plain.state_dict())


def test_model_agent_must_name_a_subclass_of_agent():
    assert agent_class(_cfg("unused")) is Agent
    with pytest.raises(ConfigError, match=r"model.agent='no_such_module:X' cannot be loaded.*"
                                          r"subclass of lucid.agent.Agent"):
        agent_class(_cfg("unused", agent="no_such_module:X"))
    with pytest.raises(ConfigError, match=r"model.agent='lucid.nets:MLP' is .*MLP.*not a "
                                          r"subclass of lucid.agent.Agent"):
        agent_class(_cfg("unused", agent="lucid.nets:MLP"))


def _spaces():
    import gymnasium as gym
    import numpy as np

    from lucid.envs import ActionSpec, ObsSpec
    return (ObsSpec.from_space(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)),
            ActionSpec.from_space(gym.spaces.Discrete(2)))


def _batch(agent, B=2, T=8):
    g = torch.Generator().manual_seed(0)
    is_first = torch.zeros(B, T, dtype=torch.bool)
    is_first[:, 0] = True
    return {"obs": {"vector": torch.randn(B, T, 4, generator=g)},
            "action": torch.eye(2)[torch.randint(0, 2, (B, T), generator=g)],
            "reward": torch.randn(B, T, generator=g), "is_first": is_first,
            "is_last": torch.zeros(B, T, dtype=torch.bool),
            "is_terminal": torch.zeros(B, T, dtype=torch.bool)}
