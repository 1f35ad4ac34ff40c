"""The preset a run gets when none is named: the paper's suites keep their domain's preset on
every machine; any other env gets lucid's CPU recipe on a machine without a CUDA device
(`cpu-pixels` for image observations, `cpu-control` otherwise) and the paper's settings
(`default`) on a CUDA one. `lucid config ENV` and `Dreamer(env)` choose the same way."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from lucid.cli import app
from lucid.config import make_config
from lucid.device import preset_for

runner = CliRunner()


class Pictures(gym.Env):
    """An env of 32x32 RGB observations, as a user's own would be."""
    observation_space = gym.spaces.Box(0, 255, (32, 32, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)
    made = 0

    def __init__(self):
        Pictures.made += 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def _chosen(env_id: str, device: str = "auto", **kwargs) -> str:
    return preset_for(make_config("default", env={"id": env_id, "kwargs": kwargs},
                                  run={"device": device}))


def _has_cuda(monkeypatch, yes: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: yes)


@pytest.mark.parametrize("cuda", [False, True])
def test_the_paper_suites_keep_their_preset_on_every_machine(monkeypatch, cuda):
    _has_cuda(monkeypatch, cuda)
    for env_id, preset in (("atari:Pong", "atari"), ("atari100k:Pong", "atari100k"),
                           ("dmc:walker-walk", "dmc-proprio"),
                           ("dmc-vision:walker-walk", "dmc-vision"), ("crafter", "crafter")):
        assert _chosen(env_id) == preset, env_id


def test_other_envs_get_the_cpu_recipe_for_their_observations_without_a_gpu(monkeypatch):
    _has_cuda(monkeypatch, False)
    assert _chosen("CartPole-v1") == "cpu-control"
    assert _chosen("Pendulum-v1") == "cpu-control"
    assert _chosen("minigrid:Empty-5x5") == "cpu-pixels"
    assert _chosen("examples.custom_env:MyEnv") == "cpu-pixels"  # Dict: image + vector
    assert _chosen(f"{__name__}:Pictures") == "cpu-pixels"
    # run.device=cpu on a machine with a GPU is a CPU run too
    _has_cuda(monkeypatch, True)
    assert _chosen("Pendulum-v1", device="cpu") == "cpu-control"


def test_other_envs_get_the_papers_settings_on_a_gpu_without_being_built(monkeypatch):
    _has_cuda(monkeypatch, True)
    made = Pictures.made
    assert _chosen(f"{__name__}:Pictures") == "default"
    assert _chosen("CartPole-v1") == "default"
    assert _chosen("minigrid:Empty-5x5") == "default"
    assert Pictures.made == made  # the observation space is read only where it decides


def test_lucid_config_shows_the_choice_and_why(monkeypatch):
    _has_cuda(monkeypatch, False)
    r = runner.invoke(app, ["config", "Pendulum-v1"])
    assert r.exit_code == 0, r.output
    assert "preset: cpu-control" in r.output
    first = r.output.splitlines()[0]
    assert first.startswith("# note: no preset given and no CUDA device: preset cpu-control"), \
        first
    assert "--preset default runs the 2023 paper's settings" in first
    r = runner.invoke(app, ["config", "minigrid:Empty-5x5"])
    assert r.exit_code == 0 and "preset: cpu-pixels" in r.output, r.output
    r = runner.invoke(app, ["config", "Pendulum-v1", "--preset", "default"])
    assert r.exit_code == 0 and "preset: default" in r.output and "# note" not in r.output
    _has_cuda(monkeypatch, True)
    r = runner.invoke(app, ["config", "Pendulum-v1"])
    assert r.exit_code == 0 and "preset: default" in r.output, r.output
    assert "# note" not in r.output  # the paper's settings on a GPU: nothing to say


def test_dreamer_chooses_the_same_way_for_names_and_instances(monkeypatch):
    from lucid import Dreamer
    _has_cuda(monkeypatch, False)
    with pytest.warns(UserWarning, match="no preset given and no CUDA device: preset "
                                         "cpu-pixels.*preset='default' runs the 2023"):
        agent = Dreamer(Pictures())
    assert agent.cfg.preset == "cpu-pixels"
    assert Dreamer("Pendulum-v1", preset="default").cfg.preset == "default"
