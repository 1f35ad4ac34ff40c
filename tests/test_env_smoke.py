"""Smoke test per environment suite: `lucid train` through the CLI for a few hundred (pixel
suites: 150) env steps and a few updates of a nano model, then the run directory is checked
(config.yaml, metrics.jsonl with updates, episodes.jsonl, a checkpoint) and `lucid eval` is run
on some of them. Headless: MuJoCo renders through EGL.

envpool has wheels for CPython 3.11 on Linux x86-64 only; elsewhere its test is skipped
and reported as such.
"""

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from lucid.cli import app  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

TINY = ["--size", "nano", "env.num_envs=1", "train.batch_size=2", "train.batch_length=8",
        "train.horizon=3", "train.replay_capacity=2000", "run.videos=false", "run.progress=false",
        "run.device=cpu", "run.log_every=1000"]

# env id -> (env steps, prefill, train ratio, extra overrides). Updates are
# (steps - prefill) * ratio / (2 * 8); time limits are short so that episodes end.
SUITES = {
    "CartPole-v1": (200, 100, 2, []),
    "atari:Pong": (150, 100, 4, ["env.max_episode_steps=60"]),
    "atari100k:Pong": (150, 100, 4, ["env.max_episode_steps=60"]),
    "dmc:cartpole-swingup": (200, 100, 2, ["env.max_episode_steps=50"]),
    "dmc-vision:cartpole-swingup": (150, 100, 4, ["env.max_episode_steps=60",
                                                  "env.kwargs.fast_render=true"]),
    "crafter": (150, 100, 4, ["env.kwargs.length=60"]),
    "minigrid:Empty-5x5": (150, 100, 4, []),  # MiniGrid's own 100-step limit
    "examples.custom_env:MyEnv": (150, 100, 4, []),  # the example's own 50-step limit
    "memory-maze:9x9": (150, 100, 4, ["env.max_episode_steps=60"]),
    "envpool:Pong-v5": (150, 100, 4, ["env.max_episode_steps=60"]),
}
EVALUATED = ["CartPole-v1", "atari:Pong", "examples.custom_env:MyEnv"]

runner = CliRunner()
_runs: dict[str, Path] = {}
_outputs: dict[str, str] = {}  # what lucid train printed


def _train(env_id: str, tmp_path_factory) -> Path:
    """Train `env_id` once per test session; later tests of the same suite reuse the run."""
    if env_id.startswith("envpool:"):
        pytest.importorskip("envpool", reason="envpool has no wheel for this platform")
    if env_id not in _runs:
        steps, prefill, ratio, extra = SUITES[env_id]
        run_dir = tmp_path_factory.mktemp(env_id.replace(":", "-").replace(".", "-"))
        args = ["train", env_id, "--steps", str(steps), "--run-dir", str(run_dir), *TINY,
                f"train.prefill={prefill}", f"train.train_ratio={ratio}", *extra]
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(REPO)  # examples.custom_env is found from the repository root
            result = runner.invoke(app, args)
        assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
        _runs[env_id] = run_dir
        _outputs[env_id] = result.output
    return _runs[env_id]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("env_id", list(SUITES))
def test_lucid_train_runs_each_suite(env_id, tmp_path_factory):
    steps, prefill, ratio, _ = SUITES[env_id]
    run_dir = _train(env_id, tmp_path_factory)
    config = (run_dir / "config.yaml").read_text()
    assert f"id: {env_id}" in config and "size: nano" in config
    # dmc-proprio runs the authors' vector MLPs, at any size, and says so; no other preset
    wide = "the MLPs of the vector observations are 5 × 1024" in _outputs[env_id]
    assert wide == env_id.startswith("dmc:"), _outputs[env_id]
    assert wide == ("vector_units: 1024" in config)
    rows = _jsonl(run_dir / "metrics.jsonl")
    last = rows[-1]
    assert last["env_steps"] >= steps
    assert last["updates"] >= (steps - prefill) * ratio // 16 - 1 > 0
    assert all(v == v for v in last.values() if isinstance(v, float))  # no NaN in the log
    episodes = _jsonl(run_dir / "episodes.jsonl")
    assert episodes and last["episodes"] == len(episodes)
    assert all(ep["length"] > 0 for ep in episodes)
    assert sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))
    assert sorted((run_dir / "replay").glob("chunk-*"))


@pytest.mark.parametrize("env_id", EVALUATED)
def test_lucid_eval_runs_on_the_trained_run(env_id, tmp_path_factory):
    run_dir = _train(env_id, tmp_path_factory)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        result = runner.invoke(app, ["eval", str(run_dir), "--episodes", "1"])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    out = json.loads(result.output.strip().splitlines()[-1])
    assert out["episodes"] == 1 and len(out["returns"]) == 1
    assert out["mean_return"] == out["returns"][0]
    assert len(out["lengths"]) == 1 and out["lengths"][0] >= 1


def test_crafter_training_logs_the_score_and_success_rates(tmp_path_factory):
    run_dir = _train("crafter", tmp_path_factory)
    last = _jsonl(run_dir / "metrics.jsonl")[-1]
    assert last["crafter/episodes"] >= 2  # 150 steps of 60-step episodes
    assert 0.0 <= last["crafter/score"] <= 100.0
    assert sum(k.startswith("crafter/success/") for k in last) == 22
