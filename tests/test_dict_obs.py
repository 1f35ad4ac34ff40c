import gymnasium as gym
import numpy as np
import torch

from lucid.agent import Agent
from lucid.config import make_config
from lucid.envs.spaces import ActionSpec, ObsSpec


def test_dict_observation_routes_images_and_vectors_to_their_own_encoder_and_decoder():
    space = gym.spaces.Dict({
        "camera": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8),
        "depth": gym.spaces.Box(0, 255, (32, 32, 1), np.uint8),
        "joints": gym.spaces.Box(-1, 1, (5,), np.float64),
        "goal": gym.spaces.Box(-1, 1, (2, 3), np.float32),
    })
    spec = ObsSpec.from_space(space)
    assert spec.image_shape == (4, 32, 32) and spec.vector_dim == 11
    cfg = make_config("default", model={"size": "nano"},
                      train={"batch_size": 2, "batch_length": 4, "horizon": 3})
    torch.manual_seed(0)
    agent = Agent(spec, ActionSpec.from_space(gym.spaces.MultiDiscrete([3, 2])), cfg)
    assert agent.wm.encoder.cnn is not None and agent.wm.encoder.mlp is not None
    raw = space.sample()
    obs = spec.convert({k: np.stack([v, v]) for k, v in raw.items()}, (2,))
    assert obs["camera"].dtype == np.uint8 and obs["joints"].dtype == np.float32
    B, T = 2, 4
    batch_obs = {k: torch.as_tensor(np.repeat(v[:, None], T, 1)) for k, v in obs.items()}
    recon = agent.wm.decoder(torch.zeros(B, T, agent.wm.feat_dim))
    assert recon["camera"].shape == (B, T, 3, 32, 32) and recon["depth"].shape == (B, T, 1, 32, 32)
    assert recon["joints"].shape == (B, T, 5) and recon["goal"].shape == (B, T, 6)
    action = torch.cat([torch.eye(3)[torch.zeros(B, T, dtype=torch.long)],
                        torch.eye(2)[torch.ones(B, T, dtype=torch.long)]], -1)
    batch = {"obs": batch_obs, "action": action, "reward": torch.ones(B, T),
             "is_first": torch.zeros(B, T, dtype=torch.bool),
             "is_terminal": torch.zeros(B, T, dtype=torch.bool)}
    metrics = agent.train(batch)
    assert all(np.isfinite(v) for v in metrics.values())
    act, state = agent.policy({k: v[:, 0] for k, v in batch_obs.items()})
    assert act.shape == (2, 5)
    assert torch.equal(act[:, :3].sum(-1), torch.ones(2)) and torch.equal(act[:, 3:].sum(-1), torch.ones(2))
    env_act = agent.act_spec.to_env(act.numpy())
    assert env_act.shape == (2, 2) and (env_act[:, 0] < 3).all() and (env_act[:, 1] < 2).all()


def test_nan_observation_is_refused_with_the_key_named():
    spec = ObsSpec.from_space(gym.spaces.Dict({"joints": gym.spaces.Box(-1, 1, (3,))}))
    bad = {"joints": np.array([[0.0, np.nan, 1.0]])}
    try:
        spec.convert(bad, (1,))
    except ValueError as exc:
        assert "joints" in str(exc) and "NaN" in str(exc)
    else:
        raise AssertionError("NaN observation was accepted")


def test_unsupported_space_is_named():
    try:
        ObsSpec.from_space(gym.spaces.Dict({"text": gym.spaces.Text(5)}))
    except TypeError as exc:
        assert "text" in str(exc) and "supports" in str(exc)
    else:
        raise AssertionError("Text space was accepted")
