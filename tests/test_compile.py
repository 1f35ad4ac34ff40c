"""`train.compile`: compiled and eager updates give the same losses on the same batch.

Both agents start from the same parameters and the same RNG state, so they draw the same
samples (sampling stays eager); only floating-point rounding of the fused kernels may differ.
Kept small (nano, B=4, T=4, H=3), with observe's loop in chunks of 2 steps instead of 8, so
that a batch runs through two chunks, which must share one compiled graph. Compiling is what
costs: on the project's 2-core CPU, with inductor's on-disk cache (/tmp/torchinductor_$USER)
cold, ~170-190 s for the vector case with the C++ wrappers of `train.cpp_wrapper` (the
default), ~120 s for the case of a categorical-and-Box action space, ~10 s for the training loop after the vector
case, whose updates have its shapes (CartPole: 4 floats, 2 actions) and so reuse its graphs,
and ~130 s for the image/continuous case (marked `slow`), compiled with torch's Python
wrappers so that both kinds are checked; warm, a fraction of that.
"""

import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from train_step import batch_for, spaces  # noqa: E402

from lucid import agent as lucid_agent  # noqa: E402
from lucid.agent import Agent  # noqa: E402
from lucid.config import make_config  # noqa: E402
from lucid.specs import ActionSpec  # noqa: E402
from lucid.world_model import WorldModel  # noqa: E402

B, T, H, CHUNK = 4, 4, 3, 2  # the training-loop test below uses the same shapes


def _graphs(fn) -> int:
    """How many compiled graphs dynamo holds for `fn`'s code."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    return len(_debug_get_cache_entry_list(fn.__code__))


def _losses(compile_: bool, obs: str, action: str, updates: int = 2,
            **train) -> list[dict]:
    cfg = make_config("default", model={"size": "nano"},
                      train={"batch_size": B, "batch_length": T, "horizon": H,
                             "compile": compile_, **train})
    obs_spec, act_spec = spaces(obs, action)
    if obs == "vector" and action == "discrete":  # CartPole's 2 actions: the training-loop test reuses these graphs
        act_spec = ActionSpec.from_space(gym.spaces.Discrete(2))
    torch.manual_seed(0)
    agent = Agent(obs_spec, act_spec, cfg, "cpu")
    batch = batch_for(obs_spec, act_spec, B, T, torch.device("cpu"))
    torch.manual_seed(1)
    return [agent.train(batch) for _ in range(updates)]


NATURE = {"replay_value_scale": 0.3, "replay_value_grad": True}


@pytest.mark.parametrize("obs,action,wrapper,train", [
    ("vector", "discrete", True, {}),
    # an action space of a categorical and a Box (its actor's log-probs, entropies and
    # REINFORCE through compiled graphs), with the replay value loss training the world
    # model (its backward pass after imagination)
    ("vector", "mixed", True, NATURE),
    # torch's Python wrappers (train.cpp_wrapper=false): half the compile time of C++ ones
    pytest.param("image", "continuous", False, {}, marks=pytest.mark.slow),
])
def test_compiled_matches_eager(obs, action, wrapper, train, monkeypatch):
    monkeypatch.setattr(lucid_agent, "COMPILE_CHUNK", CHUNK)
    torch._dynamo.reset()
    eager = _losses(False, obs, action, **train)
    compiled = _losses(True, obs, action, cpp_wrapper=wrapper, **train)
    # The first chunk starts from the initial state, the second from the first's last state:
    # one graph for both (a second would be a second compile of the largest graph). The
    # rollout of the second update reuses the first's graph: nothing it reads is filled in
    # during the first (the one-hot layers' offsets were, a second compile of the rollout).
    # Box-only actions imagine through the dynamics instead (`imagine`, not compiled whole).
    assert _graphs(WorldModel.filter) == 1
    assert _graphs(WorldModel.rollout) == (0 if action == "continuous" else 1)
    for e, c in zip(eager, compiled):
        assert e.keys() == c.keys()
        for k in ("world_model/loss", "world_model/decoder", "world_model/reward",
                  "world_model/dyn", "actor/loss", "critic/loss", *(
                      ["critic/replay_loss"] if train else [])):
            assert c[k] == pytest.approx(e[k], rel=1e-3, abs=1e-4), k
        for k in e:  # every metric, looser: grad norms amplify rounding
            assert c[k] == pytest.approx(e[k], rel=1e-2, abs=1e-3), k


def test_compiled_agent_trains_checkpoints_and_resumes(tmp_path, monkeypatch):
    """`train.compile=true` through the training loop: acting with the compiled encoder and
    actor, updates, a checkpoint, and a resumed run that loads it into a compiled agent
    (parameter names are unchanged by compiling) and carries on. Same update shapes as
    above (nano, B=4, T=4 in chunks of 2, H=3, 4 floats, 2 actions), so the graphs compiled
    there are reused."""
    import json
    import math

    from lucid.train import Trainer

    monkeypatch.setattr(lucid_agent, "COMPILE_CHUNK", CHUNK)

    def cfg(steps):
        return make_config("default", env={"id": "CartPole-v1", "num_envs": 2},
                           model={"size": "nano"},
                           train={"batch_size": B, "batch_length": T, "horizon": H,
                                  "prefill": 20, "train_ratio": 16, "compile": True},
                           run={"steps": steps, "log_every": 0.0, "progress": False,
                                "logger": "none", "run_dir": str(tmp_path)})

    first = Trainer(cfg(40))
    first.run()
    first.close()
    c1 = dict(first.counters)
    assert c1["updates"] == math.floor((c1["env_steps"] - 20) * 16 / (B * T)) > 0
    params = [p.detach().clone() for p in first.agent.wm.parameters()]
    more = Trainer(cfg(60), tmp_path, resume=True)
    assert more.agent.config.train.compile
    for a, b in zip(params, more.agent.wm.parameters()):
        assert torch.equal(a, b)
    more.run()
    more.close()
    assert more.counters["updates"] > c1["updates"]
    last = json.loads((tmp_path / "metrics.jsonl").read_text().strip().splitlines()[-1])
    assert last["train/nonfinite_updates"] == 0
    assert all(math.isfinite(v) for v in last.values() if isinstance(v, float))


def test_the_nature_recipes_compiled_update_matches_eager():
    """`train.compile` on `model.recipe=nature` (1m, B=3, T=8 with a reset and a terminal
    inside, H=3, an action space of a categorical and a Box): two updates, compiled and
    eager from the same parameters and RNG state, give the same losses (the second update's
    from the parameters the first one stepped), and nothing falls back to eager inside the
    compiled functions (no graph break). Python wrappers (train.cpp_wrapper=false) halve the
    compile time; the C++ ones are the 2023 tests' above. Then one step of acting (its own
    graph: no gradient, other rows) reaches the same state."""
    from torch._dynamo.utils import counters

    from lucid.nature_agent import NatureAgent
    from test_update_unchanged import ACTIONS, VEC, _batch

    act = ActionSpec.from_space(ACTIONS["mixed"])
    batch = _batch(act, ACTIONS["mixed"])

    def run(compile_):
        cfg = make_config("nature", model={"size": "1m"},
                          train={"horizon": 3, "lr_warmup": 0, "model_lr": 1e-3,
                                 "replay_context": 0, "compile": compile_,
                                 "cpp_wrapper": False})
        torch.manual_seed(0)
        agent = NatureAgent(VEC, act, cfg)
        torch.manual_seed(1)
        return agent, [agent.train(batch) for _ in range(2)]

    def step(agent):  # one step of acting from the trained parameters (the actions: modes)
        torch.manual_seed(2)
        _, state = agent.policy({"vector": batch["obs"]["vector"][:, 0]}, explore=False)
        return state

    torch._dynamo.reset()
    counters.clear()
    plain, eager = run(False)
    agent, compiled = run(True)
    # the filter's step: one graph for a window's first step (from a state without
    # gradient) and one for all the others, in both updates; one for the whole rollout
    assert _graphs(NatureAgent._step) == 2 and _graphs(NatureAgent._rollout) == 1
    acted, acted_plain = step(agent), step(plain)
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch.testing.assert_close(acted.h, acted_plain.h, rtol=1e-3, atol=1e-4)
    for e, c in zip(eager, compiled):
        assert e.keys() == c.keys()
        for k in e:
            if k.startswith("loss/") or k == "train/loss":
                assert c[k] == pytest.approx(e[k], rel=1e-3, abs=1e-4), k
            else:  # looser: grad norms amplify rounding
                assert c[k] == pytest.approx(e[k], rel=1e-2, abs=1e-3), k
