"""Formula tests for lucid's maths (nets.py, behavior.py): every check compares the code with
an independent computation (numpy, hand-worked numbers, finite differences, plain loops)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lucid.behavior import (ReturnNorm, episode_ends, percentiles, imagined_weights, lambda_return,
                            replay_lambda_return)
from lucid.nets import (LN_EPS, ImageDecoder, ImageEncoder, NormGRUCell, TwoHot, _init_conv,
                        categorical_index, categorical_kl, linear, onehot_sample, symexp, symlog,
                        unimix_logits, unimix_probs)
from numpy_ref import (loop_imagined_weights, loop_lambda_return, np_log_softmax, np_softmax,
                       np_symexp, np_symlog, np_twohot)

F64 = torch.float64


# --------------------------------------------------------------------------- numpy references


PAPER_BINS = np.linspace(-20.0, 20.0, 255)


# --------------------------------------------------------------------------- symlog / symexp


def test_symlog_symexp_match_numpy():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 1, 200), rng.normal(0, 1e3, 200), [0.0, 1.0, -1.0]])
    t = torch.tensor(x, dtype=F64)
    np.testing.assert_allclose(symlog(t).numpy(), np_symlog(x), rtol=1e-14, atol=1e-15)
    y = rng.uniform(-20, 20, 400)
    np.testing.assert_allclose(symexp(torch.tensor(y, dtype=F64)).numpy(), np_symexp(y),
                               rtol=1e-13)


def test_symlog_special_values():
    x = torch.tensor([0.0, 1.0, -1.0, 1e6, -1e6], dtype=F64)
    expected = [0.0, math.log(2.0), -math.log(2.0), math.log(1e6 + 1), -math.log(1e6 + 1)]
    np.testing.assert_allclose(symlog(x).numpy(), expected, rtol=1e-15, atol=0)
    assert symlog(x)[0].item() == 0.0 and symexp(torch.zeros((), dtype=F64)).item() == 0.0
    np.testing.assert_allclose(symexp(torch.tensor([math.log(2.0)], dtype=F64)).numpy(), [1.0],
                               rtol=1e-15)


def test_symlog_symexp_round_trip():
    x = torch.cat([torch.linspace(-1e6, 1e6, 1001, dtype=F64),
                   torch.linspace(-3, 3, 601, dtype=F64)])
    np.testing.assert_allclose(symexp(symlog(x)).numpy(), x.numpy(), rtol=1e-12, atol=1e-12)
    y = torch.linspace(-20, 20, 801, dtype=F64)
    np.testing.assert_allclose(symlog(symexp(y)).numpy(), y.numpy(), rtol=1e-12, atol=1e-12)
    # float32 round trip keeps relative precision too
    x32 = torch.tensor([-1e6, -123.25, -1.0, -1e-3, 0.0, 1e-3, 1.0, 123.25, 1e6])
    np.testing.assert_allclose(symexp(symlog(x32)).numpy(), x32.numpy(), rtol=1e-5, atol=1e-7)


def test_symlog_gradcheck():
    # Finite differences away from 0 (autograd of sign(x) * log1p(|x|) is piecewise there).
    x = torch.tensor([-50.0, -3.0, -0.7, -0.05, 0.05, 0.3, 2.0, 40.0], dtype=F64,
                     requires_grad=True)
    assert torch.autograd.gradcheck(symlog, (x,))
    assert torch.autograd.gradcheck(symexp, (x.detach().clamp(-5, 5).requires_grad_(),))
    # and the closed form d symlog / dx = 1 / (1 + |x|)
    (g,) = torch.autograd.grad(symlog(x).sum(), x)
    np.testing.assert_allclose(g.numpy(), 1.0 / (1.0 + np.abs(x.detach().numpy())), rtol=1e-14)


# --------------------------------------------------------------------------- two-hot


def test_twohot_hand_worked_small():
    th = TwoHot(num_bins=5, low=-2.0, high=2.0)  # bins -2, -1, 0, 1, 2
    enc = th.encode(torch.tensor([0.25, -1.5, 2.0, -2.0, 7.0, -9.0, 1.0], dtype=F64))
    expected = np.array([
        [0, 0, 0.75, 0.25, 0],
        [0.5, 0.5, 0, 0, 0],
        [0, 0, 0, 0, 1],
        [1, 0, 0, 0, 0],
        [0, 0, 0, 0, 1],
        [1, 0, 0, 0, 0],
        [0, 0, 0, 1, 0],
    ])
    np.testing.assert_allclose(enc.numpy(), expected, atol=1e-12)


def test_twohot_encode_matches_numpy_and_round_trips():
    th = TwoHot()  # the paper's 255 bins over [-20, 20]
    assert th.num_bins == 255
    np.testing.assert_allclose(th.bins(torch.zeros(1, dtype=F64)).numpy(), PAPER_BINS,
                               atol=1e-12)
    rng = np.random.default_rng(1)
    y = rng.uniform(-20, 20, (7, 33))
    enc = th.encode(torch.tensor(y, dtype=F64)).numpy()
    assert enc.shape == (7, 33, 255)
    np.testing.assert_allclose(enc, np_twohot(y, PAPER_BINS), atol=1e-9)
    assert (enc >= 0).all()
    np.testing.assert_allclose(enc.sum(-1), 1.0, atol=1e-12)
    assert ((enc > 0).sum(-1) <= 2).all()
    # expected value of the encoding is the value itself
    np.testing.assert_allclose((enc * PAPER_BINS).sum(-1), y, atol=1e-9)


def test_twohot_values_on_bins_and_out_of_range():
    th = TwoHot()
    k = np.arange(255)
    enc = th.encode(torch.tensor(PAPER_BINS, dtype=F64)).numpy()
    # every bin center is (numerically) one-hot on itself
    np.testing.assert_allclose(enc, np.eye(255), atol=1e-9)
    assert (enc.argmax(-1) == k).all()
    # clipping beyond the range: all weight on the edge bin
    out = th.encode(torch.tensor([-25.0, -20.0, 20.0, 25.0, -1e9, 1e9], dtype=F64)).numpy()
    for row, edge in zip(out, [0, 0, 254, 254, 0, 254]):
        expected = np.zeros(255)
        expected[edge] = 1.0
        np.testing.assert_array_equal(row, expected)
    # float32 input behaves the same
    out32 = th.encode(torch.tensor([-25.0, 25.0])).numpy()
    assert out32[0, 0] == 1.0 and out32[1, 254] == 1.0 and out32.sum() == 2.0


def test_twohot_loss_is_numpy_cross_entropy():
    th = TwoHot()
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 2, (6, 5, 255))
    target = np_symexp(rng.uniform(-12, 12, (6, 5)))  # real-space targets
    target[0, 0], target[0, 1] = 0.0, 1e12  # exactly 0 and beyond the range
    got = th.loss(torch.tensor(logits, dtype=F64), torch.tensor(target, dtype=F64)).numpy()
    ref = -(np_twohot(np_symlog(target), PAPER_BINS) * np_log_softmax(logits)).sum(-1)
    assert got.shape == (6, 5)
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)


def test_twohot_loss_gradcheck_and_closed_form():
    th = TwoHot(num_bins=11, low=-5.0, high=5.0)
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 11, dtype=F64, requires_grad=True)
    target = torch.randn(3, 4, dtype=F64) * 10
    assert torch.autograd.gradcheck(lambda lg: th.loss(lg, target), (logits,))
    # d CE / d logits = softmax - twohot
    (g,) = torch.autograd.grad(th.loss(logits, target).sum(), logits)
    bins = np.linspace(-5, 5, 11)
    ref = np_softmax(logits.detach().numpy()) - np_twohot(np_symlog(target.numpy()), bins)
    np.testing.assert_allclose(g.numpy(), ref, atol=1e-12)


def test_twohot_losses_of_several_targets_share_one_pass_and_sum_their_gradients():
    """`losses(logits, *targets)`: each target's cross-entropy as numpy computes it, and the
    gradient of a weighted sum of them against finite differences and the closed form
    sum_k g_k (softmax - twohot_k)."""
    th = TwoHot(num_bins=11, low=-5.0, high=5.0)
    bins = np.linspace(-5, 5, 11)
    torch.manual_seed(1)
    logits = torch.randn(3, 4, 11, dtype=F64, requires_grad=True)
    targets = [torch.randn(3, 4, dtype=F64) * 10, torch.randn(3, 4, dtype=F64)]
    targets[1][0, 0] = 1e9  # beyond the range: the edge bin
    got = th.losses(logits, *targets)
    for t, loss in zip(targets, got):
        ref = -(np_twohot(np_symlog(t.numpy()), bins)
                * np_log_softmax(logits.detach().numpy())).sum(-1)
        np.testing.assert_allclose(loss.detach().numpy(), ref, rtol=1e-12, atol=1e-12)
    g = torch.rand(2, 3, 4, dtype=F64)
    assert torch.autograd.gradcheck(
        lambda lg: sum((gk * lk).sum() for gk, lk in zip(g, th.losses(lg, *targets))),
        (logits,))
    (grad,) = torch.autograd.grad(sum((gk * lk).sum() for gk, lk in zip(g, got)), logits)
    soft = np_softmax(logits.detach().numpy())
    ref = sum(gk.numpy()[..., None] * (soft - np_twohot(np_symlog(t.numpy()), bins))
              for gk, t in zip(g, targets))
    np.testing.assert_allclose(grad.numpy(), ref, atol=1e-12)


def test_twohot_losses_from_the_callers_softmax_and_where_probabilities_underflow():
    """`losses(..., probs=TwoHot.probs(logits))` (the critic's softmax, computed once for its
    values) gives the same losses and gradients; in fp32, a target on a bin whose probability
    underflows to 0 still gets its finite cross-entropy (log p = logit - logsumexp, not
    log of the probability), as numpy computes it in float64."""
    th = TwoHot()
    torch.manual_seed(2)
    logits = (torch.randn(4, 255) * 3).requires_grad_(True)
    with torch.no_grad():
        logits[0, :100] -= 150.0  # exp(-150) underflows in fp32
    targets = [torch.randn(4) * 10, torch.randn(4)]
    targets[0][0] = -np_symexp(19.9)  # a target in the underflowed bins
    assert th.probs(logits)[0, 1].item() == 0.0
    own = th.losses(logits, *targets)
    given = th.losses(logits, *targets, probs=th.probs(logits))
    g = torch.rand(2, 4)
    grads = [torch.autograd.grad(sum((gk * lk).sum() for gk, lk in zip(g, out)), logits)[0]
             for out in (own, given)]
    for a, b in zip(own, given):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    lg = logits.detach().double().numpy()
    for t, loss in zip(targets, own):
        ref = -(np_twohot(np_symlog(t.double().numpy()), PAPER_BINS) * np_log_softmax(lg)).sum(-1)
        np.testing.assert_allclose(loss.detach().numpy(), ref, rtol=1e-5, atol=1e-4)
    assert own[0][0].item() > 100.0  # the underflowed bin's cost, finite
    soft = np_softmax(lg)
    ref = sum(gk.double().numpy()[:, None] * (soft - np_twohot(np_symlog(t.double().numpy()),
                                                                PAPER_BINS))
              for gk, t in zip(g, targets))
    np.testing.assert_allclose(grads[0].numpy(), ref, atol=1e-5)


def test_twohot_mean_matches_numpy():
    th = TwoHot()
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 3, (4, 9, 255))
    got = th.mean(torch.tensor(logits, dtype=F64)).numpy()
    ref = np_symexp((np_softmax(logits) * PAPER_BINS).sum(-1))
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)
    # a peaked distribution on a bin decodes to symexp of that bin
    peak = torch.full((255,), -1e4, dtype=F64)
    peak[200] = 0.0
    np.testing.assert_allclose(th.mean(peak).item(), np_symexp(PAPER_BINS[200]), rtol=1e-12)


@pytest.mark.parametrize("num_bins,low", [(255, -20.0), (11, -5.0), (10, -3.0)])
def test_twohot_reads_logits_padded_with_minus_inf(num_bins, low):
    """Logits wider than num_bins whose extra columns are -inf (the padded heads) give the
    same probabilities (followed by zeros), means, losses and gradients as the plain ones;
    fewer columns than bins is refused."""
    th = TwoHot(num_bins=num_bins, low=low, high=20.0 if num_bins == 255 else 5.0)
    torch.manual_seed(4)
    plain = (torch.randn(3, 4, num_bins, dtype=F64) * 2).requires_grad_(True)
    extra = -num_bins % 8 or 8
    padded = torch.cat([plain, torch.full((3, 4, extra), float("-inf"), dtype=F64)], -1)
    targets = [torch.randn(3, 4, dtype=F64) * 10, torch.randn(3, 4, dtype=F64)]
    p_plain, p_padded = th.probs(plain), th.probs(padded)
    assert torch.all(p_padded[..., num_bins:] == 0.0)
    torch.testing.assert_close(p_padded[..., :num_bins], p_plain, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(th.mean(padded), th.mean(plain), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(th.mean_of(p_padded), th.mean_of(p_plain), rtol=1e-12, atol=1e-12)
    g = torch.rand(2, 3, 4, dtype=F64)
    grads = []
    for logits in (plain, padded):
        out = th.losses(logits, *targets, probs=th.probs(logits))
        grads.append(torch.autograd.grad(sum((gk * lk).sum() for gk, lk in zip(g, out)), plain)[0])
        for lk, ref in zip(out, th.losses(plain.detach(), *targets)):
            torch.testing.assert_close(lk, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="fewer than"):
        th.mean(plain[..., :-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_twohot_mean_of_uniform_logits_is_exactly_zero(dtype):
    # Zero-initialized reward/critic output layers give all-zero logits; with bins symmetric
    # about 0 the expected value is 0 exactly, so dreamed rewards and values start at exactly
    # 0 (the authors' code sums the two halves of the bins symmetrically for this reason).
    th = TwoHot()
    assert th.mean(torch.zeros(3, 255, dtype=dtype)).abs().max().item() == 0.0


# --------------------------------------------------------------------------- categoricals


@pytest.mark.parametrize("k", [2, 4, 32])
def test_unimix_logits(k):
    rng = np.random.default_rng(k)
    logits = rng.normal(0, 8, (50, 3, k))  # includes very peaked rows
    got = unimix_logits(torch.tensor(logits, dtype=F64), 0.01).exp().numpy()
    ref = 0.99 * np_softmax(logits) + 0.01 / k
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-12)
    assert got.min() >= 0.01 / k * (1 - 1e-12)
    # no mixing -> plain log-softmax
    np.testing.assert_allclose(unimix_logits(torch.tensor(logits, dtype=F64), 0.0).numpy(),
                               np_log_softmax(logits), atol=1e-12)


def test_categorical_index_counts_the_cumulative_probabilities_below_u():
    """The binary search gives the inverse-CDF sample written out in numpy from the same
    uniforms: the number of classes whose cumulative probability is below u."""
    rng = np.random.default_rng(3)
    probs = np_softmax(rng.normal(0, 3, (500, 4, 9)))
    probs[:7, :, 2] = 0.0  # zero-probability classes: never drawn
    probs /= probs.sum(-1, keepdims=True)
    probs = torch.tensor(probs, dtype=torch.float32)
    torch.manual_seed(5)
    got = categorical_index(probs)
    torch.manual_seed(5)
    u = torch.rand(500, 4, 1).numpy()
    ref = (np.cumsum(probs.numpy(), -1) < u).sum(-1).clip(max=8)
    np.testing.assert_array_equal(got.numpy(), ref)
    assert got.dtype == torch.int64 and not (got[:7] == 2).any()
    # u above a total that rounded to below 1 gives the last class, not K
    short = torch.full((3, 4), 0.2499)
    u = torch.tensor([[0.5], [0.9996], [0.99999]])
    assert categorical_index(short, u).tolist() == [2, 3, 3]


def test_unimix_probs_are_the_exponentiated_logits():
    torch.manual_seed(0)
    logits = torch.randn(64, 4, 8) * 4
    for unimix in (0.0, 0.01):
        torch.testing.assert_close(unimix_probs(logits, unimix),
                                   unimix_logits(logits, unimix).exp(), rtol=1e-6, atol=1e-7)


def test_onehot_sample_is_onehot_and_frequencies_match():
    torch.manual_seed(0)
    probs = np.array([0.05, 0.1, 0.2, 0.3, 0.35])
    n = 200_000
    logp = torch.tensor(np.log(probs), dtype=torch.float32).expand(n, 5)
    s = onehot_sample(logp, straight_through=False)
    assert s.shape == (n, 5)
    assert set(torch.unique(s).tolist()) <= {0.0, 1.0}
    assert (s.sum(-1) == 1).all()
    counts = s.sum(0).numpy()
    expected = probs * n
    chi2 = ((counts - expected) ** 2 / expected).sum()
    # 4 degrees of freedom: P(chi2 > 25) ~ 5e-5 under the right distribution
    assert chi2 < 25.0, (counts, expected)
    # the straight-through version has the same forward values (up to p - p rounding)
    logits = torch.randn(1000, 3, 7, requires_grad=True)  # a graph: the straight-through
    st = onehot_sample(torch.log_softmax(logits, -1))   # branch runs only with one
    assert st.requires_grad
    assert ((st - st.round()).abs() < 1e-6).all()
    assert (st.round().sum(-1) == 1).all()
    # a class of probability ~0 is never drawn
    logp0 = torch.log(torch.tensor([0.5, 0.5, 1e-30])).expand(50_000, 3)
    assert onehot_sample(logp0)[:, 2].round().sum() == 0


def test_onehot_sample_grouped_frequencies():
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    probs = np_softmax(rng.normal(0, 1, (3, 4)))  # 3 groups of 4 classes, independent
    n = 40_000
    logp = torch.tensor(np.log(probs), dtype=torch.float32).expand(n, 3, 4)
    freq = onehot_sample(logp).detach().round().mean(0).numpy()
    sigma = np.sqrt(probs * (1 - probs) / n)
    assert (np.abs(freq - probs) < 5 * sigma).all()


def test_onehot_sample_straight_through_gradient():
    torch.manual_seed(2)
    rng = np.random.default_rng(2)
    raw = rng.normal(0, 1.5, (6, 4, 5))
    w = rng.normal(0, 1, (6, 4, 5))
    for unimix in (0.0, 0.01):
        logits = torch.tensor(raw, dtype=F64, requires_grad=True)
        sample = onehot_sample(unimix_logits(logits, unimix))
        (g,) = torch.autograd.grad((torch.tensor(w) * sample).sum(), logits)
        # d/dlogits sum(w * p) with p = (1-u) softmax + u/K: (1-u) * s * (w - <w, s>)
        s = np_softmax(raw)
        ref = (1 - unimix) * s * (w - (w * s).sum(-1, keepdims=True))
        np.testing.assert_allclose(g.numpy(), ref, atol=1e-12)
    # without straight-through the sample carries no gradient
    logits = torch.tensor(raw, dtype=F64, requires_grad=True)
    assert not onehot_sample(torch.log_softmax(logits, -1), straight_through=False).requires_grad


def test_init_is_a_truncated_normal_of_fan_average_variance():
    """The authors' variance scaling: Var = 1 / fan_avg, drawn from a normal truncated at 2
    of its standard deviations, whose std is first divided by 0.8796 (the truncated normal's
    std) so that the weights keep Var = 1 / fan_avg; fans of a conv count its kernel."""
    torch.manual_seed(0)
    layer = linear(600, 1000)
    conv = torch.nn.Conv2d(48, 96, 4, bias=False)
    _init_conv(conv)
    for w, fan_avg in ((layer.weight, 800), (conv.weight, 16 * (48 + 96) / 2)):
        w = w.detach().double()
        target = 1.0 / math.sqrt(fan_avg)
        assert w.std().item() == pytest.approx(target, rel=0.01)  # over >= 73,728 weights
        cut = 2.0 * target / 0.87962566103423978
        assert w.abs().max().item() <= cut and w.abs().max().item() > 0.98 * cut
        assert abs(w.mean().item()) < 0.02 * target
    assert torch.equal(layer.bias, torch.zeros(1000))


def test_categorical_kl_matches_numpy():
    rng = np.random.default_rng(4)
    a, b = rng.normal(0, 2, (2, 10, 32, 32))
    lp, lq = np_log_softmax(a), np_log_softmax(b)
    ref = (np.exp(lp) * (lp - lq)).sum(-1).sum(-1)  # summed over the 32 groups
    got = categorical_kl(torch.tensor(lp, dtype=F64), torch.tensor(lq, dtype=F64)).numpy()
    assert got.shape == (10,)
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    assert (got > 0).all()
    same = categorical_kl(torch.tensor(lp, dtype=F64), torch.tensor(lp, dtype=F64))
    assert same.abs().max().item() == 0.0
    # hand-worked: one group, p = (1/2, 1/2), q = (1/4, 3/4)
    p = torch.log(torch.tensor([[[0.5, 0.5]]], dtype=F64))
    q = torch.log(torch.tensor([[[0.25, 0.75]]], dtype=F64))
    hand = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    np.testing.assert_allclose(categorical_kl(p, q).numpy(), [hand], rtol=1e-14)


# --------------------------------------------------------------------------- λ-returns


def nstep_lambda_return(r, c, v, gamma, lam):
    """The same quantity as a λ-weighted mixture of n-step returns (double loop over the
    start step and the horizon): R_t = (1-λ) Σ_{n<H-t} λ^{n-1} G_t^n + λ^{H-t-1} G_t^{H-t}."""
    H1, N = r.shape
    H = H1 - 1
    out = np.zeros((H, N))
    for t in range(H):
        def G(n):
            total, disc = 0.0, np.ones(N)
            for k in range(1, n + 1):
                total = total + disc * r[t + k]
                disc = disc * gamma * c[t + k]
            return total + disc * v[t + n]
        L = H - t
        mix = sum((1 - lam) * lam ** (n - 1) * G(n) for n in range(1, L))
        out[t] = mix + lam ** (L - 1) * G(L)
    return out


@pytest.mark.parametrize("gamma,lam", [(0.997, 0.95), (0.9, 0.5), (0.99, 1.0), (0.99, 0.0)])
def test_lambda_return_matches_loops(gamma, lam):
    rng = np.random.default_rng(5)
    H, N = 7, 5
    r = rng.normal(0, 1, (H + 1, N))
    v = rng.normal(0, 3, (H + 1, N))
    c = (rng.uniform(size=(H + 1, N)) > 0.2).astype(np.float64)
    c[:, 0] = 1.0
    c[3:, 1] = 0.0  # an episode end inside the dream
    got = lambda_return(*(torch.tensor(x, dtype=F64) for x in (r, c, v)), gamma, lam).numpy()
    assert got.shape == (H, N)
    np.testing.assert_allclose(got, loop_lambda_return(r, c, v, gamma, lam), rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_allclose(got, nstep_lambda_return(r, c, v, gamma, lam), rtol=1e-10,
                               atol=1e-10)


def test_lambda_return_hand_worked_two_steps():
    # γ = λ = 0.5; r1 = 1, r2 = 2; V = (V0, V1, V2) = (100, 4, 8); c = 1.
    #   R2 = V2 = 8;  R1 = r2 + γ c2 ((1-λ) V2 + λ R2) = 2 + 0.5 * 8 = 6
    #   R0 = r1 + γ c1 ((1-λ) V1 + λ R1) = 1 + 0.5 * (2 + 3) = 3.5
    # Column 2 ends at step 2 (c2 = 0): R1 = 2, R0 = 1 + 0.5 * (2 + 1) = 2.5
    r = torch.tensor([[9.0, 9.0], [1.0, 1.0], [2.0, 2.0]], dtype=F64)
    c = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]], dtype=F64)
    v = torch.tensor([[100.0, 100.0], [4.0, 4.0], [8.0, 8.0]], dtype=F64)
    got = lambda_return(r, c, v, 0.5, 0.5).numpy()
    np.testing.assert_allclose(got, [[3.5, 2.5], [6.0, 2.0]], rtol=1e-15)


def test_lambda_return_limits():
    rng = np.random.default_rng(6)
    H, N, gamma = 6, 4, 0.9
    r = rng.normal(size=(H + 1, N))
    v = rng.normal(size=(H + 1, N))
    c = np.ones((H + 1, N))
    c[4:, 2] = 0.0
    args = [torch.tensor(x, dtype=F64) for x in (r, c, v)]
    # λ = 1: discounted Monte-Carlo sum of rewards plus the bootstrap V_H
    mc = np.zeros((H, N))
    for t in range(H):
        disc = np.ones(N)
        for k in range(t + 1, H + 1):
            mc[t] += disc * r[k]
            disc = disc * gamma * c[k]
        mc[t] += disc * v[H]
    np.testing.assert_allclose(lambda_return(*args, gamma, 1.0).numpy(), mc, rtol=1e-12)
    # λ = 0: one-step TD targets
    td = r[1:] + gamma * c[1:] * v[1:]
    np.testing.assert_allclose(lambda_return(*args, gamma, 0.0).numpy(), td, rtol=1e-12)


def _forward_sum_replay_return(r, last, term, boot, gamma, lam):
    """Replay λ-returns as explicit forward sums over the n-step returns they mix: from step t,
    step k > t contributes its reward and, with weight (1 - λ_k), the bootstrap boot_k, each
    discounted by the product of γ (1 - term_j) λ_j over the steps t < j < k; λ_k is λ except 0
    where step k ends an episode or the window (full bootstrap there)."""
    B, T = r.shape
    out = np.zeros((B, T - 1))
    for b in range(B):
        for t in range(T - 1):
            disc, total = 1.0, 0.0
            for k in range(t + 1, T):
                lam_k = 0.0 if (last[b, k] or k == T - 1) else lam
                live = gamma * (1.0 - term[b, k])
                total += disc * (r[b, k] + live * (1.0 - lam_k) * boot[b, k])
                disc *= live * lam_k
                if disc == 0.0:
                    break
            out[b, t] = total
    return out


@pytest.mark.parametrize("gamma,lam", [(0.997, 0.95), (0.9, 0.5), (1.0, 1.0)])
def test_replay_lambda_return_matches_forward_sums(gamma, lam):
    rng = np.random.default_rng(11)
    B, T = 4, 9
    r = rng.normal(size=(B, T))
    boot = rng.normal(0, 5, size=(B, T))
    last = np.zeros((B, T), bool)
    term = np.zeros((B, T), bool)
    last[1, 4] = term[1, 4] = True  # an episode that terminates inside the window
    last[2, 6] = True  # one cut by a time limit (bootstrapped, not terminal)
    last[3, 2] = term[3, 2] = last[3, 7] = True
    got = replay_lambda_return(*(torch.tensor(x) for x in (r, last, term, boot)), gamma, lam)
    assert got.shape == (B, T - 1)
    np.testing.assert_allclose(got.numpy(), _forward_sum_replay_return(r, last, term, boot,
                                                                      gamma, lam), rtol=1e-12)


def test_replay_lambda_return_hand_worked():
    # γ = λ = 0.5, T = 4, rewards r = (9, 1, 2, 4) (r_0 is never used), boot = (100, 10, 20, 40).
    #   R3 = boot3 = 40; R2 = r3 + γ (λ/2 mix) = 4 + 0.5 (0.5 * 40 + 0.5 * 40) = 24
    #   R1 = r2 + γ ((1-λ) boot2 + λ R2) = 2 + 0.5 (10 + 12) = 13
    #   R0 = 1 + 0.5 (0.5 * 10 + 0.5 * 13) = 6.75
    # Row 2: step 2 is terminal (and last): R1 = r2 = 2, R0 = 1 + 0.5 (5 + 1) = 4,
    #   R2 = r3 + γ boot3 = 24 (mixes episodes: the loss weights it 0).
    r = torch.tensor([[9.0, 1.0, 2.0, 4.0]] * 2, dtype=F64)
    boot = torch.tensor([[100.0, 10.0, 20.0, 40.0]] * 2, dtype=F64)
    last = torch.tensor([[0, 0, 0, 0], [0, 0, 1, 0]], dtype=torch.bool)
    got = replay_lambda_return(r, last, last, boot, 0.5, 0.5).numpy()
    np.testing.assert_allclose(got, [[6.75, 13.0, 24.0], [4.0, 2.0, 24.0]], rtol=1e-15)


def test_episode_ends_include_a_step_before_an_unmarked_episode_start():
    # Row 0: an episode ends at step 1 as collected (is_last, then is_first). Row 1: the
    # stream was cut after step 2 (a resume): step 3 starts an episode, step 2 is not marked.
    last = torch.tensor([[0, 1, 0, 0, 0], [0, 0, 0, 0, 1]], dtype=torch.bool)
    first = torch.tensor([[1, 0, 1, 0, 0], [0, 0, 0, 1, 0]], dtype=torch.bool)
    np.testing.assert_array_equal(episode_ends(last, first).int().numpy(),
                                  [[0, 1, 0, 0, 0], [0, 0, 1, 0, 1]])


def test_imagined_weights_loop():
    rng = np.random.default_rng(7)
    H1, N, gamma = 8, 6, 0.97
    c = (rng.uniform(size=(H1, N)) > 0.25).astype(np.float64)
    c[:, 0] = 1.0
    c[0, 1] = 0.0  # terminal start state
    got = imagined_weights(torch.tensor(c, dtype=F64), gamma).numpy()
    np.testing.assert_allclose(got, loop_imagined_weights(c, gamma), rtol=1e-13)
    np.testing.assert_allclose(got[:, 0], gamma ** np.arange(H1), rtol=1e-13)  # no ends
    assert (got[:, 1] == 0).all()  # terminal start: nothing counts


# --------------------------------------------------------------------------- return norm


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1031])
def test_percentiles_match_numpy(n):
    rng = np.random.default_rng(n)
    x = rng.normal(0, 3, n).astype(np.float32)
    x[: n // 3] = x[0]  # ties
    qs = (0.0, 0.05, 0.25, 0.5, 0.95, 0.999, 1.0, float(rng.random()))
    got = [v.item() for v in percentiles(torch.tensor(x).reshape(-1, 1), qs)]
    np.testing.assert_allclose(got, np.percentile(x.astype(np.float64), [100 * q for q in qs]),
                               rtol=1e-6, atol=1e-6)


def test_percentiles_of_non_finite_values():
    x = torch.arange(21.0)
    x[-1] = float("inf")  # the 95th percentile falls exactly on 19: not blended with inf
    lo, hi, top = percentiles(x, (0.05, 0.95, 0.975))
    assert (lo.item(), hi.item(), top.item()) == (1.0, 19.0, float("inf"))
    x[3] = float("nan")  # any NaN makes every percentile NaN, as np.percentile and quantile
    assert all(torch.isnan(v) for v in percentiles(x, (0.0, 0.05, 0.5)))


@pytest.mark.parametrize("min_scale", [1.0, 1e-8])
@pytest.mark.parametrize("spread", [10.0, 0.05])
def test_return_norm_ema_of_percentiles(min_scale, spread):
    rng = np.random.default_rng(8)
    norm = ReturnNorm(decay=0.99, low=5.0, high=95.0, min_scale=min_scale)
    low = high = 0.0
    for i in range(12):
        ret = rng.normal(i * spread * 0.1, spread, (16, 33)).astype(np.float32)
        norm.update(torch.tensor(ret))
        low = 0.99 * low + 0.01 * np.percentile(ret.astype(np.float64), 5)
        high = 0.99 * high + 0.01 * np.percentile(ret.astype(np.float64), 95)
        np.testing.assert_allclose(norm.low.item(), low, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(norm.high.item(), high, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(norm.scale().item(), max(min_scale, high - low),
                                   rtol=1e-4, atol=1e-9)
    if spread < 1 and min_scale == 1.0:
        assert norm.scale().item() == 1.0  # small returns are not blown up
    if spread < 1 and min_scale < 1:
        assert norm.scale().item() < 0.1


@pytest.mark.parametrize("end", ["high", "low", "both"])
def test_return_norm_keeps_its_ema_when_a_percentile_is_not_finite(end):
    """A batch of returns whose 5th or 95th percentile is inf or NaN leaves both EMAs as they
    were (one non-finite update would make the scale inf or NaN for good)."""
    norm = ReturnNorm(decay=0.99, low=5.0, high=95.0)
    norm.update(torch.arange(100.0))
    low, high = norm.low.clone(), norm.high.clone()
    bad = torch.arange(100.0)
    if end in ("high", "both"):
        bad[-10:] = float("inf")  # the 95th percentile is inf, the 5th finite
    if end in ("low", "both"):
        bad[:10] = float("-inf") if end == "low" else float("nan")
    norm.update(bad)
    assert torch.equal(norm.low, low) and torch.equal(norm.high, high)
    norm.update(torch.arange(100.0))  # and the next finite batch moves them again
    assert norm.high > high


# --------------------------------------------------------------------------- GRU


def test_norm_gru_cell_matches_numpy():
    torch.manual_seed(3)
    in_dim, units, n = 5, 7, 4
    cell = NormGRUCell(in_dim, units).double()
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        cell.norm.weight.uniform_(0.5, 1.5)
        cell.norm.bias.normal_(0, 0.3)
    assert cell.linear.bias is None
    x = torch.randn(n, in_dim, dtype=F64)
    h = torch.randn(n, units, dtype=F64).tanh()
    got = cell(x, h).detach().numpy()

    W = cell.linear.weight.detach().numpy()  # (3U, in + U)
    g, b = cell.norm.weight.detach().numpy(), cell.norm.bias.detach().numpy()
    xn, hn = x.numpy(), h.numpy()
    ref = np.zeros((n, units))
    for i in range(n):
        pre = W @ np.concatenate([xn[i], hn[i]])  # no bias
        mu, var = pre.mean(), pre.var()  # LayerNorm over all 3U units
        pre = (pre - mu) / np.sqrt(var + LN_EPS) * g + b
        r, c, u = pre[:units], pre[units:2 * units], pre[2 * units:]
        reset = 1 / (1 + np.exp(-r))
        cand = np.tanh(reset * c)
        update = 1 / (1 + np.exp(-(u - 1.0)))
        ref[i] = update * cand + (1 - update) * hn[i]
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- images


def test_image_encoder_decoder_shapes():
    torch.manual_seed(4)
    mult = 4
    enc = ImageEncoder(3, mult, 64, 64)
    img = torch.randint(0, 256, (2, 3, 64, 64)).float() / 255 - 0.5
    fmap = enc.net(img)
    assert fmap.shape == (2, 8 * mult, 4, 4)  # 64 -> 32 -> 16 -> 8 -> 4
    convs = [m for m in enc.net if isinstance(m, torch.nn.Conv2d)]
    assert [cv.out_channels for cv in convs] == [mult, 2 * mult, 4 * mult, 8 * mult]
    assert all(cv.kernel_size == (4, 4) and cv.stride == (2, 2) for cv in convs)
    out = enc(img)
    assert out.shape == (2, 8 * mult * 16) and enc.out_dim == 8 * mult * 16
    dec = ImageDecoder(40, 3, mult, 64, 64)
    rec = dec(torch.randn(5, 40))
    assert rec.shape == (5, 3, 64, 64)
    # non-square: stages until the shorter side is 4 (32 -> 3 stages), channels 1, 2, 4 x mult
    assert ImageEncoder(1, 2, 32, 64)(torch.zeros(1, 1, 32, 64)).shape == (1, 4 * 2 * 4 * 8)
    assert ImageDecoder(40, 1, 2, 32, 64)(torch.randn(1, 40)).shape == (1, 1, 32, 64)
