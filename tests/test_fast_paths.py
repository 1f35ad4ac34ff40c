"""Speed switches that must not change the maths: `train.onehot_gather` (imagined latents as
class indices, nets.OneHotCat), `train.pad_bins` (255-bin head logits 256 wide, the extra one
-inf) and `train.channels_last` (NHWC encoder convolutions). Each is compared with the plain
computation it replaces."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from train_step import batch_for, spaces  # noqa: E402

from lucid.agent import Agent  # noqa: E402
from lucid.config import make_config  # noqa: E402
from lucid.nets import Head, ImageEncoder, linear  # noqa: E402
from lucid.ops.onehot import OneHotCat, gather_sum, linear_in  # noqa: E402
from lucid.ops.twohot import twohot_nll, twohot_nll_plain  # noqa: E402
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
            out[gather] = wm.imagine_no_grad(actor, h, z, 5, gather=gather)
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


@pytest.mark.parametrize("lead,bins,n", [((7,), 255, 2), ((3, 5), 41, 1), ((4,), 11, 3)])
def test_twohot_nll_gives_the_plain_losses_and_gradients(lead, bins, n):
    """`ops.twohot.twohot_nll` (the gradient written out from the caller's softmax) equals
    autograd through log_softmax and gather, in value and in the logits' gradient."""
    torch.manual_seed(0)
    logits = (torch.randn(*lead, bins, dtype=torch.float64) * 3).requires_grad_()
    below = torch.randint(0, bins - 1, (n, *lead))
    w_above = torch.rand(n, *lead, dtype=torch.float64)
    g = torch.randn(n, *lead, dtype=torch.float64)
    with torch.no_grad():
        probs = torch.softmax(logits, -1)
        lse = torch.logsumexp(logits, -1, keepdim=True)
    fast = twohot_nll(logits, probs, lse, below, w_above)
    plain = twohot_nll_plain(logits, below, w_above)
    torch.testing.assert_close(fast, plain)
    (g_fast,) = torch.autograd.grad((g * fast).sum(), logits)
    (g_plain,) = torch.autograd.grad((g * plain).sum(), logits)
    torch.testing.assert_close(g_fast, g_plain)


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


def test_the_retired_cpp_kernels_key_still_loads_and_warns():
    """Config files written while lucid had C++ kernels name `train.cpp_kernels`: they load,
    and `true` warns that it does nothing."""
    from lucid.warn import LucidWarning
    obs_spec, act_spec = spaces("vector", "discrete")
    cfg = make_config("default", model={"size": "nano"}, train={"cpp_kernels": True})
    with pytest.warns(LucidWarning, match="train.cpp_kernels has no effect"):
        Agent(obs_spec, act_spec, cfg)
