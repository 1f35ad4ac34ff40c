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
        parts = self.gates(x).reshape(*lead, g, 3, self.deter // g)
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
