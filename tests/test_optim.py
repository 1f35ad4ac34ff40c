"""The Nature recipe's optimizer (lucid/optim.py) step by step against numpy, written from the
authors' equations (danijar/dreamerv3: clip_by_agc, scale_by_rms, scale_by_momentum, a linear
warm-up from optax's count 0), in float64."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from lucid.optim import LaProp


def numpy_laprop(params, grads_per_step, lr=4e-5, agc=0.3, pmin=1e-3, b1=0.9, b2=0.999,
                 eps=1e-20, warmup=1000):
    """The parameters after each step: lists of arrays, in float64."""
    params = [np.array(p, np.float64) for p in params]
    nu = [np.zeros_like(p) for p in params]
    mu = [np.zeros_like(p) for p in params]
    out = []
    for count, grads in enumerate(grads_per_step):  # optax's count: 0 at the first step
        t = count + 1
        clipped = []
        for p, g in zip(params, grads):
            g = np.array(g, np.float64)
            upper = agc * max(pmin, np.sqrt((p ** 2).sum()))
            clipped.append(g / max(1.0, np.sqrt((g ** 2).sum()) / upper) if agc else g)
        rate = lr * min(1.0, count / warmup) if warmup else lr
        for i, g in enumerate(clipped):
            nu[i] = b2 * nu[i] + (1 - b2) * g * g
            scaled = g / (np.sqrt(nu[i] / (1 - b2 ** t)) + eps)
            mu[i] = b1 * mu[i] + (1 - b1) * scaled
            params[i] = params[i] - rate * mu[i] / (1 - b1 ** t)
        out.append([p.copy() for p in params])
    return out


def _case(seed=0):
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=(5, 3)), np.zeros(4), rng.normal(size=(2, 2, 3)) * 0.01]
    # grads: ordinary, far larger than the parameters (AGC clips), and for the zero tensor
    # (AGC's pmin), over 6 steps
    steps = [[rng.normal(size=p.shape) * s for p, s in zip(params, (0.1, 5.0, 3.0))]
             for _ in range(6)]
    return params, steps


@pytest.mark.parametrize("kw", [dict(lr=1e-2, warmup=3), dict(lr=1e-3, warmup=0),
                                dict(lr=1e-2, warmup=2, agc=0.0),
                                dict(lr=4e-5)])
def test_laprop_steps_equal_the_authors_equations(kw):
    params, steps = _case()
    want = numpy_laprop(params, steps, **{k: v for k, v in kw.items()})
    ps = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in params]
    opt = LaProp(ps, **kw)
    for i, grads in enumerate(steps):
        for p, g in zip(ps, grads):
            p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        for p, w in zip(ps, want[i]):
            np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-10, atol=1e-14)
    # the first step of a warm-up moves nothing (optax counts from 0)
    if kw.get("warmup", 1000):
        first = numpy_laprop(params, steps[:1], **kw)[0]
        assert all(np.array_equal(f, p) for f, p in zip(first, params))


def test_agc_clips_each_tensor_by_its_own_norm():
    """|θ| = 2 allows |g| <= 0.3 · 2 = 0.6 for each tensor: a gradient of norm 6 is scaled by
    0.1, one of norm 0.2 is left alone (seen through ν = (1 - β2) g² after one step)."""
    big = torch.nn.Parameter(torch.ones(4))
    small = torch.nn.Parameter(torch.ones(4))
    zero = torch.nn.Parameter(torch.zeros(4))  # |θ| = 0: pmin = 1e-3 allows |g| <= 3e-4
    opt = LaProp([big, small, zero], lr=1.0, warmup=0, beta1=0.0, beta2=0.5)
    big.grad = torch.full((4,), 3.0)
    small.grad = torch.full((4,), 0.1)
    zero.grad = torch.full((4,), 1.0)  # |g| = 2: scaled by 1.5e-4
    opt.step()
    assert torch.allclose(opt.state[big]["nu"], torch.full((4,), 0.5 * 0.3 ** 2))
    assert torch.allclose(opt.state[small]["nu"], torch.full((4,), 0.5 * 0.1 ** 2))
    assert torch.allclose(opt.state[zero]["nu"], torch.full((4,), 0.5 * 1.5e-4 ** 2))


def test_a_step_with_found_inf_changes_nothing_and_the_next_one_counts_as_first():
    params, steps = _case(1)
    want = numpy_laprop(params, steps[1:3], lr=1e-2, warmup=2)
    ps = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in params]
    opt = LaProp(ps, lr=1e-2, warmup=2)
    for p, g in zip(ps, steps[0]):
        p.grad = torch.tensor(g, dtype=torch.float64)
    opt.found_inf = torch.ones(())
    opt.step()
    for p, p0 in zip(ps, params):
        assert np.array_equal(p.detach().numpy(), p0)
    assert all(float(opt.state[p]["step"]) == 0 for p in ps)
    opt.found_inf = torch.zeros(())
    for i, grads in enumerate(steps[1:3]):
        for p, g in zip(ps, grads):
            p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        for p, w in zip(ps, want[i]):
            np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-10, atol=1e-14)


def test_state_saves_and_loads():
    params, steps = _case(2)
    ps = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in params]
    opt = LaProp(ps, lr=1e-2, warmup=3)
    for grads in steps[:2]:
        for p, g in zip(ps, grads):
            p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    qs = [p.detach().clone().requires_grad_(True) for p in ps]
    other = LaProp(qs, lr=1e-2, warmup=3)
    other.load_state_dict(copy.deepcopy(opt.state_dict()))  # as from a checkpoint
    for a, b in ((opt, ps), (other, qs)):
        for p, g in zip(b, steps[2]):
            p.grad = torch.tensor(g, dtype=torch.float64)
        a.step()
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)
