"""The Nature recipe's layers (lucid/nature_nets.py) against numpy forward passes written from
the authors' code (danijar/dreamerv3: nets.Norm 'rms', Linear, BlockLinear, RSSM._core), and
their parameter counts against the shapes that code makes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lucid.nature_nets import BlockGRU, BlockLinear, Linear, RMSNorm


def _np(t):
    return t.detach().double().numpy()


def np_rms(x, scale, eps=1e-4):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * scale


def np_silu(x):
    return x / (1 + np.exp(-x))


def np_sigmoid(x):
    return 1 / (1 + np.exp(-x))


def np_block_linear(x, kernel, bias):
    """The authors' einsum: x (..., blocks, in/blocks) · kernel (blocks, in/blocks, out/blocks)."""
    g = kernel.shape[0]
    y = np.einsum("...ki,kio->...ko", x.reshape(*x.shape[:-1], g, -1), kernel)
    return y.reshape(*y.shape[:-2], -1) + bias


def test_rms_norm():
    x = torch.randn(3, 5, 8) * 4
    norm = RMSNorm(8)
    with torch.no_grad():
        norm.scale.copy_(torch.linspace(0.5, 2.0, 8))
    np.testing.assert_allclose(_np(norm(x)), np_rms(_np(x), _np(norm.scale)), rtol=1e-5,
                               atol=1e-6)
    assert [n for n, _ in norm.named_parameters()] == ["scale"]  # scale only, no shift


def test_block_linear_is_a_block_diagonal_linear():
    layer = BlockLinear(12, 8, blocks=4)
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(2, 3, 12)
    kernel = _np(layer.weight)
    np.testing.assert_allclose(_np(layer(x)), np_block_linear(_np(x), kernel, _np(layer.bias)),
                               rtol=1e-5, atol=1e-6)
    full = np.zeros((12, 8))  # the same map as one dense weight with zero blocks off-diagonal
    for k in range(4):
        full[3 * k:3 * k + 3, 2 * k:2 * k + 2] = kernel[k]
    np.testing.assert_allclose(_np(layer(x)), _np(x) @ full + _np(layer.bias), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(ValueError, match="divide into 4 blocks"):
        BlockLinear(10, 8, blocks=4)


def test_init_is_a_truncated_normal_of_unit_variance_over_fan_in():
    """The weights' std is 1 / sqrt(fan_in) (1.1368 undoes the truncation's 0.8796), none
    beyond 2 · 1.1368 / sqrt(fan_in); BlockLinear's fan_in is its whole input; biases are
    zero; outscale 0 gives zeros."""
    for layer, fan_in in ((Linear(400, 300), 400), (BlockLinear(800, 400, blocks=8), 800)):
        w = _np(layer.weight)
        assert abs(w.std() * np.sqrt(fan_in) - 1.0) < 0.02
        assert np.abs(w).max() <= 2 * 1.1368 / np.sqrt(fan_in) + 1e-7
        assert not _np(layer.bias).any()
    assert not _np(Linear(10, 4, outscale=0.0).weight).any()
    w = _np(Linear(400, 300, outscale=0.01).weight)
    assert abs(w.std() * np.sqrt(400) / 0.01 - 1.0) < 0.02


def np_block_gru(core: BlockGRU, h, z, a):
    """RSSM._core of the authors' code, in numpy, with `core`'s weights."""
    g = core.blocks
    a = a / np.maximum(1, np.abs(a))
    xs = []
    for dense, v in zip(core.dynin, (h, z.reshape(len(z), -1), a)):
        lin, norm = dense[0], dense[1]
        xs.append(np_silu(np_rms(v @ _np(lin.weight).T + _np(lin.bias), _np(norm.scale))))
    x = np.concatenate(xs, -1)
    x = np.repeat(x[:, None, :], g, 1)
    x = np.concatenate([h.reshape(len(h), g, -1), x], -1).reshape(len(h), -1)
    for linear, norm in core.hidden:
        x = np_silu(np_rms(np_block_linear(x, _np(linear.weight), _np(linear.bias)),
                           _np(norm.scale)))
    x = np_block_linear(x, _np(core.gates.weight), _np(core.gates.bias))
    groups = x.reshape(len(h), g, -1)
    reset, cand, update = (p.reshape(len(h), -1) for p in np.split(groups, 3, -1))
    reset = np_sigmoid(reset)
    cand = np.tanh(reset * cand)
    update = np_sigmoid(update - 1)
    return update * cand + (1 - update) * h


@pytest.mark.parametrize("layers", [1, 2])
def test_block_gru_step_equals_the_authors_core(layers):
    torch.manual_seed(0)
    core = BlockGRU(deter=64, stoch_dim=4 * 3, act_dim=5, hidden=16, blocks=8, layers=layers)
    with torch.no_grad():  # norms and biases away from their initial values
        for name, p in core.named_parameters():
            if "scale" in name or "bias" in name:
                p.normal_(1.0 if "scale" in name else 0.0, 0.3)
    h = torch.randn(6, 64)
    z = torch.nn.functional.one_hot(torch.randint(0, 3, (6, 4)), 3).float()
    a = torch.randn(6, 5) * 2  # |a| > 1 is scaled to 1
    want = np_block_gru(core, _np(h), _np(z), _np(a))
    np.testing.assert_allclose(_np(core(h, z, a)), want, rtol=1e-4, atol=1e-5)


def test_block_gru_parameter_count_of_size12m():
    """size12m: deter 2048, hidden 256, 32 stoch x 16 classes, 8 blocks, 1 hidden layer,
    18 actions; counted from the shapes the authors' code makes: dynin0/1/2 kernels and
    biases with an RMS scale each, dynhid0 a (8, 256 + 3·256, 256) block kernel with bias and
    scale, dyngru a (8, 256, 768) block kernel with bias."""
    deter, hidden, stoch, classes, acts, g = 2048, 256, 32, 16, 18, 8
    want = ((deter + 1) * hidden + hidden
            + (stoch * classes + 1) * hidden + hidden
            + (acts + 1) * hidden + hidden
            + g * ((deter // g + 3 * hidden) * (deter // g)) + deter + deter
            + g * (deter // g) * (3 * deter // g) + 3 * deter)
    core = BlockGRU(deter, stoch * classes, acts, hidden, blocks=g, layers=1)
    assert sum(p.numel() for p in core.parameters()) == want


def np_symexp_bins(n=255):
    half = np.linspace(-20, 0, (n - 1) // 2 + 1 if n % 2 else n // 2)
    half = np.sign(half) * (np.exp(np.abs(half)) - 1)
    return np.concatenate([half, -(half[:-1] if n % 2 else half)[::-1]])


def np_twohot_loss(logits, target, bins):
    """outs.TwoHot.loss of the authors' code (dense two-hot target), in numpy."""
    n = len(bins)
    below = np.clip((bins <= target[..., None]).sum(-1) - 1, 0, n - 1)
    above = np.clip(n - (bins > target[..., None]).sum(-1), 0, n - 1)
    equal = below == above
    d_below = np.where(equal, 1, np.abs(bins[below] - target))
    d_above = np.where(equal, 1, np.abs(bins[above] - target))
    total = d_below + d_above
    onehot = np.eye(n)
    dense = onehot[below] * (d_above / total)[..., None] + onehot[above] * (d_below / total)[..., None]
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    return -(dense * logp).sum(-1)


@pytest.mark.parametrize("n", [255, 8])
def test_symexp_twohot_bins_loss_and_mean_against_numpy(n):
    from lucid.nature_nets import SymexpTwoHot
    th = SymexpTwoHot(n)
    bins = np_symexp_bins(n)
    got = _np(th.bins(torch.zeros((), dtype=torch.float64)))
    np.testing.assert_allclose(got, bins, rtol=1e-12)
    # increasing (an even count has the authors' two zeros in the middle), mirrored
    assert np.all(np.diff(got) > 0 if n % 2 else np.diff(got) >= 0)
    assert np.allclose(got, -got[::-1])
    if n % 2:
        assert got[n // 2] == 0.0 and abs(got[-1] - (np.exp(20) - 1)) < 1e-3
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=(4, 6, n)) * 2)
    # targets between bins, on a bin, at 0, beyond the last bin and below the first
    target = torch.tensor(rng.normal(size=(4, 6)) * 30)
    target[0, :5] = torch.tensor([bins[3], 0.0, 1e12, -1e12, bins[-2]])
    np.testing.assert_allclose(_np(th.loss(logits, target)),
                               np_twohot_loss(_np(logits), _np(target), bins), rtol=1e-10,
                               atol=1e-10)
    probs = np.exp(_np(logits)) / np.exp(_np(logits)).sum(-1, keepdims=True)
    np.testing.assert_allclose(_np(th.mean(logits)), probs @ bins, rtol=1e-9, atol=1e-9)
    assert float(th.mean(torch.zeros(3, n)).abs().max()) == 0.0  # exactly 0 at init


def np_conv_same(x, conv):
    """NHWC 'same' convolution, stride 1, with an HWIO kernel (the authors' layout)."""
    kernel = _np(conv.weight).transpose(2, 3, 1, 0)
    k = kernel.shape[0]
    pad = np.pad(x, ((0, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)))
    win = np.lib.stride_tricks.sliding_window_view(pad, (k, k), axis=(1, 2))
    return np.einsum("bhwcij,ijco->bhwo", win, kernel) + _np(conv.bias)


def np_encoder(enc, img):
    x = img.astype(np.float64) / 255 - 0.5
    for conv, norm in zip(enc.convs, enc.norms):
        x = np_conv_same(x, conv)
        B, H, W, C = x.shape
        x = x.reshape(B, H // 2, 2, W // 2, 2, C).max((2, 4))
        x = np_silu(np_rms(x, _np(norm.scale)))
    return x.reshape(len(x), -1)


def np_decoder(dec, h, z):
    g, (hh, ww), top = dec.bspace, dec.res, dec.top
    x0 = np_block_linear(h, _np(dec.sp0.weight), _np(dec.sp0.bias))
    x0 = x0.reshape(len(h), g, hh, ww, top // g).transpose(0, 2, 3, 1, 4).reshape(
        len(h), hh, ww, top)  # einops '(g h w c) -> h w (g c)'
    lin, norm = dec.sp1[0], dec.sp1[1]
    x1 = np_silu(np_rms(z @ _np(lin.weight).T + _np(lin.bias), _np(norm.scale)))
    x1 = (x1 @ _np(dec.sp2.weight).T + _np(dec.sp2.bias)).reshape(len(h), hh, ww, top)
    x = np_silu(np_rms(x0 + x1, _np(dec.spnorm.scale)))
    for conv, norm in zip(dec.convs, dec.norms):
        x = x.repeat(2, 1).repeat(2, 2)
        x = np_silu(np_rms(np_conv_same(x, conv), _np(norm.scale)))
    x = np_conv_same(x.repeat(2, 1).repeat(2, 2), dec.out)
    return np_sigmoid(x)


def _perturb(module):
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("scale") or name.endswith("bias"):
                p.normal_(1.0 if name.endswith("scale") else 0.0, 0.3)


def test_image_encoder_and_decoder_against_the_authors_simple_ones():
    from lucid.nature_nets import ImageDecoder, ImageEncoder
    torch.manual_seed(0)
    enc = ImageEncoder((8, 12), channels=3, depth=2, mults=(1, 2), kernel=3)
    _perturb(enc)
    img = torch.randint(0, 256, (2, 8, 12, 3), dtype=torch.uint8)
    assert enc.out_dim == 2 * 3 * 4
    np.testing.assert_allclose(_np(enc(img)), np_encoder(enc, img.numpy()), rtol=1e-4,
                               atol=1e-5)
    dec = ImageDecoder(deter=16, stoch_dim=6, size=(8, 12), channels=3, depth=2, units=5,
                       mults=(1, 2), kernel=3, bspace=2)
    _perturb(dec)
    h, z = torch.randn(2, 16), torch.randn(2, 6)
    out = dec(h, z)
    assert out.shape == (2, 8, 12, 3)
    np.testing.assert_allclose(_np(out), np_decoder(dec, _np(h), _np(z)), rtol=1e-4, atol=1e-5)


def test_image_encoder_and_decoder_parameter_counts_of_size12m():
    """size12m on 64x64x3 images: depth 16 (stages 32, 48, 64, 64), units 256, deter 2048,
    32 x 16 latents, 8 decoder groups; counted from the shapes the authors' code makes
    (HWIO kernels with biases, an RMS scale per norm)."""
    from lucid.nature_nets import ImageDecoder, ImageEncoder
    depths, k, ch = [32, 48, 64, 64], 5, 3
    enc_want = sum(k * k * i * o + o + o for i, o in zip([ch] + depths[:-1], depths))
    cells = 4 * 4 * 64
    dec_want = (2048 * cells // 8 + cells  # sp0: block kernel (8, 256, 128) and bias
                + (512 + 1) * 512 + 512  # sp1 (2 · units) with its norm
                + (512 + 1) * cells + 64  # sp2, spnorm
                + sum(k * k * i * o + o + o for i, o in zip([64, 64, 48], [64, 48, 32]))
                + k * k * 32 * ch + ch)  # imgout
    enc = ImageEncoder((64, 64), ch, 16)
    dec = ImageDecoder(2048, 512, (64, 64), ch, 16, 256)
    assert sum(p.numel() for p in enc.parameters()) == enc_want
    assert sum(p.numel() for p in dec.parameters()) == dec_want
