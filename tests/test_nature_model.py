"""The Nature recipe's networks (lucid/nature_model.py) have the authors' parameter counts.

The reference counts are derived from danijar/dreamerv3 (agent.py, rssm.py, embodied/jax/
nets.py and heads.py) layer by layer: each Linear holds a (in, out) kernel and a bias, each
RMSNorm a scale, BlockLinear a (blocks, in/blocks, out/blocks) kernel and a bias, Conv2D a
(k, k, in, out) kernel and a bias; the layers and their widths are those the authors' code
creates for the config's sizes (`size1m` ... `size400m`) and spaces. `authors_counts` below
does that sum without lucid's modules; the test sets it beside lucid's for three spaces.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from lucid.nature_model import NATURE_SIZES, nature_modules
from lucid.specs import ActionSpec, ObsSpec


def _linear(i, o):
    return (i + 1) * o


def _dense(i, o):  # Linear -> RMSNorm
    return _linear(i, o) + o


def _mlp(i, units, layers):
    return sum(_dense(i if n == 0 else units, units) for n in range(layers))


def authors_counts(obs: dict, actions: int, size: str) -> dict:
    """obs: {"vector": n} or {"image": (H, W, C)}; `actions` discrete."""
    s = NATURE_SIZES[size]
    S, F = s.stoch * s.classes, s.deter + s.stoch * s.classes
    u, k = s.units, 5
    depths = [s.depth * m for m in (2, 3, 4, 4)]
    enc = dec = tokens = 0
    if "vector" in obs:  # enc mlp0..2; dec mlp + a symlog_mse head per key
        enc += _mlp(obs["vector"], u, 3)
        tokens += u
        dec += _mlp(S + s.deter, u, 3) + _linear(u, obs["vector"])
    if "image" in obs:
        H, W, C = obs["image"]
        enc += sum(k * k * i * o + o + o for i, o in zip([C] + depths[:-1], depths))
        cells = (H // 16) * (W // 16) * depths[-1]
        tokens += cells
        dec += (s.blocks * (s.deter // s.blocks) * (cells // s.blocks) + cells  # sp0
                + _dense(S, 2 * u) + _linear(2 * u, cells) + depths[-1]  # sp1, sp2, spnorm
                + sum(k * k * i * o + o + o
                      for i, o in zip(depths[::-1][:-1], depths[::-1][1:]))
                + k * k * depths[0] * C + C)  # imgout
    g, D, h = s.blocks, s.deter, s.hidden
    dyn = (_dense(D, h) + _dense(S, h) + _dense(actions, h)  # dynin0..2
           + g * (D // g + 3 * h) * (D // g) + D + D  # dynhid0 and its norm
           + g * (D // g) * (3 * D // g) + 3 * D  # dyngru
           + _dense(D + tokens, h) + _linear(h, S)  # obs0, obslogit
           + _dense(D, h) + _dense(h, h) + _linear(h, S))  # prior0, prior1, priorlogit
    rew = _mlp(F, u, 1) + _linear(u, s.bins)
    con = _mlp(F, u, 1) + _linear(u, 1)
    pol = _mlp(F, u, 3) + _linear(u, actions)
    val = _mlp(F, u, 3) + _linear(u, s.bins)
    return {"world_model": enc + dyn + dec + rew + con, "actor": pol, "critic": val,
            "slow_critic": val}


SPACES = {  # Atari as the authors' config makes it, a 64x64x3 image, a vector
    "atari": ({"image": (96, 96, 1)}, gym.spaces.Box(0, 255, (96, 96, 1), np.uint8), 18),
    "image": ({"image": (64, 64, 3)}, gym.spaces.Box(0, 255, (64, 64, 3), np.uint8), 6),
    "vector": ({"vector": 4}, gym.spaces.Box(-1, 1, (4,), np.float32), 2),
}


def lucid_counts(space, actions, size):
    mods = nature_modules(ObsSpec.from_space(space), ActionSpec.from_space(
        gym.spaces.Discrete(actions)), size)
    out = {name: sum(p.numel() for p in m.parameters() if p.requires_grad)
           for name, m in mods.items()}
    out["slow_critic"] = sum(p.numel() for p in mods["critic"].slow.parameters())
    return out


@pytest.mark.parametrize("space", list(SPACES))
@pytest.mark.parametrize("size", ["1m", "12m", "25m"])
def test_parameter_counts_equal_the_authors(size, space):
    desc, gym_space, actions = SPACES[space]
    assert lucid_counts(gym_space, actions, size) == authors_counts(desc, actions, size)


def test_twelve_m_on_atari_is_about_twelve_million():
    """The preset's name is its size: size12m on the authors' Atari config trains 11.8M
    parameters (12.7M with the slow critic)."""
    c = authors_counts(SPACES["atari"][0], 18, "12m")
    trained = c["world_model"] + c["actor"] + c["critic"]
    assert 11e6 < trained < 13e6
