"""Plan2Explore's intrinsic reward (Sekar et al., 2020): the disagreement of an ensemble of
one-step predictors about what the world model will see next.

Each of M members is an MLP from [h_t, z_t, a_t] to a target of the next step, trained by
squared error on replayed posterior states. Where the replay has covered a transition the
members agree; where it has not, they were initialised apart and nothing pulled them
together. The intrinsic reward of a step is their variance, averaged over the target's
dimensions:

    r_int(s_t, a_t) = mean_d Var_m[ f_m(s_t, a_t)_d ]

The target (`explore.target`) is the encoder's embedding of the next observation, as in the
Plan2Explore paper, or the next posterior latent z (flattened one-hots), as in the authors'
2023 DreamerV3 code (`disag_target: [stoch]`). The embedding is the default: it is a
deterministic function of the observation, where a small model's posterior can stay close
to uniform (its history h carries the state) and leave z a draw no member can predict
(docs/exploration.md). The variance is the paper's; the authors' 2023 code takes the
standard deviation.

The disagreement's size depends on the target's size and on how far training has gone, and
can sit orders of magnitude below the floor of 1 under which DreamerV3's return normalizer
leaves returns unscaled: the exploration actor's advantage would then be
smaller than its entropy bonus and it would act at random. So the reward is divided by a
running mean of itself (`RunningMean`, as DreamerV2's and Plan2Explore's code normalise
their intrinsic reward), which makes it about 1 per step for any target; the returns are then
normalised as the task's are. By default the mean is the batch's own (decay 0): the
disagreement changes tenfold within a few hundred updates, and a lagging mean turns that
into rewards far below or far above 1 (docs/exploration.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .nets import LN_EPS, fp32, init_trunc_normal_


class EnsembleLinear(nn.Module):
    """M independent linear layers applied as one batched matmul: x (M, N, in) or (N, in),
    the same rows for every member, to (M, N, out). Each member is initialised as
    `nets.linear` initialises one layer."""

    def __init__(self, members: int, in_dim: int, out_dim: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(members, in_dim, out_dim))
        init_trunc_normal_(self.weight, in_dim, out_dim)
        self.bias = nn.Parameter(torch.zeros(members, 1, out_dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.expand(self.weight.shape[0], *x.shape)
        if self.bias is None:
            return torch.bmm(x, self.weight.to(x.dtype))
        return torch.baddbmm(self.bias.to(x.dtype), x, self.weight.to(x.dtype))


class EnsembleNorm(nn.Module):
    """LayerNorm over the last axis with each member's own scale and shift (fp32)."""

    def __init__(self, members: int, units: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(members, 1, units))
        self.bias = nn.Parameter(torch.zeros(members, 1, units))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(fp32(x), x.shape[-1:], eps=LN_EPS)
        return x * self.weight + self.bias


class Disagreement(nn.Module):
    """The ensemble: M members of `layers` x (Linear -> LayerNorm -> SiLU) and an output layer,
    from inputs of `in_dim` to targets of `out_dim`."""

    def __init__(self, in_dim: int, out_dim: int, members: int = 8, layers: int = 5,
                 units: int = 1024):
        super().__init__()
        if members < 2:
            raise ValueError(f"an ensemble's disagreement needs at least 2 members, not "
                             f"{members}")
        mods: list[nn.Module] = []
        for i in range(layers):
            mods += [EnsembleLinear(members, in_dim if i == 0 else units, units, bias=False),
                     EnsembleNorm(members, units), nn.SiLU()]
        mods.append(EnsembleLinear(members, units if layers else in_dim, out_dim))
        self.net = nn.Sequential(*mods)
        self.members = members

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Each member's prediction: x (..., in) -> (M, ..., out), fp32."""
        lead = x.shape[:-1]
        out = fp32(self.net(x.reshape(-1, x.shape[-1])))
        return out.reshape(self.members, *lead, out.shape[-1])

    def loss(self, x: torch.Tensor, target: torch.Tensor,
             mask: torch.Tensor | None = None) -> torch.Tensor:
        """Squared error of every member toward `target` (..., out), summed over the target's
        dimensions and the members, averaged over the rows (those where `mask` is 1)."""
        pred = self(x)
        err = (pred - target.detach().to(pred.dtype)).square().sum(-1).sum(0)
        if mask is None:
            return err.mean()
        mask = mask.float()
        return (err * mask).sum() / mask.sum().clamp(min=1.0)

    def disagreement(self, x: torch.Tensor) -> torch.Tensor:
        """The intrinsic reward of each row: the members' variance (population) averaged over
        the target's dimensions, (..., in) -> (...)."""
        return self(x).var(0, unbiased=False).mean(-1)


class RunningMean(nn.Module):
    """An EMA of the mean of the batches given to `update` (the first batch sets it); a
    non-finite batch leaves it as is. `normalize(x)` divides by it."""

    def __init__(self, decay: float = 0.99):
        super().__init__()
        self.decay = decay
        self.register_buffer("value", torch.full((), -1.0))  # negative: not set yet

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        m = x.detach().float().mean()
        new = torch.where(self.value < 0, m, self.decay * self.value + (1 - self.decay) * m)
        self.value.copy_(torch.where(torch.isfinite(m), new, self.value))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.value.clamp(min=1e-12).to(x.dtype)
