"""`lucid export`: the greedy policy step as one ONNX graph, run by onnxruntime against
`Dreamer.predict(deterministic=True)` over whole episodes, the ONNX side carrying its own
recurrent state. Both draw the posterior latent from the same uniforms (predict's come from
torch.rand under one seed per step, the graph's are that seed's `u` input). Discrete actions
must be identical at every step; Box actions and the state within 1e-4."""

import json

import numpy as np
import pytest
import torch

from lucid import Dreamer
from lucid.envs import make_env
from lucid.export import export_onnx
from lucid.nature_agent import NatureAgent

ort = pytest.importorskip("onnxruntime")  # a dev dependency: installed by `make test`


def _get(tree, path):
    for step in path:
        tree = tree[step]
    return tree


def _onnx_action(outputs: dict, sig: dict, structured: bool):
    """The env action of row 0 from the graph's act.* outputs (a Dict/Tuple by its paths)."""
    acts = [o for o in sig["outputs"] if "kind" in o]  # the act.* outputs
    if not structured:
        return outputs[acts[0]["name"]][0]
    return {tuple(o["path"]): outputs[o["name"]][0] for o in acts}


def _same(graph, lucid, exact: bool) -> bool:
    graph, lucid = np.asarray(graph), np.asarray(lucid)
    if exact:
        return np.array_equal(graph.astype(np.int64), lucid.astype(np.int64))
    return np.allclose(graph.astype(np.float64), lucid.astype(np.float64), atol=1e-4)


def _noise(agent) -> np.ndarray:
    """What predict(deterministic=False) draws for the actor after the latent's uniforms, in
    its order (a uniform per categorical, then normals), laid out as Actor.noise."""
    if isinstance(agent, NatureAgent):
        mean = agent.actor.mean
        g, box = len(agent.actor.logits), 0 if mean is None else mean.out_features
    else:
        g, box = len(agent.actor.groups), agent.actor.n_box
    cats = [torch.rand(1, 1) for _ in range(g)]
    eps = torch.randn(1, box) if box else None
    if not box:
        return torch.stack(cats, 1).numpy()
    return (torch.cat([torch.cat(cats, -1), eps], -1) if g else eps).numpy()


def _parity(env_id: str, tmp_path, steps: int = 60, sampled: bool = False,
            recipe: str = "2023", **kw) -> int:
    kw = dict(size="nano", **kw) if recipe == "2023" else dict(preset="nature-cpu", **kw)
    agent = Dreamer(env_id, run__device="cpu", **kw)
    run = agent.trainer
    path = export_onnx(agent.agent, run.obs_spec, run.act_spec, tmp_path / "policy.onnx",
                       sampled=sampled)
    sig = json.loads(path.with_suffix(".json").read_text())
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    assert names == [i["name"] for i in sig["inputs"]]
    groups = agent.agent.initial(1).z.shape[1]
    state_inputs = [i for i in sig["inputs"] if i["name"] in ("h", "z", "action")]
    zeros = [np.zeros((1, *s["shape"][1:]), np.float32) for s in state_inputs]
    env = make_env(env_id)
    obs, _ = env.reset(seed=0)
    state, carried, first, episodes = None, zeros, True, 0
    parts = run.act_spec.parts or [((), run.act_spec)]
    for t in range(steps):
        torch.manual_seed(t)
        u = torch.rand(1, groups, 1).numpy()
        noise = [_noise(agent.agent)] if sampled else []
        torch.manual_seed(t)  # predict draws the same random numbers
        act, state = agent.predict(obs, state, deterministic=not sampled)
        leaves = [np.asarray(run.obs_spec.leaf(obs, k))[None] for k in run.obs_spec.keys()]
        out = dict(zip([o.name for o in sess.get_outputs()],
                       sess.run(None, dict(zip(names, leaves + carried
                                               + [np.array([first]), u] + noise)))))
        carried = [out["h_next"], out["z_next"], out["action_next"]]
        got = _onnx_action(out, sig, bool(run.act_spec.parts))
        for path, part in parts:
            mine = got[path] if run.act_spec.parts else got
            assert _same(mine, _get(act, path), exact=bool(part.discrete)), (t, path, mine, act)
        np.testing.assert_allclose(out["h_next"], state.h.numpy(), atol=1e-4)
        obs, _, term, trunc, _ = env.step(act)
        first = term or trunc
        if first:
            obs, _ = env.reset()
            state, episodes = None, episodes + 1
    return episodes


@pytest.mark.parametrize("env_id", [
    "CartPole-v1",                   # vector, Discrete
    "Pendulum-v1",                   # vector, Box (rescaled into [-2, 2] in the graph)
    "FrozenLake-v1",                 # a Discrete observation (one-hot in the graph)
    "examples.custom_env:MyEnv",     # Dict of an image and a vector, MultiDiscrete actions
    "envs_for_tests:GearSteerEnv",   # a Dict action of a Discrete and a Box leaf
    "envs_for_tests:ColorCueEnv",    # an image alone
])
def test_the_exported_step_acts_as_predict_over_whole_episodes(env_id, tmp_path):
    episodes = _parity(env_id, tmp_path, steps=60)
    # (the carried state went through episode starts: is_first resets it in the graph)
    assert env_id not in ("CartPole-v1", "envs_for_tests:GearSteerEnv") or episodes >= 1


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1",
                                    "envs_for_tests:GearSteerEnv"])
def test_a_sampled_export_acts_as_predict_from_the_same_random_numbers(env_id, tmp_path):
    _parity(env_id, tmp_path, steps=40, sampled=True)


@pytest.mark.parametrize("env_id, sampled", [
    ("Pendulum-v1", False),                  # a Box
    ("envs_for_tests:GearSteerEnv", True),   # a Dict of a Discrete and a Box, sampled
    ("examples.custom_env:MyEnv", False),    # an image with a vector, MultiDiscrete actions
])
def test_the_nature_recipes_policy_exports_too(env_id, sampled, tmp_path):
    _parity(env_id, tmp_path, steps=30, sampled=sampled, recipe="nature")


def test_the_description_names_inputs_outputs_and_spaces(tmp_path):
    agent = Dreamer("examples.custom_env:MyEnv", size="nano", run__device="cpu")
    run = agent.trainer
    path = export_onnx(agent.agent, run.obs_spec, run.act_spec, tmp_path / "p.onnx",
                       meta={"env": "examples.custom_env:MyEnv"})
    sig = json.loads(path.with_suffix(".json").read_text())
    assert [i["name"] for i in sig["inputs"]] == ["obs.image", "obs.position", "h", "z",
                                                   "action", "is_first", "u"]
    assert sig["inputs"][0]["shape"] == ["N", 64, 64, 3] and sig["inputs"][0]["dtype"] == "uint8"
    (act,) = [o for o in sig["outputs"] if o["name"] == "act"]
    assert act["kind"] == "discrete" and act["shape"] == ["N", 2]
    assert sig["greedy"] and sig["env"] == "examples.custom_env:MyEnv"
    with pytest.raises(ValueError, match=r"must end in .onnx"):
        export_onnx(agent.agent, run.obs_spec, run.act_spec, tmp_path / "p.pt")


def test_the_consumer_example_needs_only_onnxruntime_and_numpy(tmp_path):
    """examples/run_exported.py runs an exported CartPole policy through whole episodes,
    and what it imports besides the standard library is numpy, onnxruntime and what
    onnxruntime itself requires: no torch, no lucid."""
    import re
    import subprocess
    import sys
    from importlib.metadata import requires
    from pathlib import Path
    agent = Dreamer("CartPole-v1", size="nano", run__device="cpu")
    path = export_onnx(agent.agent, agent.trainer.obs_spec, agent.trainer.act_spec,
                       tmp_path / "policy.onnx")
    example = Path(__file__).resolve().parents[1] / "examples" / "run_exported.py"
    probe = (f"import runpy, sys; sys.argv = [{str(example)!r}, {str(path)!r}]; "
             f"runpy.run_path({str(example)!r}, run_name='__main__'); "
             f"print('IMPORTED', sorted({{m.split('.')[0] for m in sys.modules}} "
             f"- set(sys.stdlib_module_names)))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("step ") == 3, r.stdout
    imported = {m for m in eval(r.stdout.split("IMPORTED ", 1)[1])  # (runtime internals:
                if not m.startswith("_") and m != "cython_runtime"}  # __main__, the .pth finder)
    deps = {re.split(r"[<>=!~ ;\[]", d)[0].lower().replace("-", "_")
            for d in requires("onnxruntime") or []}
    allowed = {"numpy", "onnxruntime", "google", "_distutils_hack", "sitecustomize"} | deps
    assert not imported & {"torch", "lucid", "gymnasium"}, imported
    assert imported <= allowed, imported - allowed
    # and it plays whole episodes in an env (gymnasium only for the env itself)
    r = subprocess.run([sys.executable, str(example), str(path), "--env", "CartPole-v1",
                        "--episodes", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.count("episode ") == 2, r.stderr


def test_lucid_export_writes_the_graph_and_its_description(tmp_path):
    from typer.testing import CliRunner
    from lucid.cli import app
    agent = Dreamer("Pendulum-v1", size="nano", run__device="cpu")
    agent.save(tmp_path / "agent.pt")
    runner = CliRunner()
    r = runner.invoke(app, ["export", str(tmp_path / "agent.pt"), "--out",
                            str(tmp_path / "out" / "pendulum.onnx")])
    assert r.exit_code == 0, r.output
    told = json.loads(r.stdout)
    assert told["onnx"].endswith("pendulum.onnx") and (tmp_path / "out" / "pendulum.json").exists()
    info = json.loads((tmp_path / "out" / "pendulum.json").read_text())
    assert info["env"] == "Pendulum-v1" and info["outputs"][0]["low"] == [-2.0]
    for args, message in ((["--out", "p.pt"], "--out must end in .onnx"),
                          (["--format", "tflite"], "--format must be onnx")):
        r = runner.invoke(app, ["export", str(tmp_path / "agent.pt"), *args])
        assert r.exit_code == 2 and message in r.output, r.output
