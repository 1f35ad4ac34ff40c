"""Layers, transforms and distributions of DreamerV3 (Hafner et al. 2023, arXiv 2301.04104v1).

Each concept has exactly one definition here: symlog/symexp, two-hot over 255 bins,
unimix categoricals with straight-through samples, KL between factorised categoricals,
the LayerNorm+SiLU dense block, the normalized GRU, and the image encoder/decoder.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from .ops.onehot import OneHotCat, linear_in, one_hot
from .ops.padded import padded_linear
from .ops.twohot import twohot_nll

LN_EPS = 1e-3  # LayerNorm epsilon of the authors' code


# --------------------------------------------------------------------------- transforms


def symlog(x: torch.Tensor) -> torch.Tensor:
    """sign(x) * ln(|x| + 1)  (paper eq. 9)."""
    return torch.sign(x) * torch.log1p(torch.abs(x))


def symexp(x: torch.Tensor) -> torch.Tensor:
    """Inverse of symlog: sign(x) * (exp(|x|) - 1)."""
    return torch.sign(x) * torch.expm1(torch.abs(x))


# --------------------------------------------------------------------------- two-hot


def fp32(x: torch.Tensor) -> torch.Tensor:
    """Half-precision tensors (bf16/fp16 under autocast) to fp32; fp32 and fp64 pass as they
    are. Distributions, norms and losses run on what this returns."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def autocast(precision: str | None, device: torch.device):
    """The context of an update's forward passes: torch.autocast(bf16) for
    `train.precision=bf16`, else none (fp32)."""
    if precision == "bf16":
        # The cache of weight casts lives within one region (cleared on exit), so under
        # train.cuda_graph the casts are captured once per region, as in eager; without it
        # each RSSM step cast its weights anew and kept the copy for backward, several times
        # the memory of an eager update.
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class TwoHot:
    """Two-hot encoding over `num_bins` bins uniform in [low, high] of symlog space.

    `encode(y)` maps a real-valued symlog target to a (..., num_bins) vector with weight on
    the two nearest bins (linear interpolation); targets outside the range go to the edge bin.
    Logits (..., W) may be wider than num_bins, W >= num_bins, where the extra columns are
    -inf (the padded heads, `Head.pad_to`): probabilities exactly 0, so the same distribution.
    """

    def __init__(self, num_bins: int = 255, low: float = -20.0, high: float = 20.0):
        if num_bins < 2:
            raise ValueError(f"two-hot needs at least 2 bins, got num_bins={num_bins}")
        self.num_bins, self.low, self.high = num_bins, float(low), float(high)
        self.step = (self.high - self.low) / (num_bins - 1)
        self._bins: dict[tuple, torch.Tensor] = {}

    def bins(self, like: torch.Tensor) -> torch.Tensor:
        key = (like.device, like.dtype)
        if key not in self._bins:
            if self.low == -self.high and self.num_bins % 2:
                # Exactly symmetric bins with an exact 0 in the middle.
                half = torch.linspace(0.0, self.high, self.num_bins // 2 + 1, dtype=torch.float64)
                bins = torch.cat([-half.flip(0)[:-1], half])
            else:
                bins = torch.linspace(self.low, self.high, self.num_bins, dtype=torch.float64)
            self._bins[key] = bins.to(device=like.device, dtype=like.dtype)
        return self._bins[key]

    def _locate(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Index of the bin below y (clamped to the range) and the weight of the bin above."""
        y = y.clamp(self.low, self.high)
        pos = (y - self.low) / self.step
        below = pos.floor().nan_to_num(0.0).clamp(0, self.num_bins - 2)  # NaN stays in the weights
        return below.long(), (pos - below).clamp(0.0, 1.0)

    def encode(self, y: torch.Tensor) -> torch.Tensor:
        below, w_above = self._locate(y)
        out = torch.zeros(*y.shape, self.num_bins, device=y.device, dtype=y.dtype)
        out.scatter_(-1, below.unsqueeze(-1), (1.0 - w_above).unsqueeze(-1))
        out.scatter_add_(-1, (below + 1).unsqueeze(-1), w_above.unsqueeze(-1))
        return out

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """softmax over the bins, in fp32 whatever the logits' dtype (bf16 autocast). One
        softmax serves the mean and the losses of the same logits (`mean_of`, `losses`)."""
        self._check_width(logits)
        return torch.softmax(fp32(logits), -1)

    def _check_width(self, logits: torch.Tensor) -> None:
        if logits.shape[-1] < self.num_bins:
            raise ValueError(f"two-hot logits have {logits.shape[-1]} columns, fewer than the "
                             f"{self.num_bins} bins: the head's out_dim must be num_bins")

    def mean(self, logits: torch.Tensor) -> torch.Tensor:
        """Expected value in real space: symexp(sum_i softmax(logits)_i * bin_i)."""
        return self.mean_of(self.probs(logits))

    def probs_and_mean(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`probs(logits)` and `mean(logits)` from one softmax (the critic's values and the
        probabilities its loss reuses)."""
        probs = self.probs(logits)
        return probs, self.mean_of(probs)

    def mean_of(self, probs: torch.Tensor) -> torch.Tensor:
        """`mean` from the bins' probabilities. Mirrored bins are taken pairwise, sum_j bin_j
        (p_j - p_-j) over the positive bins, so equal logits give exactly 0 (as in the
        authors' code)."""
        bins, n = self.bins(probs), self.num_bins
        m = n // 2
        # fp32 under bf16 autocast too, which would run this product, bins included, in bf16
        with torch.autocast(probs.device.type, enabled=False):
            if n % 2 and self.low == -self.high:  # bins[m] = 0: it adds nothing
                avg = (probs[..., m + 1:n] - probs[..., :m].flip(-1)) @ bins[m + 1:]
            else:
                avg = probs[..., :n] @ bins
        return symexp(avg)

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the two-hot encoding of symlog(target) (target in real space):
        -(1 - w) log p[below] - w log p[below + 1], gathered instead of a dense target."""
        return self.losses(logits, target)[0]

    def losses(self, logits: torch.Tensor, *targets: torch.Tensor,
               probs: torch.Tensor | None = None) -> list[torch.Tensor]:
        """`loss(logits, target)` for each of several targets of the same logits, with one
        softmax and one gradient pass over the bins for all of them (`ops.twohot`); `probs`:
        `self.probs(logits)` if already computed (the critic's, for its values)."""
        located = [self._locate(symlog(fp32(t))) for t in targets]
        below = torch.stack([b for b, _ in located])
        w_above = torch.stack([w for _, w in located])
        logits = fp32(logits)
        with torch.no_grad():
            probs = self.probs(logits) if probs is None else probs.detach()
            # log-sum-exp from the largest probability (>= 1/bins, so its log is exact to
            # rounding): logsumexp = max logit - log(max prob), no second pass of exp.
            lse = logits.amax(-1, keepdim=True) - probs.amax(-1, keepdim=True).log()
        return list(twohot_nll(logits, probs, lse, below, w_above).unbind(0))


# --------------------------------------------------------------------------- categoricals


def unimix_probs(logits: torch.Tensor, unimix: float) -> torch.Tensor:
    """(1 - unimix) * softmax(logits) + unimix / K over the last axis, in fp32 whatever the
    logits' dtype (bf16 autocast): every categorical starts here."""
    probs = torch.softmax(fp32(logits), -1)
    if unimix <= 0.0:
        return probs
    return probs.mul(1.0 - unimix).add_(unimix / logits.shape[-1])  # add_: a fresh tensor


def unimix_logits(logits: torch.Tensor, unimix: float) -> torch.Tensor:
    """log `unimix_probs(logits, unimix)`: the log-probabilities the losses use."""
    if unimix <= 0.0:
        return torch.log_softmax(fp32(logits), -1)
    return torch.log(unimix_probs(logits, unimix))


def categorical_index(probs: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
    """Class index sampled from Categorical(probs) over the last axis, by inverse CDF: the
    first class whose cumulative probability reaches u ~ U(0, 1), i.e. the number of classes
    whose cumulative probability is below u (a count per row). `u` (..., 1) may be
    drawn beforehand (`WorldModel.latent_noise`): compiled steps take their random numbers as
    inputs."""
    probs = probs.detach()
    if u is None:
        u = torch.rand(*probs.shape[:-1], 1, device=probs.device, dtype=probs.dtype)
    else:
        u = u.to(probs.dtype).contiguous()
    # a count, not searchsorted: the same index, and one op that vmap batches (seeds)
    idx = (probs.cumsum(-1) < u).sum(-1)
    return idx.clamp(max=probs.shape[-1] - 1)  # u above a total that rounded below 1


def unimix_index(logits: torch.Tensor, unimix: float, u: torch.Tensor) -> torch.Tensor:
    """`categorical_index(unimix_probs(logits, unimix), u)` without gradient (the imagined
    latents)."""
    return categorical_index(unimix_probs(logits, unimix), u)


def onehot_sample(logp: torch.Tensor, straight_through: bool = True,
                  u: torch.Tensor | None = None) -> torch.Tensor:
    """One-hot sample of Categorical(exp(logp)) over the last axis (uniforms `u` as in
    `categorical_index`).

    With `straight_through`, the gradient of the sample is the gradient of the probabilities
    (sample + p - sg(p)), as in DreamerV2's algorithm 1.
    """
    probs = logp.exp()
    idx = categorical_index(probs, u)
    sample = one_hot(idx, probs.shape[-1], probs.dtype)
    # Exact one-hots where no gradient is recorded. Grad mode, not probs.requires_grad: under
    # torch.func.vmap (several seeds in one update) a tensor reports no requires_grad.
    if straight_through and torch.is_grad_enabled():
        sample = sample + probs - probs.detach()
    return sample


def onehot_mode(logp: torch.Tensor) -> torch.Tensor:
    return one_hot(logp.argmax(-1), logp.shape[-1], logp.dtype)


def categorical_kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) of independent categoricals (..., groups, classes), summed over groups."""
    return (logp.exp() * (logp - logq)).sum((-2, -1))


def categorical_entropy(logp: torch.Tensor) -> torch.Tensor:
    return -(logp.exp() * logp).sum(-1)


def dense_for(module: nn.Module, x: torch.Tensor | OneHotCat) -> torch.Tensor | OneHotCat:
    """`x` as `module` takes it: lucid's MLP and Head take a `OneHotCat` as it is (they
    gather); any other module (a network of a subclassed Agent) gets the plain features."""
    return x.to_dense() if isinstance(x, OneHotCat) and not isinstance(module, (MLP, Head)) else x


# --------------------------------------------------------------------------- initialization


def init_trunc_normal_(weight: torch.Tensor, fan_in: int, fan_out: int, scale: float = 1.0):
    """Variance-scaling init with fan_avg and a truncated normal, as in the authors' code."""
    std = math.sqrt(scale / ((fan_in + fan_out) / 2.0)) / 0.87962566103423978
    nn.init.trunc_normal_(weight, 0.0, std, -2.0 * std, 2.0 * std)


def linear(in_dim: int, out_dim: int, bias: bool = True, zero: bool = False) -> nn.Linear:
    layer = nn.Linear(in_dim, out_dim, bias=bias)
    if zero:
        nn.init.zeros_(layer.weight)
    else:
        init_trunc_normal_(layer.weight, in_dim, out_dim)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


# --------------------------------------------------------------------------- dense blocks


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (same parameters and state_dict keys) that always normalizes in fp32: with
    `train.precision=bf16` the matmuls before it run in bf16 under autocast, and the norm
    (and what follows it up to the next matmul: activations, GRU gates) stays fp32. A no-op
    cast in fp32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(fp32(x))


class MLP(nn.Module):
    """`layers` x (Linear without bias -> LayerNorm -> SiLU)."""

    def __init__(self, in_dim: int, units: int, layers: int):
        super().__init__()
        mods: list[nn.Module] = []
        for i in range(layers):
            mods += [linear(in_dim if i == 0 else units, units, bias=False),
                     LayerNorm(units, eps=LN_EPS), nn.SiLU()]
        self.net = nn.Sequential(*mods)
        self.out_dim = units if layers else in_dim

    def forward(self, x: torch.Tensor | OneHotCat) -> torch.Tensor:
        if isinstance(x, OneHotCat):
            if not len(self.net):
                return x.to_dense()
            return self.net[1:](linear_in(self.net[0], x))
        return self.net(x)


class Head(nn.Module):
    """MLP followed by an output layer (with bias); `zero` zero-initializes the output.

    `pad_to` (the agent sets it for the 255-bin heads, `train.pad_bins`): logits for a
    softmax come back padded to a multiple of `pad_to` columns, the extra ones -inf, i.e.
    probability exactly 0 (`TwoHot` reads logits of any width >= num_bins this way): the same
    distribution, computed faster (`ops.padded`)."""

    pad_to = 0

    def __init__(self, in_dim: int, units: int, layers: int, out_dim: int, zero: bool = False):
        super().__init__()
        self.mlp = MLP(in_dim, units, layers)
        self.out = linear(self.mlp.out_dim, out_dim, zero=zero)

    def forward(self, x: torch.Tensor | OneHotCat) -> torch.Tensor:
        h = self.mlp(x)
        extra = -self.out.out_features % self.pad_to if self.pad_to else 0
        if not extra:
            return self.out(h)
        return padded_linear(h, self.out.weight, self.out.bias, extra)


class NormGRUCell(nn.Module):
    """GRU of DreamerV3: one bias-free Linear over [x, h] to the three gates' pre-activations,
    LayerNorm over them, reset = σ(r), candidate = tanh(reset · c), update = σ(u − 1)."""

    def __init__(self, in_dim: int, units: int):
        super().__init__()
        self.units = units
        self.linear = linear(in_dim + units, 3 * units, bias=False)
        self.norm = LayerNorm(3 * units, eps=LN_EPS)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        parts = self.norm(self.linear(torch.cat([x, h], -1)))
        reset, cand, update = parts.split(self.units, -1)
        reset = torch.sigmoid(reset)
        cand = torch.tanh(reset * cand)
        update = torch.sigmoid(update - 1.0)
        return update * cand + (1.0 - update) * h


# --------------------------------------------------------------------------- images


class ChannelNorm(nn.Module):
    """LayerNorm over the channel axis of an NCHW tensor."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = LayerNorm(channels, eps=LN_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _init_conv(conv: nn.Module, zero_bias: bool = True):
    k = conv.kernel_size[0] * conv.kernel_size[1]
    init_trunc_normal_(conv.weight, k * conv.in_channels, k * conv.out_channels)
    if conv.bias is not None and zero_bias:
        nn.init.zeros_(conv.bias)


IMAGE_MINRES = 4  # the authors' `minres`: the encoder halves the image until about this size


def image_sizes(height: int, width: int, minres: int = IMAGE_MINRES) -> list[tuple[int, int]]:
    """(H, W) at the input of each stride-2 stage of the image encoder, then its output map.

    The number of stages is floor(log2(min(H, W) / minres)), the authors' rule (their 2023
    `ImageEncoderResnet`, with `int()` truncating, counts from one side; the shorter one here,
    so a non-square image keeps both sides at least `minres`); each stage takes a side n to
    ceil(n / 2), a "same"-padded convolution as theirs. The shorter side of the output map is
    then between `minres` and 2·minres: 64 -> 4, 84 -> 6 (84, 42, 21, 11, 6), 96 -> 6,
    32 -> 4 in 3 stages, 16 -> 4 in 2."""
    short = min(height, width)
    if short < 2 * minres:
        raise ValueError(f"image sides must be at least {2 * minres} pixels, got "
                         f"{height}x{width}")
    stages = (short // minres).bit_length() - 1  # floor(log2(short / minres)), exactly
    sizes = [(height, width)]
    for _ in range(stages):
        h, w = sizes[-1]
        sizes.append((-(-h // 2), -(-w // 2)))
    return sizes


class _Crop(nn.Module):
    """Keeps the first (H, W) rows and columns: after a transposed convolution, drops the
    zero row (column) the encoder's "same" padding added after an odd side."""

    def __init__(self, size: tuple[int, int]):
        super().__init__()
        self.size = tuple(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., :self.size[0], :self.size[1]]

    def extra_repr(self) -> str:
        return f"size={self.size}"


class ImageEncoder(nn.Module):
    """Stride-2 4x4 convolutions (channels 1, 2, 4, ... x multiplier), each followed by
    LayerNorm + SiLU, until the shorter side is between 4 and 8 (`image_sizes`): four stages
    for 64x64 (channels 1, 2, 4, 8 x mult, a 4x4 map), three for 32x32, two for 16x16.

    Input: float images (N, C, H, W) in [-0.5, 0.5] (`image_input`); any H, W >= 8.
    Output: the flattened (N, mult·2^(S-1)·h·w) map of the last stage (S stages, h x w).
    """

    def __init__(self, in_channels: int, mult: int, height: int, width: int):
        super().__init__()
        self.sizes = image_sizes(height, width)
        layers: list[nn.Module] = []
        ch = in_channels
        for i, (h, w) in enumerate(self.sizes[:-1]):
            if h % 2 or w % 2:  # "same" padding puts the odd side's extra zero row after
                layers.append(nn.ZeroPad2d((0, w % 2, 0, h % 2)))
            out = mult * 2**i
            conv = nn.Conv2d(ch, out, 4, 2, padding=1, bias=False)
            _init_conv(conv)
            layers += [conv, ChannelNorm(out), nn.SiLU()]
            ch = out
        self.net = nn.Sequential(*layers)
        self.out_dim = ch * math.prod(self.sizes[-1])
        # Run the convolutions on NHWC memory (`train.channels_last`): the same values, and
        # ChannelNorm's permute to channels-last is then free instead of a copy.
        self.channels_last = False

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            img = img.contiguous(memory_format=torch.channels_last)
        return self.net(img).flatten(1)


class ImageDecoder(nn.Module):
    """Mirror of the encoder: Linear to its last map (mult·2^(S-1) channels, h x w), then S
    stride-2 transposed convolutions through the encoder's sizes in reverse (each cut to the
    size the encoder saw there, so odd sides come out exact); the output is the mean of a
    unit-variance Gaussian over pixels in [-0.5, 0.5]."""

    def __init__(self, in_dim: int, out_channels: int, mult: int, height: int, width: int):
        super().__init__()
        sizes = image_sizes(height, width)
        stages = len(sizes) - 1
        ch = mult * 2 ** (stages - 1)
        self.shape = (ch, *sizes[-1])
        self.linear = linear(in_dim, math.prod(self.shape))
        layers: list[nn.Module] = []
        for i in reversed(range(stages)):  # from the map of stage i + 1 to the input of i
            last = i == 0
            out = out_channels if last else ch // 2
            conv = nn.ConvTranspose2d(ch, out, 4, 2, padding=1, bias=last)
            _init_conv(conv)
            layers.append(conv)
            if sizes[i] != tuple(2 * n for n in sizes[i + 1]):  # an odd side there
                layers.append(_Crop(sizes[i]))
            if not last:
                layers += [ChannelNorm(out), nn.SiLU()]
            ch = out
        self.net = nn.Sequential(*layers)

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        x = self.linear(feat).reshape(-1, *self.shape)
        return self.net(x)
