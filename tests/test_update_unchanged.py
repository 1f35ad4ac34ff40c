"""Refactors keep the update: the same agent, batches and sampling give the metrics and
parameters recorded in tests/data/update_metrics.json.

The values were recorded before the code was restructured into floors and named update steps
(`LUCID_RECORD_UPDATES=1 python -m pytest tests/test_update_unchanged.py` rewrites them: only
do that for a change that is meant to alter the maths, and say why in its commit). Each case
runs three updates of a nano agent on seeded batches with deterministic sampling
(tests/determinism.py): discrete actions by REINFORCE, Box actions through the dynamics, a
Dict of both by REINFORCE, the replay value loss with its gradient into the world model, and
16x16 images beside a vector.
The tolerance (1e-5 relative) admits float reassociation between thread counts, not a changed
term."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from determinism import deterministic_sampling
from lucid.agent import Agent
from lucid.config import make_config
from lucid.specs import ActionSpec, ObsSpec

RECORD = Path(__file__).parent / "data" / "update_metrics.json"
VEC = ObsSpec(vectors={"vector": 4})
IMG = ObsSpec(images={"image": (16, 16, 3)}, vectors={"vector": 4},
              image_scale={"image": 1.0})
ACTIONS = {
    "discrete": gym.spaces.Discrete(3),
    "box": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
    "mixed": gym.spaces.Dict({"gear": gym.spaces.Discrete(3),
                              "steer": gym.spaces.Box(-1.0, 1.0, (1,), np.float32)}),
}
CASES = {
    "discrete": ("discrete", {}),
    "box-dynamics": ("box", {}),
    "mixed-reinforce": ("mixed", {}),
    "discrete-replay-value-grad": ("discrete", {"replay_value_scale": 0.3,
                                                "replay_value_grad": True}),
    "box-replay-value": ("box", {"replay_value_scale": 0.3}),
    "image-discrete": ("discrete", {}),
}


def _batch(act: ActionSpec, space: gym.Space, B=3, T=8, seed=0, image=False) -> dict:
    g = torch.Generator().manual_seed(seed)
    rows = gym.vector.utils.batch_space(space, T)  # T actions at once, as a vector env's
    rows.seed(seed)
    action = torch.as_tensor(np.stack([act.from_env(rows.sample()) for _ in range(B)]),
                             dtype=torch.float32)
    is_first = torch.zeros(B, T, dtype=torch.bool)
    is_first[:, 0] = True
    is_first[1, 5] = True
    is_terminal = torch.zeros(B, T, dtype=torch.bool)
    is_terminal[1, 4] = True
    is_last = is_terminal.clone()
    is_last[2, 6] = True
    obs = {"vector": torch.randn(B, T, 4, generator=g) * 2}
    if image:
        obs["image"] = torch.randint(0, 256, (B, T, 16, 16, 3), generator=g, dtype=torch.uint8)
    return {"obs": obs, "action": action,
            "reward": torch.randn(B, T, generator=g), "is_first": is_first,
            "is_terminal": is_terminal, "is_last": is_last}


def _run(case: str, monkeypatch) -> dict:
    kind, train = CASES[case]
    deterministic_sampling(monkeypatch.setattr)
    space = ACTIONS[kind]
    act = ActionSpec.from_space(space)
    torch.manual_seed(0)
    cfg = make_config(model={"size": "nano"}, train={"horizon": 5, **train})
    image = case.startswith("image")
    agent = Agent(IMG if image else VEC, act, cfg)
    with torch.no_grad():  # rewards and values that vary (the output layers start at zero)
        for head in (agent.wm.reward.out, agent.critic.net.out, agent.critic.slow.out):
            head.weight.normal_(0, 0.5)
    metrics = [agent.train(_batch(act, space, seed=i, image=image)) for i in range(3)]
    params = {f"{module}.{name}": float(p.detach().double().abs().sum())
              for module, net in agent.modules().items()
              for name, p in net.state_dict().items() if p.is_floating_point()}
    return {"metrics": metrics, "param_abs_sums": params}


@pytest.mark.parametrize("case", list(CASES))
def test_update_gives_the_recorded_metrics_and_parameters(case, monkeypatch):
    got = _run(case, monkeypatch)
    if os.environ.get("LUCID_RECORD_UPDATES") == "1":
        saved = json.loads(RECORD.read_text()) if RECORD.exists() else {}
        saved[case] = got
        RECORD.parent.mkdir(exist_ok=True)
        RECORD.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
        pytest.skip("recorded")
    want = json.loads(RECORD.read_text())[case]
    for i, (g, w) in enumerate(zip(got["metrics"], want["metrics"])):
        assert sorted(g) == sorted(w), f"update {i}: metric names changed"
        for k in w:
            assert g[k] == pytest.approx(w[k], rel=1e-5, abs=1e-7), f"update {i}: {k}"
    assert sorted(got["param_abs_sums"]) == sorted(want["param_abs_sums"])
    for k, v in want["param_abs_sums"].items():
        assert got["param_abs_sums"][k] == pytest.approx(v, rel=1e-5), k


def test_a_run_written_before_the_floors_loads_and_resumes(tmp_path):
    """tests/data/run-before-floors: a nano CartPole run (config.yaml, checkpoint, replay)
    written by the commit before the code moved into floors (00607ad^). It loads to act with
    the checkpoint's weights, and resumes where it stopped."""
    import shutil
    from lucid.acting import load_to_act
    from lucid.checkpoint import load_latest
    from lucid.train import Trainer
    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "data" / "run-before-floors", run)
    payload, _ = load_latest(run)
    view = load_to_act(run)
    saved, now = payload["agent"]["modules"], view.agent.state_dict()["modules"]
    assert set(now) == set(saved)
    for module, params in saved.items():
        for name, value in params.items():
            assert torch.equal(now[module][name], value), (module, name)
    assert view.counters["env_steps"] == 60 and view.replay.stored == 60
    assert len(view.evaluate(1)) == 1
    with Trainer(make_config("default", run={"steps": 80}), run, resume=True) as tr:
        assert tr.counters["updates"] == payload["counters"]["updates"]
        tr.run()
        assert tr.counters["env_steps"] == 80 and tr.counters["updates"] > 20
