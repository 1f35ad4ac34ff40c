"""Speed switches that must not change the maths: `train.onehot_gather` (imagined latents as
class indices, nets.OneHotCat), `train.pad_bins` (255-bin head logits 256 wide, the extra one
-inf), `train.channels_last` (NHWC encoder convolutions) and `train.cpp_kernels` (C++ kernels,
lucid.kernels). Each is compared with the plain computation it replaces."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from train_step import batch_for, spaces  # noqa: E402

from lucid import kernels, nets  # noqa: E402
from lucid.agent import Agent  # noqa: E402
from lucid.config import make_config  # noqa: E402
from lucid.nets import (Head, ImageEncoder, OneHotCat, TwoHot, gather_sum,  # noqa: E402
                        linear, linear_in)
from lucid.world_model import WorldModel  # noqa: E402


@pytest.mark.parametrize("at", [0, 3, 5])  # one-hots first (as [z, a]), in the middle, last
@pytest.mark.parametrize("bias", [False, True])
def test_linear_over_onehot_indices_equals_the_dense_linear(at, bias):
    torch.manual_seed(0)
    G, K, dense_dim, units = 4, 6, 5, 7
    layer = linear(dense_dim + G * K, units, bias=bias)
    if bias:
        torch.nn.init.normal_(layer.bias)
    dense = torch.randn(3, 2, dense_dim, requires_grad=True)
    idx = torch.randint(0, K, (3, 2, G))
    x = OneHotCat(dense, idx, K, at)
    # The dense features written out by hand: [dense[:at], one-hots, dense[at:]].
    onehot = torch.zeros(3, 2, G * K)
    for g in range(G):
        onehot.scatter_(-1, (idx[..., g:g + 1] + g * K), 1.0)
    full = torch.cat([dense[..., :at], onehot, dense[..., at:]], -1)
    assert torch.equal(x.to_dense(), full)

    out = linear_in(layer, x)
    ref = full @ layer.weight.t() + (layer.bias if bias else 0.0)
    assert torch.allclose(out, ref, atol=1e-5)
    # Gradients to the weight (both parts), the bias and the dense input are the dense ones.
    g_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, [layer.weight, dense] + ([layer.bias] if bias else []),
                                g_out)
    refs = torch.autograd.grad(ref, [layer.weight, dense] + ([layer.bias] if bias else []),
                               g_out)
    for a, b in zip(grads, refs):
        assert torch.allclose(a, b, atol=1e-5)
    # Indexing the leading axes and stacking keep the correspondence.
    assert torch.equal(x[1:].to_dense(), full[1:])
    assert torch.equal(OneHotCat.stack([x[0], x[2]]).to_dense(), full[[0, 2]])


def test_gathered_sum_gradient_is_the_one_hot_matmul_gradient_and_finite_differences():
    """The table's gradient (one index_add_ per group) where many rows hit the same class:
    against the transposed one-hot matrix times the output gradient, and in float64 against
    finite differences (torch.autograd.gradcheck)."""
    torch.manual_seed(0)
    rows, G, K, units = 300, 3, 4, 5
    idx = torch.randint(0, K, (rows, G)) + torch.arange(0, G * K, K)  # rows per group's block
    table = torch.randn(G * K, units, requires_grad=True)
    out = gather_sum(idx, table)
    onehot = torch.zeros(rows, G * K).scatter_(1, idx, 1.0)
    torch.testing.assert_close(out, onehot @ table.detach(), rtol=1e-5, atol=1e-5)
    g_out = torch.randn(rows, units)
    (grad,) = torch.autograd.grad(out, table, g_out)
    torch.testing.assert_close(grad, onehot.t() @ g_out, rtol=1e-5, atol=1e-4)
    table64 = torch.randn(G * K, units, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: gather_sum(idx[:20], t), (table64,))


def test_heads_accept_onehot_features():
    torch.manual_seed(0)
    head = Head(8 + 3 * 4, 16, 2, 5)
    x = OneHotCat(torch.randn(10, 8), torch.randint(0, 4, (10, 3)), 4, at=8)
    assert torch.allclose(head(x), head(x.to_dense()), atol=1e-5)


def test_imagination_with_indices_draws_the_same_trajectory_as_with_onehots():
    cfg = make_config("default", model={"size": "nano"})
    obs_spec, act_spec = spaces("vector", "discrete")
    torch.manual_seed(0)
    wm = WorldModel(obs_spec, act_spec.dim, cfg.model)
    actor = Agent(obs_spec, act_spec, cfg).actor
    h = torch.randn(6, wm.D)
    z = F.one_hot(torch.randint(0, wm.K, (6, wm.G)), wm.K).float()
    out = {}
    with torch.no_grad():
        for gather in (False, True):
            torch.manual_seed(1)
            out[gather] = wm.dream(actor, h, z, 5, gather=gather)
    dense_feat, dense_act = out[False]
    idx_feat, idx_act = out[True]
    assert isinstance(idx_feat, OneHotCat)
    assert torch.equal(idx_act, dense_act)
    assert torch.allclose(idx_feat.to_dense(), dense_feat, atol=1e-5)


def _three_updates(action: str, **train) -> tuple[Agent, list[dict]]:
    """A nano agent's metrics over three updates on one fixed batch, seeded alike."""
    cfg = make_config("default", model={"size": "nano"},
                      train={"batch_size": 4, "batch_length": 8, "horizon": 4, **train})
    obs_spec, act_spec = spaces("vector", action)
    torch.manual_seed(0)
    agent = Agent(obs_spec, act_spec, cfg)
    batch = batch_for(obs_spec, act_spec, 4, 8, torch.device("cpu"))
    torch.manual_seed(1)
    return agent, [agent.train(batch) for _ in range(3)]


def _assert_same_metrics(a: list[dict], b: list[dict]) -> None:
    for d, g in zip(a, b):
        for k in d:
            assert g[k] == pytest.approx(d[k], rel=1e-4, abs=1e-6), k


@pytest.mark.parametrize("action,grad", [("discrete", "reinforce"),
                                         ("continuous", "reinforce"),
                                         ("continuous", "dynamics")])
def test_updates_with_and_without_gather_give_the_same_losses(action, grad):
    _, dense = _three_updates(action, onehot_gather=False, continuous_grad=grad)
    _, gathered = _three_updates(action, onehot_gather=True, continuous_grad=grad)
    _assert_same_metrics(dense, gathered)


@pytest.mark.parametrize("shape", [(7, 255), (3, 5, 255), (4, 41)])
def test_padded_head_gives_the_plain_logits_and_minus_inf_columns(shape):
    """`Head.pad_to`: the logits come back padded to a multiple of 8 columns, the first
    out_dim the plain layer's and the rest -inf (probability exactly 0), with and without
    gradient; a softmax of them is the plain softmax followed by zeros."""
    torch.manual_seed(0)
    *lead, out_dim = shape
    width = out_dim + (-out_dim % 8)
    head = Head(6, 16, 1, out_dim)
    torch.nn.init.normal_(head.out.weight)
    torch.nn.init.normal_(head.out.bias)
    x = torch.randn(*lead, 6)
    for grad in (False, True):
        head.pad_to = 0
        with torch.set_grad_enabled(grad):
            ref = head(x)
            head.pad_to = 8
            out = head(x)
        assert out.shape == (*lead, width) and out.is_contiguous()
        assert (out.grad_fn is not None) == grad
        torch.testing.assert_close(out[..., :out_dim], ref, rtol=1e-6, atol=1e-6)
        assert torch.all(out[..., out_dim:] == float("-inf"))
        soft = torch.softmax(out, -1)
        assert torch.all(soft[..., out_dim:] == 0.0)
        torch.testing.assert_close(soft[..., :out_dim], torch.softmax(ref, -1))


@pytest.mark.parametrize("shape", [(7, 255), (3, 5, 255), (4, 41)])
def test_padded_head_has_the_plain_layers_gradients(shape):
    """Gradients of the input and the parameters equal the plain layer's, for a loss on the
    first out_dim columns and for autograd's log-softmax over all columns (whose gradient at
    the -inf columns is 0); a gradient arriving at the padded columns is dropped."""
    torch.manual_seed(0)
    *lead, out_dim = shape
    head = Head(6, 16, 1, out_dim)
    torch.nn.init.normal_(head.out.weight)
    torch.nn.init.normal_(head.out.bias)
    x = torch.randn(*lead, 6)
    weight = torch.linspace(-1, 1, x[..., :1].numel() * out_dim).reshape(*lead, out_dim)

    def grads(pad_to, loss_of):
        head.pad_to = pad_to
        xg = x.clone().requires_grad_()
        return torch.autograd.grad(loss_of(head(xg)), [xg, *head.parameters()])

    losses = {
        "first columns": lambda y: (weight * y[..., :out_dim].square()).sum(),
        "log-softmax": lambda y: -(weight.abs() * torch.log_softmax(y, -1)[..., :out_dim]).sum(),
    }
    for name, loss_of in losses.items():
        got, ref = grads(8, loss_of), grads(0, loss_of)
        assert len(got) == len(ref) == 1 + len(list(head.parameters()))
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4, msg=name)  # sums of ~500
    if out_dim % 8:  # a gradient of 1 on every padded column changes nothing
        got = grads(8, lambda y: (weight * y[..., :out_dim].square()).sum()
                    + y[..., out_dim:].sum())  # -inf, with a gradient of 1 there
        ref = grads(0, losses["first columns"])
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_padded_head_product_under_bf16_autocast_matches_autocasts_own_linear():
    """With gradient under bf16 autocast, the padded product's backward runs in bf16 as
    autocast's linear does, and hands back fp32 gradients of the fp32 parameters."""
    torch.manual_seed(0)
    head = Head(6, 16, 1, 255)
    torch.nn.init.normal_(head.out.weight)
    x = torch.randn(5, 6)
    grads = {}
    for pad_to in (0, 8):
        head.pad_to = pad_to
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = head(x)
        assert y.dtype == torch.bfloat16 and y.shape == (5, 256 if pad_to else 255)
        grads[pad_to] = torch.autograd.grad(y[:, :255].float().square().sum(),
                                            list(head.parameters()))
    for a, b in zip(grads[8], grads[0]):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-2)


def test_updates_with_and_without_padded_bins_give_the_same_losses():
    plain_agent, plain = _three_updates("discrete", pad_bins=False)
    padded_agent, padded = _three_updates("discrete", pad_bins=True)
    for agent, pad_to in ((plain_agent, 0), (padded_agent, 8)):
        heads = (agent.wm.reward, agent.critic.net, agent.critic.slow)
        assert [h.pad_to for h in heads] == [pad_to] * 3
    _assert_same_metrics(plain, padded)


def test_channels_last_encoder_matches_nchw():
    torch.manual_seed(0)
    enc = ImageEncoder(3, 4, 32, 32)
    img = torch.rand(5, 3, 32, 32) - 0.5
    ref = enc(img)
    ref_grads = torch.autograd.grad(ref.square().sum(), list(enc.parameters()))
    enc.channels_last = True
    out = enc(img)
    grads = torch.autograd.grad(out.square().sum(), list(enc.parameters()))
    assert torch.allclose(out, ref, atol=1e-5)
    for a, b in zip(grads, ref_grads):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def test_agent_sets_the_encoder_layout_from_the_config():
    obs_spec, act_spec = spaces("image", "discrete")
    for flag in (False, True):
        cfg = make_config("default", model={"size": "nano"}, train={"channels_last": flag})
        assert Agent(obs_spec, act_spec, cfg).wm.encoder.cnn.channels_last is flag


# --------------------------------------------------------------------------- train.cpp_kernels


@pytest.fixture(params=["avx2", "portable"])
def cpp_kernels(request):
    """lucid's C++ kernels, enabled for one test (built at the first test that asks), with
    their AVX2 loops and again with the portable ones that CPUs without AVX2 and FMA run."""
    kernels.enable(True)
    kernels.use_simd(request.param == "avx2")
    yield kernels
    kernels.use_simd(True)
    kernels.enable(False)


def _table_grads(idx, grad, table_rows: int, threads: int, calls: int = 1):
    """`calls` results of kernels.table_grad on `threads` threads, and the same sum by numpy's
    unbuffered np.add.at in float64."""
    ref = np.zeros((table_rows, grad.shape[1]))
    np.add.at(ref, idx.numpy().ravel(), np.repeat(grad.double().numpy(), idx.shape[1], axis=0))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return [kernels.table_grad(idx, grad, table_rows) for _ in range(calls)], ref
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("rows,G,K,units", [(7, 3, 5, 4), (1000, 4, 6, 9), (15360, 16, 16, 64)])
@pytest.mark.parametrize("threads", [1, 2])
def test_cpp_table_grad_is_numpys_scatter_add(cpp_kernels, rows, G, K, units, threads):
    """table_grad[idx[r, g]] += grad[r] against numpy's unbuffered np.add.at in float64, on one
    thread and split over two (7 rows: one part), and the same bits on every call."""
    torch.manual_seed(0)
    idx = torch.randint(0, K, (rows, G)) + torch.arange(0, G * K, K)
    grad = torch.randn(rows, units)
    (got, again), ref = _table_grads(idx, grad, G * K, threads, calls=2)
    assert got.dtype == torch.float32 and got.shape == (G * K, units)
    np.testing.assert_allclose(got.double().numpy(), ref, rtol=1e-5, atol=1e-5 * rows ** 0.5)
    assert torch.equal(got, again)


def test_cpp_table_grad_is_the_gather_sum_gradient(cpp_kernels):
    """With the kernels on, `gather_sum`'s table gradient (one C++ pass) equals the one-hot
    product's and the index_add_ path's, and non-contiguous inputs are taken as they are."""
    torch.manual_seed(0)
    rows, G, K, units = 2000, 5, 7, 12
    idx = torch.randint(0, K, (rows, G)) + torch.arange(0, G * K, K)
    table = torch.randn(G * K, units, requires_grad=True)
    g_out = torch.randn(units, rows).t()  # a transposed view, as autograd may hand it over
    (grad,) = torch.autograd.grad(gather_sum(idx, table), table, g_out)
    onehot = torch.zeros(rows, G * K).scatter_(1, idx, 1.0)
    torch.testing.assert_close(grad, onehot.t() @ g_out, rtol=1e-5, atol=1e-4)
    kernels.enable(False)
    (plain,) = torch.autograd.grad(gather_sum(idx, table), table, g_out)
    torch.testing.assert_close(grad, plain, rtol=1e-5, atol=1e-4)
    assert kernels.table_grad(idx, g_out.contiguous(), G * K) is None  # off: the ATen path


def test_updates_with_and_without_cpp_kernels_give_the_same_losses():
    _, plain = _three_updates("discrete", cpp_kernels=False)
    agent, fused = _three_updates("discrete", cpp_kernels=True)
    try:
        assert kernels._enabled
        _assert_same_metrics(plain, fused)
    finally:
        kernels.enable(False)


def test_cpp_kernels_that_cannot_be_built_name_the_fix(monkeypatch):
    """No C++ compiler: the error says what failed and the two ways out."""
    import torch.utils.cpp_extension as ext

    def no_compiler(*args, **kwargs):
        raise OSError("g++: command not found")

    monkeypatch.setattr(kernels, "_module", None)
    monkeypatch.setattr(ext, "load_inline", no_compiler)
    with pytest.raises(RuntimeError, match="g\\+\\+: command not found.*train.cpp_kernels=false"):
        kernels.enable(True)
    assert not kernels._enabled


def _np_twohot(logits: np.ndarray, bins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """softmax and symlog-space mean in float64, where -inf logits have probability 0."""
    x = logits.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    return p, p[..., :len(bins)] @ bins


@pytest.mark.parametrize("num_bins,width,lead", [(255, 256, (15, 64)), (255, 255, (7,)),
                                                 (11, 16, (3, 4)), (41, 41, (50,))])
def test_cpp_twohot_softmax_and_mean_are_numpys(cpp_kernels, num_bins, width, lead):
    """The C++ softmax and two-hot mean against float64 numpy, for padded (-inf) and plain
    widths, bins fewer and more than one vector, logits spread so far that exp underflows;
    TwoHot.mean and probs_and_mean take it without gradient and equal the ATen path."""
    high = 20.0 if num_bins == 255 else 5.0
    th = TwoHot(num_bins, -high, high)
    torch.manual_seed(0)
    logits = torch.randn(*lead, width) * 4
    logits[..., :3] -= 120.0  # exp underflows in fp32
    logits[..., num_bins:] = float("-inf")
    bins = th.bins(logits)
    probs, avg = nets.twohot_softmax_mean(logits, bins, True)
    ref_p, ref_avg = _np_twohot(logits.numpy(), bins.double().numpy())
    np.testing.assert_allclose(probs.numpy(), ref_p, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(avg.numpy(), ref_avg, rtol=1e-5, atol=1e-5)
    assert probs.shape == logits.shape and avg.shape == lead
    assert torch.all(probs[..., num_bins:] == 0.0)
    kernels_mean = th.mean(logits)
    kernels_probs, kernels_value = th.probs_and_mean(logits)
    assert torch.equal(kernels_probs, probs)
    kernels.enable(False)
    torch.testing.assert_close(kernels_mean, th.mean(logits), rtol=1e-4, atol=1e-5)
    aten_probs, aten_value = th.probs_and_mean(logits)
    torch.testing.assert_close(kernels_probs, aten_probs, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(kernels_value, aten_value, rtol=1e-4, atol=1e-5)


def test_cpp_twohot_mean_keeps_exact_zeros_and_nans(cpp_kernels):
    """Equal logits give exactly 0 (the pairwise sum), a row with a NaN or +inf logit gives
    NaN as softmax does while the other rows stay right, and with gradient wanted TwoHot
    stays on the differentiable ATen path."""
    th = TwoHot()
    logits = torch.zeros(6, 256)
    logits[:, 255] = float("-inf")
    logits[4, 17] = float("nan")
    logits[5, 200] = float("inf")
    probs, avg = nets.twohot_softmax_mean(logits, th.bins(logits), True)
    assert torch.equal(avg[:4], torch.zeros(4))
    assert torch.isnan(avg[4:]).all() and torch.isnan(probs[4:]).all()
    assert torch.isfinite(probs[:4]).all()
    x = torch.randn(3, 255, requires_grad=True)
    value = th.mean(x)
    assert value.grad_fn is not None
    torch.autograd.grad(value.sum(), x)


@pytest.mark.parametrize("G,K", [(4, 4), (16, 16), (32, 32), (3, 11)])
def test_cpp_latent_samples_are_the_aten_samples(cpp_kernels, G, K):
    """`unimix_index` with the kernel draws the class whose interval of the exact (float64)
    inverse CDF holds u, as categorical_index of unimix_probs does, from the same uniforms
    (widths below, at and above one vector), including uniforms beyond the total probability
    (the last class) and peaked logits. The two may differ only where u lies within float32
    rounding of an interval's end: the kernel's sums follow ATen's AVX2 order, and ATen's
    own order differs with the CPU's vector width (AVX-512)."""
    torch.manual_seed(0)
    logits = torch.randn(2000, G, K) * 3
    logits[:50] *= 40  # peaked: most classes underflow
    u = torch.rand(2000, G, 1)
    u[:5] = 1.0  # at or above a total that rounds below 1
    u[5:10] = 0.0
    got = nets.unimix_index(logits, 0.01, u)
    kernels.enable(False)
    ref = nets.unimix_index(logits, 0.01, u)
    assert got.dtype == torch.long and got.shape == (2000, G)
    assert torch.equal(ref, nets.categorical_index(nets.unimix_probs(logits, 0.01), u))
    cdf = (torch.softmax(logits.double(), -1) * 0.99 + 0.01 / K).cumsum(-1)
    cdf[..., -1] = 2.0  # the last class also takes u above a total that rounds below 1
    below = torch.cat([torch.zeros_like(cdf[..., :1]), cdf[..., :-1]], -1)
    x = u.double().squeeze(-1)
    for idx in (got, ref):  # distance of u outside the drawn class's interval
        miss = ((below.gather(-1, idx[..., None])[..., 0] - x).clamp(min=0)
                + (x - cdf.gather(-1, idx[..., None])[..., 0]).clamp(min=0))
        assert miss.max() < 1e-6, float(miss.max())
    assert (got != ref).sum() <= got.numel() // 10_000, int((got != ref).sum())


# The cases the comparisons above leave open: rows that two threads split unevenly, strided
# indices, float64 inputs (the ATen path), the argument checks, exp's accuracy to a few ulp,
# the row maximum at every position (vector lanes and the scalar tail) and far from 0, and
# uniforms exactly on a cumulative probability.

@pytest.mark.parametrize("rows", [513, 1001])
def test_cpp_table_grad_uneven_split_and_strided_indices(cpp_kernels, rows):
    """Two threads split rows that do not divide evenly (each row counted once), and indices
    handed over as a transposed view are read as their values, not as their storage."""
    torch.manual_seed(0)
    G, K, units = 3, 5, 6
    idx = (torch.randint(0, K, (G, rows)) + torch.arange(0, G * K, K)[:, None]).t()
    assert not idx.is_contiguous()
    grad = torch.randn(rows, units)
    (got,), ref = _table_grads(idx, grad, G * K, threads=2)
    np.testing.assert_allclose(got.double().numpy(), ref, rtol=1e-5, atol=1e-5)


def test_cpp_table_grad_leaves_float64_to_aten(cpp_kernels):
    """A float64 gradient takes the index_add_ path (the kernel is float32 only)."""
    torch.manual_seed(0)
    rows, G, K, units = 300, 2, 3, 4
    idx = torch.randint(0, K, (rows, G)) + torch.arange(0, G * K, K)
    table = torch.randn(G * K, units, dtype=torch.float64, requires_grad=True)
    g_out = torch.randn(rows, units, dtype=torch.float64)
    assert kernels.table_grad(idx, g_out, G * K) is None
    (grad,) = torch.autograd.grad(gather_sum(idx, table), table, g_out)
    onehot = torch.zeros(rows, G * K, dtype=torch.float64).scatter_(1, idx, 1.0)
    torch.testing.assert_close(grad, onehot.t() @ g_out)


def test_cpp_kernels_check_their_arguments(cpp_kernels):
    m = kernels.module()
    with pytest.raises(RuntimeError, match="must share rows"):
        m.table_grad(torch.zeros(8, 2, dtype=torch.long), torch.zeros(6, 3), 4)
    with pytest.raises(RuntimeError, match="odd number of bins"):
        m.twohot_softmax_mean(torch.zeros(3, 16), torch.linspace(-1, 1, 10), 10, False)
    with pytest.raises(RuntimeError, match="odd number of bins"):
        m.twohot_softmax_mean(torch.zeros(3, 16), torch.linspace(-1, 1, 17), 17, False)
    with pytest.raises(RuntimeError, match="unimix_sample"):
        m.unimix_sample(torch.zeros(3, 4), torch.zeros(2), 0.01)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # two parts of 300 rows: the index is in the second
    try:
        for bad in (4, -1):  # an index outside the table, on either side
            idx = torch.zeros(600, 2, dtype=torch.long)
            idx[-1, 1] = bad
            with pytest.raises(RuntimeError, match=r"an index outside \[0, 4\)"):
                m.table_grad(idx, torch.ones(600, 3), 4)
        idx[-1, 1] = 3  # the same call in range
        assert m.table_grad(idx, torch.ones(600, 3), 4)[3].tolist() == [1.0, 1.0, 1.0]
    finally:
        torch.set_num_threads(before)


def test_cpp_twohot_heads_outside_the_kernels_reach_take_aten():
    """Bins not symmetric about 0 or an even number of them: TwoHot keeps the ATen mean
    (the kernel's pairwise sum needs bins[m] = 0 in the middle) and gives numpy's."""
    torch.manual_seed(0)
    logits = torch.randn(5, 12) * 2
    kernels.enable(True)
    try:
        for th in (TwoHot(11, -3.0, 5.0), TwoHot(12, -5.0, 5.0)):
            x = logits[:, :th.num_bins]
            p = np.exp(x.double().numpy())
            p /= p.sum(-1, keepdims=True)
            avg = p @ th.bins(x).double().numpy()
            ref = np.sign(avg) * np.expm1(np.abs(avg))  # symexp
            np.testing.assert_allclose(th.mean(x).numpy(), ref, rtol=1e-5, atol=1e-6)
    finally:
        kernels.enable(False)


@pytest.mark.parametrize("width,n", [(256, 255), (41, 41), (11, 11)])
def test_cpp_twohot_exp_is_within_a_few_ulp(cpp_kernels, width, n):
    """probs[k] / probs[argmax] is exp(l_k - max l) (the kernel's exp of the max's 0 is 1):
    against float64 exp of the same float32 differences over the whole range it keeps."""
    torch.manual_seed(0)
    rows = 64
    d = -torch.rand(rows, width) * 87.0  # l - max over [-87, 0]
    d[:, 0] = 0.0
    logits = d + 3.0
    bins = TwoHot(n, -5.0, 5.0).bins(logits)
    probs, _ = nets.twohot_softmax_mean(logits, bins, True)
    diff = (logits - logits.amax(-1, keepdim=True)).double().numpy()  # the kernel's float32 l - mx
    ratio = probs.double().numpy() / probs[:, :1].double().numpy()
    ref = np.exp(diff)
    keep = ref > 1e-30  # below: near or under the float32 normal range, flushed to 0 below -87.3
    np.testing.assert_allclose(ratio[keep], ref[keep], rtol=1e-6, atol=0)


def test_cpp_twohot_keeps_probabilities_down_to_the_smallest_normal_float(cpp_kernels):
    """Logits up to 87 below the row's max keep their probability (e^-87 = 1.6e-38, still a
    normal float32), in the vector lanes and the scalar tail; from 87.34 below (where float
    exp leaves the normal range) the kernels give exactly 0, where ATen gives denormals."""
    gaps = [0.0, -80.0, -84.0, -86.0, -87.0, -87.5, -90.0, -104.0]
    logits = torch.tensor(gaps * 2 + gaps[:3])[None]  # 19 wide: two vectors and a tail of 3
    probs, _ = nets.twohot_softmax_mean(logits, TwoHot(19, -1.0, 1.0).bins(logits), True)
    x = logits.double().numpy()[0]
    ref = np.exp(x) / np.exp(x).sum()
    kept = x >= -87.0
    np.testing.assert_allclose(probs.numpy()[0][kept], ref[kept], rtol=1e-5, atol=0)
    assert (probs.numpy()[0][~kept] == 0.0).all()


@pytest.mark.parametrize("width,n", [(256, 255), (255, 255), (41, 41), (11, 11), (5, 5)])
def test_cpp_twohot_max_at_any_position_and_far_from_zero(cpp_kernels, width, n):
    """One logit 100 above the others at each position in turn (vector lanes and the scalar
    tail), the whole row offset by 1000: the softmax is numpy's (the kernel's row maximum is
    the right one, or exp overflows or everything underflows)."""
    torch.manual_seed(0)
    logits = torch.randn(width, width) + 1000.0
    logits += torch.eye(width) * 100.0
    bins = TwoHot(n, -5.0, 5.0).bins(logits)
    probs, avg = nets.twohot_softmax_mean(logits, bins, True)
    x = logits.double().numpy()
    e = np.exp(x - x.max(-1, keepdims=True))
    ref_p = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(probs.numpy(), ref_p, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(avg.numpy(), ref_p[:, :n] @ bins.double().numpy(), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("K", [4, 11, 16])
def test_cpp_latent_samples_with_the_max_at_any_position(cpp_kernels, K):
    """One logit 200 above the others at each position (and every logit offset by 1000), u
    high in the last 1% of the mass: the drawn class is the one the float64 inverse CDF
    gives, after the spike (not the spike, as an overflowed exp would give)."""
    torch.manual_seed(0)
    logits = torch.randn(K, K) + 1000.0 + torch.eye(K) * 200.0
    u = torch.full((K, 1), 0.9999)
    got = nets.unimix_index(logits, 0.01, u)
    cdf = (torch.softmax(logits.double(), -1) * 0.99 + 0.01 / K).cumsum(-1)
    ref = (cdf < 0.9999).sum(-1).clamp(max=K - 1)
    assert torch.equal(got, ref)
    assert (ref > torch.arange(K)).sum() >= K - 2  # beyond the spike for most positions


@pytest.mark.parametrize("K", [4, 11, 16])
def test_cpp_latent_samples_of_non_finite_logits_are_atens(cpp_kernels, K):
    """A NaN logit anywhere (vector lanes, tail), a +inf logit, or all -inf: ATen's softmax
    makes the row NaN and its inverse CDF draws the last class; the kernels draw the same
    (the other rows as before)."""
    torch.manual_seed(0)
    logits = torch.randn(K + 3, K)
    for k in range(K):
        logits[k, k] = float("nan")
    logits[K, K // 2] = float("inf")
    logits[K + 1] = float("-inf")  # row K + 2 stays finite
    u = torch.rand(K + 3, 1)
    got = nets.unimix_index(logits, 0.01, u)
    kernels.enable(False)
    assert torch.equal(got, nets.unimix_index(logits, 0.01, u))
    assert (got[:K + 2] == K - 1).all()


@pytest.mark.parametrize("K", [4, 16])
def test_cpp_latent_sample_at_a_cumulative_probability_is_the_class_it_closes(cpp_kernels, K):
    """u equal to a cumulative probability (exact here: equal logits, no unimix, K a power of
    2) draws the class whose interval that value closes, as searchsorted's left side: the
    number of cumulative sums below u."""
    logits = torch.zeros(K - 1, K)
    u = (torch.arange(1, K) / K)[:, None]  # 1/K, 2/K, ... (K-1)/K
    got = nets.unimix_index(logits, 0.0, u)
    assert torch.equal(got, torch.arange(K - 1))
    kernels.enable(False)
    assert torch.equal(nets.unimix_index(logits, 0.0, u), got)


def test_cpp_latent_samples_take_float64_uniforms(cpp_kernels):
    """Uniforms in float64 (as a caller may draw them) are taken as float32, like the ATen path."""
    torch.manual_seed(0)
    logits = torch.randn(50, 3, 7)
    u = torch.rand(50, 3, 1, dtype=torch.float64)
    got = nets.unimix_index(logits, 0.01, u)
    kernels.enable(False)
    assert torch.equal(got, nets.unimix_index(logits, 0.01, u))


def test_cpp_twohot_exp_reduces_to_the_nearest_power_of_two(cpp_kernels):
    """exp(x) = 2^k exp(r) with k the nearest integer to x / ln 2 (|r| <= ln 2 / 2, where the
    polynomial holds ~1 ulp), checked where x / ln 2 lies just below an integer: k rounded
    down instead would leave r near ln 2, 2-3 ulp too low there (a bias of -1.4e-7)."""
    k = torch.arange(1, 121, dtype=torch.float64)
    frac = torch.linspace(0.60, 0.69, 64, dtype=torch.float64)
    d = (-(k[:, None] * np.log(2)) + frac[None, :]).reshape(-1)
    d = d[d > -87].float()
    width = 256
    rows = -(-d.numel() // (width - 1))
    fill = torch.full((rows * (width - 1) - d.numel(),), -1000.0)
    logits = torch.zeros(rows, width)  # column 0: the max, exp 1
    logits[:, 1:] = torch.cat([d, fill]).reshape(rows, width - 1)
    probs, _ = nets.twohot_softmax_mean(logits, TwoHot(255, -5.0, 5.0).bins(logits), True)
    ratio = probs.double().numpy() / probs[:, :1].double().numpy()
    ref = np.exp(logits.double().numpy())
    keep = ref > 1e-30
    rel = ratio[keep] / ref[keep] - 1
    assert keep.sum() > 6000
    assert np.abs(rel).max() < 2e-7 and abs(rel.mean()) < 3e-8, (np.abs(rel).max(), rel.mean())


def test_cpp_kernels_leave_float64_logits_to_aten(cpp_kernels):
    """The kernels take float32 only: float64 logits keep the ATen paths (as the table
    gradient does), with their dtype, instead of failing the kernels' checks."""
    torch.manual_seed(0)
    th = TwoHot()
    x = torch.randn(3, 255, dtype=torch.float64)
    logits = torch.randn(40, 3, 5, dtype=torch.float64)
    u = torch.rand(40, 3, 1)
    got_mean, got_idx = th.mean(x), nets.unimix_index(logits, 0.01, u)
    kernels.enable(False)
    assert got_mean.dtype == torch.float64
    torch.testing.assert_close(got_mean, th.mean(x))
    assert torch.equal(got_idx, nets.unimix_index(logits, 0.01, u))


def test_cpp_twohot_and_samples_take_strided_logits(cpp_kernels):
    """Logits handed over as transposed views, and far below 0 (every logit under -88: the
    row maximum is the row's, not a bound of 0), give the contiguous copies' results."""
    torch.manual_seed(0)
    th = TwoHot(41, -5.0, 5.0)
    logits = torch.randn(41, 30).t() - 1000.0  # (30, 41), strided
    assert not logits.is_contiguous()
    probs, avg = nets.twohot_softmax_mean(logits, th.bins(logits), True)
    x = logits.double().numpy()
    e = np.exp(x - x.max(-1, keepdims=True))
    ref_p = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(probs.numpy(), ref_p, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(avg.numpy(), ref_p @ th.bins(logits).double().numpy(),
                               rtol=1e-5, atol=1e-5)
    flat = torch.randn(16, 300).t() * 3 - 1000.0  # (300, 16) rows of K = 16, strided
    u = torch.rand(300)
    got = nets.unimix_sample(flat, u, 0.01)
    assert torch.equal(got, nets.unimix_sample(flat.contiguous(), u, 0.01))
    cdf = (torch.softmax(flat.double(), -1) * 0.99 + 0.01 / 16).cumsum(-1)
    ref = (cdf < u.double()[:, None]).sum(-1).clamp(max=15)
    assert (got != ref).sum() <= 1
