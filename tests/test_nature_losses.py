"""The Nature recipe's losses (lucid/nature_losses.py) against numpy ports of the authors'
functions (danijar/dreamerv3 agent.py: lambda_return, imag_loss, repl_loss with the config's
settings contdisc, slowtar False, valnorm and advnorm none, retnorm perc rate 0.01 limit 1
without debias; rssm.py: RSSM.loss; outs.py: OneHot with unimix, Binary, MSE), in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lucid.nature_losses import (PercentileNorm, continue_loss, continue_target, image_loss,
                                 imagination_losses, kl_losses, replay_value_loss,
                                 vector_loss)
from lucid.nature_nets import SymexpTwoHot
from test_nature_nets import np_symexp_bins, np_twohot_loss


def np_lambda_return(last, term, rew, val, boot, disc, lam):
    """The authors' lambda_return, batch-major, line by line."""
    rets = [boot[:, -1]]
    live = (1 - term)[:, 1:] * disc
    cont = (1 - last)[:, 1:] * lam
    interm = rew[:, 1:] + (1 - cont) * live * boot[:, 1:]
    for t in reversed(range(live.shape[1])):
        rets.append(interm[:, t] + live[:, t] * cont[:, t] * rets[-1])
    return np.stack(list(reversed(rets))[:-1], 1)


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class NpPerc:
    def __init__(self, rate=0.01, limit=1.0):
        self.rate, self.limit, self.lo, self.hi = rate, limit, 0.0, 0.0

    def __call__(self, x, update):
        if update:
            self.lo = (1 - self.rate) * self.lo + self.rate * np.percentile(x, 5)
            self.hi = (1 - self.rate) * self.hi + self.rate * np.percentile(x, 95)
        return self.lo, max(self.limit, self.hi - self.lo)


def np_imag_loss(logpi, ent, rew, con, value_logits, slow_logits, bins, retnorm,
                 lam=0.95, actent=3e-4, slowreg=1.0):
    val = np_softmax(value_logits) @ bins
    slowval = np_softmax(slow_logits) @ bins
    tarval = val
    weight = np.cumprod(con, 1)
    ret = np_lambda_return(np.zeros_like(con), 1 - con, rew, tarval, tarval, 1.0, lam)
    _, rscale = retnorm(ret, True)
    adv = (ret - tarval[:, :-1]) / rscale
    policy = weight[:, :-1] * -(logpi[:, :-1] * adv + actent * ent[:, :-1])
    tar = np.concatenate([ret, 0 * ret[:, -1:]], 1)
    value = weight[:, :-1] * (np_twohot_loss(value_logits, tar, bins)
                              + slowreg * np_twohot_loss(value_logits, slowval, bins))[:, :-1]
    return policy, value, ret


def np_repl_loss(last, term, rew, boot, value_logits, slow_logits, bins, horizon=333,
                 lam=0.95, slowreg=1.0):
    slowval = np_softmax(slow_logits) @ bins
    ret = np_lambda_return(last, term, rew, None, boot, 1 - 1 / horizon, lam)
    pad = np.concatenate([ret, 0 * ret[:, -1:]], 1)
    loss = (1 - last)[:, :-1] * (np_twohot_loss(value_logits, pad, bins) + slowreg
                                 * np_twohot_loss(value_logits, slowval, bins))[:, :-1]
    return loss, ret


def _t(x):
    return torch.tensor(x, dtype=torch.float64)


def test_imagination_losses_equal_the_authors_over_updates():
    rng = np.random.default_rng(0)
    n, h1, nb = 5, 7, 255
    bins = np_symexp_bins(nb)
    th = SymexpTwoHot(nb)
    ours, theirs = PercentileNorm(), NpPerc()
    ours.double()
    for _ in range(3):  # the percentile EMA carries over between updates
        rew = rng.normal(size=(n, h1)) * 3
        con = rng.uniform(0.5, 1.0, size=(n, h1))
        logpi, ent = -rng.uniform(0, 2, (n, h1)), rng.uniform(0, 2, (n, h1))
        vlog, slog = rng.normal(size=(n, h1, nb)), rng.normal(size=(n, h1, nb))
        policy, value, ret, _ = imagination_losses(th, _t(rew), _t(con), _t(logpi), _t(ent),
                                                   _t(vlog), _t(slog), ours)
        want_p, want_v, want_r = np_imag_loss(logpi, ent, rew, con, vlog, slog, bins, theirs)
        np.testing.assert_allclose(ret.numpy(), want_r, rtol=1e-9, atol=1e-9)
        # (lucid's percentiles are taken in fp32: the advantages' scale agrees to ~1e-7)
        np.testing.assert_allclose(policy.numpy(), want_p, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(value.numpy(), want_v, rtol=1e-8, atol=1e-10)
        assert float(ours.lo) == pytest.approx(theirs.lo) and \
            float(ours.hi) == pytest.approx(theirs.hi)


def test_replay_value_loss_equals_the_authors():
    rng = np.random.default_rng(1)
    n, t, nb = 4, 9, 255
    bins = np_symexp_bins(nb)
    last = np.zeros((n, t))
    last[1, 3] = last[2, 8] = 1
    term = np.zeros((n, t))
    term[1, 3] = 1
    rew, boot = rng.normal(size=(n, t)), rng.normal(size=(n, t)) * 10
    vlog, slog = rng.normal(size=(n, t, nb)), rng.normal(size=(n, t, nb))
    loss, ret = replay_value_loss(SymexpTwoHot(nb), _t(last), _t(term), _t(rew), _t(boot),
                                  _t(vlog), _t(slog))
    want_l, want_r = np_repl_loss(last, term, rew, boot, vlog, slog, bins)
    np.testing.assert_allclose(ret.numpy(), want_r, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(loss.numpy(), want_l, rtol=1e-9, atol=1e-10)


def np_unimix_logp(logits, unimix=0.01):
    p = np_softmax(logits)
    return np.log((1 - unimix) * p + unimix / logits.shape[-1])


def test_kl_losses_with_free_nats_equal_the_authors():
    rng = np.random.default_rng(2)
    post, prior = rng.normal(size=(3, 4, 32, 16)) * 2, rng.normal(size=(3, 4, 32, 16)) * 2
    post[0] = prior[0]  # equal: KL 0, raised to the free nat
    lp, lq = np_unimix_logp(post), np_unimix_logp(prior)
    kl = (np.exp(lp) * (lp - lq)).sum((-2, -1))
    dyn, rep = kl_losses(_t(post), _t(prior))
    np.testing.assert_allclose(dyn.numpy(), np.maximum(kl, 1.0), rtol=1e-9)
    np.testing.assert_allclose(rep.numpy(), np.maximum(kl, 1.0), rtol=1e-9)
    assert np.all(dyn.numpy()[0] == 1.0)
    # dyn trains the prior only, rep the posterior only
    a, b = _t(post).requires_grad_(), _t(prior).requires_grad_()
    d, r = kl_losses(a, b)
    d.sum().backward(retain_graph=True)
    assert a.grad is None and b.grad.abs().sum() > 0
    b.grad = None
    r.sum().backward()
    assert b.grad is None and a.grad.abs().sum() > 0


def test_continue_image_and_vector_losses():
    term = torch.tensor([[False, True, False]])
    target = continue_target(term)
    assert torch.allclose(target, torch.tensor([[1 - 1 / 333, 0.0, 1 - 1 / 333]]))
    logit = torch.tensor([[0.3, -1.2, 2.0]], dtype=torch.float64)
    p = 1 / (1 + np.exp(-logit.numpy()))
    want = -(target.numpy() * np.log(p) + (1 - target.numpy()) * np.log(1 - p))
    np.testing.assert_allclose(continue_loss(logit, target.double()).numpy(), want, rtol=1e-9)
    img = torch.randint(0, 256, (2, 3, 4, 4, 3), dtype=torch.uint8)
    pred = torch.rand(2, 3, 4, 4, 3, dtype=torch.float64)
    want = ((pred.numpy() - img.numpy() / 255.0) ** 2).sum((-3, -2, -1))
    np.testing.assert_allclose(image_loss(pred, img).numpy(), want, rtol=1e-9)
    x = torch.randn(2, 3, 5, dtype=torch.float64) * 50
    pred = torch.randn(2, 3, 5, dtype=torch.float64)
    sl = np.sign(x.numpy()) * np.log1p(np.abs(x.numpy()))
    np.testing.assert_allclose(vector_loss(pred, x).numpy(), ((pred.numpy() - sl) ** 2).sum(-1),
                               rtol=1e-9)
