"""`train.precision=bf16`: autocast of the update's forward passes, on the CPU (CPU autocast
supports bf16 too, so the switch is tested without a GPU).

Tolerance. bf16 keeps 8 significant bits (7 stored + the implicit one), so one rounding errs
by at most 2^-9 ≈ 2e-3 relative. Under autocast only the inputs of matmuls and convolutions
are rounded (products accumulate in fp32; norms, distributions, KL and losses are fp32), and
each loss averages many elements, so bf16 and fp32 losses differ by about one rounding (1e-4
to 3e-3 measured here on nano). rel 2e-2, i.e. 10 roundings, leaves room for other platforms'
kernels and for a latent sample that flips near a class boundary, and is still far below what
a changed term or scale would produce. That bf16 is really used, and fp32 kept where it must
be, is checked on the dtypes the modules produce, not through the tolerance.
Both agents start from the same parameters and RNG state, so they draw the same samples.
"""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from train_step import batch_for, spaces  # noqa: E402

from lucid.agent import Agent  # noqa: E402
from lucid.config import ConfigError, make_config  # noqa: E402
from lucid.nets import LayerNorm  # noqa: E402

LOSSES = ("world_model/loss", "world_model/decoder", "world_model/reward",
          "world_model/continue", "world_model/dyn", "world_model/rep", "actor/loss",
          "critic/loss")


def _agent(precision: str, obs: str, action: str, **train) -> tuple[Agent, dict]:
    cfg = make_config("default", model={"size": "nano"},
                      train={"batch_size": 4, "batch_length": 16, "horizon": 5,
                             "precision": precision, **train})
    obs_spec, act_spec = spaces(obs, action)
    torch.manual_seed(0)
    agent = Agent(obs_spec, act_spec, cfg, "cpu")
    batch = batch_for(obs_spec, act_spec, 4, 16, torch.device("cpu"))
    torch.manual_seed(1)
    return agent, batch


@pytest.mark.parametrize("obs,action", [("vector", "discrete"), ("image", "continuous")])
def test_bf16_losses_close_to_fp32_and_state_stays_fp32(obs, action):
    agent32, batch = _agent("fp32", obs, action)
    fp32 = agent32.train(batch)
    agent16, batch = _agent("bf16", obs, action)

    # Record the dtypes the forward passes produce: matmuls/convolutions in bf16, norms fp32.
    seen: dict[type, set] = {}
    hooks = [m.register_forward_hook(
        lambda mod, inp, out: seen.setdefault(type(mod), set()).add(out.dtype))
        for m in [*agent16.wm.modules(), *agent16.actor.modules(), *agent16.critic.modules()]
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.ConvTranspose2d, LayerNorm))]
    bf16 = agent16.train(batch)
    for h in hooks:
        h.remove()
    assert seen[nn.Linear] == {torch.bfloat16}
    assert seen[LayerNorm] == {torch.float32}
    if obs == "image":
        assert seen[nn.Conv2d] == seen[nn.ConvTranspose2d] == {torch.bfloat16}

    assert fp32.keys() == bf16.keys()
    assert any(fp32[k] != bf16[k] for k in LOSSES), "bf16 changed nothing: autocast is off?"
    for k in LOSSES:
        assert bf16[k] == pytest.approx(fp32[k], rel=2e-2, abs=1e-4), k

    # Parameters, gradients' targets and optimizer state stay fp32; returns are fp32.
    for m in agent16.modules().values():
        for name, t in [*m.named_parameters(), *m.named_buffers()]:
            assert t.dtype == torch.float32, name
    for opt in agent16.optimizers().values():
        for state in opt.state.values():
            for k, v in state.items():
                if torch.is_tensor(v) and v.is_floating_point() and v.dim() > 0:
                    assert v.dtype == torch.float32, k
    assert agent16.retnorm.low.dtype == agent16.retnorm.high.dtype == torch.float32


def test_bf16_updates_reduce_the_world_model_loss_like_fp32():
    """A few updates on one fixed batch (learning rate raised so 12 updates show progress:
    ~10.1 -> ~7.7 here): bf16 lowers the world-model loss as fp32 does, to within a few
    percent of the same value (the curves agree to ~0.5% on this machine)."""
    curves = {}
    for precision in ("fp32", "bf16"):
        agent, batch = _agent(precision, "vector", "discrete", model_lr=3e-3)
        curves[precision] = [agent.train(batch)["world_model/loss"] for _ in range(12)]
    for precision, c in curves.items():
        assert c[-1] < 0.85 * c[0], (precision, c)
    drop32 = curves["fp32"][0] - curves["fp32"][-1]
    drop16 = curves["bf16"][0] - curves["bf16"][-1]
    assert drop16 == pytest.approx(drop32, rel=0.1), curves
    assert curves["bf16"][-1] == pytest.approx(curves["fp32"][-1], rel=3e-2), curves


def test_precision_is_validated():
    with pytest.raises(ConfigError, match="train.precision"):
        make_config("default", ["train.precision=fp16"])


def test_two_hot_means_stay_fp32_under_bf16_autocast():
    """Rewards and values (two-hot means) feed the λ-returns in real space: autocast would
    run their probabilities-times-bins product in bf16 and round a value of 3 by ~1%."""
    from lucid.nets import TwoHot
    twohot = TwoHot(255, -20.0, 20.0)
    logits = torch.randn(64, 255, generator=torch.Generator().manual_seed(0)) * 3
    logits[:, 140] += 8.0  # peaked near symlog(value) ~ 1.9: values of a few units
    exact = twohot.mean(logits.double()).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = twohot.mean(logits)
        probs, mean = twohot.probs_and_mean(logits)
    assert got.dtype == mean.dtype == torch.float32
    torch.testing.assert_close(got, exact, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mean, exact, rtol=1e-5, atol=1e-6)
