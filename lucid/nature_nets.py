"""Layers of the Nature (2025) recipe, as the authors' current code builds them
(danijar/dreamerv3: embodied/jax/nets.py and dreamerv3/rssm.py):

* `RMSNorm`: x / sqrt(mean(x²) + 1e-4) · scale, over the last axis, in fp32; scale only.
* `Linear`: a bias (zeros), weights from a normal truncated at ±2 and scaled by
  1.1368 / sqrt(fan_in) (unit variance after truncation) times an output scale (0: zeros).
* `BlockLinear`: `blocks` independent linear maps of equal slices of the input to equal
  slices of the output (a block-diagonal weight); fan_in is the whole input's size.
* `BlockGRU`: the RSSM's deterministic step (`RSSM._core`): separate Linear+RMSNorm+SiLU
  projections of h, z and the action (scaled to |a| <= 1), each group of h with all three,
  a block-diagonal hidden layer, and block-diagonal GRU gates without a norm:
      r = σ(r), c = tanh(r · c), u = σ(u - 1), h' = u · c + (1 - u) · h.
* `SymexpTwoHot`: rewards and values as two-hot distributions over 255 bins placed at
  symexp of points evenly spaced in [-20, 20]: targets and means in real space.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .nets import fp32

TRUNC_STD = 1.1368  # a standard normal truncated at ±2 has std 0.8796 = 1 / 1.1368


def trunc_normal_fan_in_(weight: torch.Tensor, fan_in: int, scale: float = 1.0) -> None:
    """The authors' `trunc_normal_in` initializer: N(0, 1) truncated at ±2, times
    1.1368 · sqrt(1 / fan_in) · scale."""
    with torch.no_grad():
        nn.init.trunc_normal_(weight, 0.0, 1.0, -2.0, 2.0)
        weight.mul_(TRUNC_STD * math.sqrt(1.0 / fan_in) * scale)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · scale over the last axis, computed in fp32 (bf16 autocast
    leaves it fp32, as lucid's LayerNorm)."""

    def __init__(self, dim: int, eps: float = 1e-4):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = fp32(x)
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.scale


class Linear(nn.Linear):
    """nn.Linear with the authors' init: truncated-normal fan-in weights times `outscale`
    (zeros where it is 0), zero bias."""

    def __init__(self, in_dim: int, out_dim: int, outscale: float = 1.0):
        super().__init__(in_dim, out_dim)
        if outscale:
            trunc_normal_fan_in_(self.weight, in_dim, outscale)
        else:
            nn.init.zeros_(self.weight)
        nn.init.zeros_(self.bias)


class BlockLinear(nn.Module):
    """`blocks` linear maps, slice k of the input (in/blocks) to slice k of the output
    (out/blocks): weight (blocks, in/blocks, out/blocks), bias (out,)."""

    def __init__(self, in_dim: int, out_dim: int, blocks: int, outscale: float = 1.0):
        super().__init__()
        if in_dim % blocks or out_dim % blocks:
            raise ValueError(f"BlockLinear: {in_dim} inputs and {out_dim} outputs must both "
                             f"divide into {blocks} blocks")
        self.blocks = blocks
        self.weight = nn.Parameter(torch.empty(blocks, in_dim // blocks, out_dim // blocks))
        self.bias = nn.Parameter(torch.zeros(out_dim))
        trunc_normal_fan_in_(self.weight, in_dim, outscale)  # fan_in: the whole input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x = x.reshape(-1, self.blocks, x.shape[-1] // self.blocks).transpose(0, 1)
        y = torch.bmm(x, self.weight.to(x.dtype))  # (blocks, rows, out/blocks)
        return y.transpose(0, 1).reshape(*lead, -1) + self.bias.to(y.dtype)


def dense(in_dim: int, units: int) -> nn.Sequential:
    """Linear -> RMSNorm -> SiLU, the authors' hidden layer."""
    return nn.Sequential(Linear(in_dim, units), RMSNorm(units), nn.SiLU())


class BlockGRU(nn.Module):
    """The RSSM's deterministic step h' = f(h, z, a) of the Nature recipe (`RSSM._core`),
    with h of `deter` units in `blocks` groups, z flattened (`stoch_dim` = stoch · classes)
    and `hidden` units per input projection; `layers` block-diagonal hidden layers."""

    def __init__(self, deter: int, stoch_dim: int, act_dim: int, hidden: int,
                 blocks: int = 8, layers: int = 1):
        super().__init__()
        if deter % blocks:
            raise ValueError(f"BlockGRU: deter={deter} must divide into {blocks} blocks")
        self.deter, self.blocks = deter, blocks
        self.dynin = nn.ModuleList([dense(deter, hidden), dense(stoch_dim, hidden),
                                    dense(act_dim, hidden)])
        width = blocks * (deter // blocks + 3 * hidden)  # each group: its h, all projections
        self.hidden = nn.ModuleList()
        for i in range(layers):
            self.hidden.append(nn.ModuleList([BlockLinear(width if i == 0 else deter, deter,
                                                          blocks), RMSNorm(deter)]))
        self.gates = BlockLinear(deter if layers else width, 3 * deter, blocks)

    def forward(self, h: torch.Tensor, z: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        g = self.blocks
        action = action / torch.clamp(action.abs(), min=1.0).detach()
        lead = h.shape[:-1]
        z = z.reshape(*lead, -1)  # (..., stoch, classes) -> (..., stoch · classes)
        x = torch.cat([m(v) for m, v in zip(self.dynin, (h, z, action))], -1)
        x = torch.cat([fp32(h).reshape(*lead, g, -1),
                       x.unsqueeze(-2).expand(*lead, g, x.shape[-1])], -1).reshape(*lead, -1)
        for linear, norm in self.hidden:
            x = F.silu(norm(linear(x)))
        parts = fp32(self.gates(x)).reshape(*lead, g, 3, self.deter // g)  # h stays fp32
        reset, cand, update = (parts[..., i, :].reshape(*lead, self.deter) for i in range(3))
        reset = torch.sigmoid(reset)
        cand = torch.tanh(reset * cand)
        update = torch.sigmoid(update - 1.0)
        return update * cand + (1.0 - update) * h


class SymexpTwoHot:
    """The Nature recipe's reward and value distribution (the authors' `symexp_twohot` head
    and `outs.TwoHot`): `num_bins` bins at symexp of points evenly spaced in [-20, 20]
    (mirrored, with an exact 0 in the middle for an odd count), so the bins themselves are
    in real space: targets are interpolated between their two nearest bins and the mean is
    sum_i p_i bin_i there, with no symlog or symexp around them (2023's `TwoHot` works in
    symlog space)."""

    def __init__(self, num_bins: int = 255, limit: float = 20.0):
        if num_bins < 2:
            raise ValueError(f"two-hot needs at least 2 bins, got num_bins={num_bins}")
        self.num_bins, self.limit = num_bins, float(limit)
        self._bins: dict[tuple, torch.Tensor] = {}

    def bins(self, like: torch.Tensor) -> torch.Tensor:
        key = (like.device, like.dtype)
        if key not in self._bins:
            n = self.num_bins
            half = torch.linspace(-self.limit, 0.0, (n - 1) // 2 + 1 if n % 2 else n // 2,
                                  dtype=torch.float64)
            half = torch.sign(half) * torch.expm1(half.abs())  # symexp
            rest = half[:-1] if n % 2 else half
            self._bins[key] = torch.cat([half, -rest.flip(0)]).to(like.device, like.dtype)
        return self._bins[key]

    def mean(self, logits: torch.Tensor) -> torch.Tensor:
        """sum_i softmax(logits)_i bin_i, mirrored bins taken pairwise so that equal logits
        give exactly 0 (as the authors' symmetric sum)."""
        probs = torch.softmax(fp32(logits), -1)
        bins, n = self.bins(probs), self.num_bins
        m = n // 2
        hi = m + 1 if n % 2 else m  # bins[hi:] are the positive bins, mirrored by [:m]
        return (probs[..., hi:] - probs[..., :m].flip(-1)) @ bins[hi:]

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the two-hot encoding of `target` (real space) over the bins:
        the nearest bins below and above share the weight by distance; beyond the edge bins,
        or on a bin, all of it goes to that bin."""
        logits = fp32(logits)
        target = fp32(target).detach()
        bins, n = self.bins(logits), self.num_bins
        below = ((bins <= target[..., None]).sum(-1) - 1).clamp(0, n - 1)
        above = (n - (bins > target[..., None]).sum(-1)).clamp(0, n - 1)
        equal = below == above
        d_below = torch.where(equal, 1.0, (bins[below] - target).abs())
        d_above = torch.where(equal, 1.0, (bins[above] - target).abs())
        total = d_below + d_above
        logp = torch.log_softmax(logits, -1)
        picked_below = logp.gather(-1, below[..., None]).squeeze(-1)
        picked_above = logp.gather(-1, above[..., None]).squeeze(-1)
        return -(d_above / total * picked_below + d_below / total * picked_above)


# --------------------------------------------------------------------------- encoder, decoder

def mlp(in_dim: int, units: int, layers: int) -> nn.Sequential:
    """`layers` x (Linear -> RMSNorm -> SiLU)."""
    return nn.Sequential(*[dense(in_dim if i == 0 else units, units) for i in range(layers)])


class Conv(nn.Conv2d):
    """A stride-1 'same' convolution with the authors' init (fan_in = in · kernel²)."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int = 5, outscale: float = 1.0):
        super().__init__(in_ch, out_ch, kernel, padding=kernel // 2)
        if outscale:
            trunc_normal_fan_in_(self.weight, in_ch * kernel * kernel, outscale)
        else:
            nn.init.zeros_(self.weight)
        nn.init.zeros_(self.bias)


def _channel_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm over the channels of an NCHW map (the authors normalize NHWC's last axis)."""
    return norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ImageEncoder(nn.Module):
    """The authors' "simple" image encoder: pixels / 255 - 0.5, then per stage a kernel-5
    stride-1 convolution, 2x2 max-pooling, RMSNorm over channels and SiLU; depths
    `depth` x (2, 3, 4, 4); the last map (H/16 x W/16) flattened in (h, w, c) order."""

    def __init__(self, size: tuple[int, int], channels: int, depth: int,
                 mults: tuple[int, ...] = (2, 3, 4, 4), kernel: int = 5):
        super().__init__()
        stride = 2 ** len(mults)
        if size[0] % stride or size[1] % stride:
            raise ValueError(f"the Nature encoder halves {size[0]}x{size[1]} images "
                             f"{len(mults)} times: give sizes that divide by {stride}")
        depths = [depth * m for m in mults]
        self.convs = nn.ModuleList(Conv(c_in, c_out, kernel)
                                   for c_in, c_out in zip([channels] + depths[:-1], depths))
        self.norms = nn.ModuleList(RMSNorm(d) for d in depths)
        self.out_dim = (size[0] // stride) * (size[1] // stride) * depths[-1]

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        lead = img.shape[:-3]
        x = img.reshape(-1, *img.shape[-3:]).float() / 255.0 - 0.5
        x = x.permute(0, 3, 1, 2)  # NHWC -> NCHW
        for conv, norm in zip(self.convs, self.norms):
            x = F.max_pool2d(conv(x), 2)
            x = F.silu(_channel_norm(norm, x))
        return x.permute(0, 2, 3, 1).reshape(*lead, -1)


class ImageDecoder(nn.Module):
    """The authors' "simple" image decoder with `bspace` groups: a block-linear map of h and
    an MLP of z, added, give a (H/16, W/16, depth·4) map; then per stage nearest-neighbour
    2x upsampling, a kernel-5 convolution, RMSNorm and SiLU, and a last upsampled
    convolution to the image's channels, through a sigmoid: pixels in [0, 1]."""

    def __init__(self, deter: int, stoch_dim: int, size: tuple[int, int], channels: int,
                 depth: int, units: int, mults: tuple[int, ...] = (2, 3, 4, 4),
                 kernel: int = 5, bspace: int = 8, outscale: float = 1.0):
        super().__init__()
        stride = 2 ** len(mults)
        depths = [depth * m for m in mults]
        self.res = (size[0] // stride, size[1] // stride)
        self.bspace, self.top = bspace, depths[-1]
        if self.top % bspace:
            raise ValueError(f"the Nature decoder splits {self.top} channels into {bspace} "
                             f"groups: give a depth whose last stage divides by {bspace}")
        cells = self.res[0] * self.res[1] * self.top
        self.sp0 = BlockLinear(deter, cells, bspace)
        self.sp1 = dense(stoch_dim, 2 * units)
        self.sp2 = Linear(2 * units, cells)
        self.spnorm = RMSNorm(self.top)
        ins = depths[::-1]  # channels into each stage: depths[-1], then on down
        self.convs = nn.ModuleList(Conv(c_in, c_out, kernel)
                                   for c_in, c_out in zip(ins[:-1], ins[1:]))
        self.norms = nn.ModuleList(RMSNorm(c) for c in ins[1:])
        self.out = Conv(depths[0], channels, kernel, outscale)

    def forward(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Mean pixels (..., H, W, C) in [0, 1] from h (..., deter) and z (..., stoch_dim)."""
        lead = h.shape[:-1]
        hh, ww = self.res
        g, c = self.bspace, self.top // self.bspace
        x0 = self.sp0(h.reshape(-1, h.shape[-1]))  # (g h w c) -> h w (g c), as theirs
        x0 = x0.reshape(-1, g, hh, ww, c).permute(0, 2, 3, 1, 4).reshape(-1, hh, ww, self.top)
        x1 = self.sp2(self.sp1(z.reshape(-1, z.shape[-1]))).reshape(-1, hh, ww, self.top)
        x = F.silu(self.spnorm(x0 + x1)).permute(0, 3, 1, 2)  # NCHW
        for conv, norm in zip(self.convs, self.norms):
            x = F.interpolate(x, scale_factor=2, mode="nearest")
            x = F.silu(_channel_norm(norm, conv(x)))
        x = torch.sigmoid(self.out(F.interpolate(x, scale_factor=2, mode="nearest")))
        return x.permute(0, 2, 3, 1).reshape(*lead, *x.shape[2:], x.shape[1])
