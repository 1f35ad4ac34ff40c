"""The Nature (2025) recipe's losses, as the authors' current code computes them
(danijar/dreamerv3, agent.py: `Agent.loss`, `imag_loss`, `repl_loss`; rssm.py: `RSSM.loss`),
batch-major: rows (N) of steps (T). Every loss is per step; the agent takes their means with
the scales dyn 1.0, rep 0.1, reconstruction, reward, continue, policy and value 1.0, and the
replay value 0.3.

* world model: dyn = max(1, KL[sg(post) || prior]), rep = max(1, KL[post || sg(prior)])
  over the 1%-unimix categoricals, summed over latents before the free nats; the reward's
  symexp two-hot loss; the continue head's binary cross-entropy toward the discount
  (1 - terminal)(1 - 1/horizon) (`contdisc`); images' squared error summed over pixels and
  channels (targets in [0, 1]); vectors' squared error to symlog(x) summed over dimensions.
* imagination (`contdisc`): weights w_t = prod_{i<=t} c_i of the continue probabilities, no
  separate γ; λ-returns with soft terminals 1 - c bootstrapped from the critic's values;
  advantages (R - v) / max(1, P95 - P5) of an EMA (rate 0.01) of the returns' percentiles;
  policy loss -w (log π(a) sg(adv) + 3e-4 H[π]); value loss w (CE(R) + CE(sg(v_slow))).
* replay: λ-returns of the replayed rewards with γ = 1 - 1/horizon, bootstrapped from the
  imagined return of each replayed state; loss (1 - last)(CE(R) + CE(sg(v_slow))).
"""

from __future__ import annotations

import torch
from torch import nn

from .behavior import percentiles, replay_lambda_return
from .nature_nets import SymexpTwoHot
from .nets import categorical_kl, fp32, symlog, unimix_logits


class PercentileNorm(nn.Module):
    """The authors' `Normalize('perc')` without debiasing: lo and hi follow the 5th and 95th
    percentiles of each batch by an EMA of rate 0.01; stats (lo, max(limit, hi - lo))."""

    def __init__(self, rate: float = 0.01, limit: float = 1.0, low: float = 5.0,
                 high: float = 95.0):
        super().__init__()
        self.rate, self.limit, self.q = rate, limit, (low / 100.0, high / 100.0)
        self.register_buffer("lo", torch.zeros(()))
        self.register_buffer("hi", torch.zeros(()))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        lo, hi = percentiles(x, self.q)
        # lerp_ by hand: under vmap (several seeds, lucid.batched) lerp_ has no batching rule
        self.lo.add_(lo.to(self.lo.dtype) - self.lo, alpha=self.rate)
        self.hi.add_(hi.to(self.hi.dtype) - self.hi, alpha=self.rate)

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lo.clone(), torch.clamp(self.hi - self.lo, min=self.limit)


def kl_losses(post_logits: torch.Tensor, prior_logits: torch.Tensor, unimix: float = 0.01,
              free_nats: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """dyn and rep (N, T) from logits (N, T, stoch, classes)."""
    post, prior = unimix_logits(post_logits, unimix), unimix_logits(prior_logits, unimix)
    dyn = categorical_kl(post.detach(), prior)
    rep = categorical_kl(post, prior.detach())
    return torch.clamp(dyn, min=free_nats), torch.clamp(rep, min=free_nats)


def continue_target(is_terminal: torch.Tensor, horizon: float = 333.0) -> torch.Tensor:
    """The continue head's target under `contdisc`: the discount of a step, 0 at terminals."""
    return (1.0 - is_terminal.float()) * (1.0 - 1.0 / horizon)


def continue_loss(logit: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of the continue logit toward a soft target."""
    return -(target * nn.functional.logsigmoid(logit)
             + (1.0 - target) * nn.functional.logsigmoid(-logit))


def image_loss(pred: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
    """Squared error of mean pixels (..., H, W, C) in [0, 1] to uint8 targets / 255, summed
    over pixels and channels."""
    pred = fp32(pred)
    return (pred - image.to(pred.dtype) / 255.0).square().sum((-3, -2, -1))


def vector_loss(pred: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Squared error to symlog(x), summed over the last axis."""
    pred = fp32(pred)
    return (pred - symlog(x.to(pred.dtype))).square().sum(-1)


def imagination_losses(twohot: SymexpTwoHot, rew: torch.Tensor, con: torch.Tensor,
                       logpi: torch.Tensor, ent: torch.Tensor, value_logits: torch.Tensor,
                       slow_logits: torch.Tensor, retnorm: PercentileNorm, lam: float = 0.95,
                       actent: float = 3e-4, slowreg: float = 1.0, update: bool = True,
                       gather=None):
    """Policy and value losses (N, H) of imagined rows of H+1 steps: rewards `rew` and
    continue probabilities `con` (N, H+1), log π of the actions taken and the policy's
    entropy (N, H+1), the critic's and the slow critic's logits (N, H+1, bins). Returns the
    two losses, the λ-returns (N, H) and the advantages (N, H). `gather` (data-parallel
    learners) joins every rank's returns for the percentiles."""
    val = twohot.mean(value_logits)
    slowval = twohot.mean(slow_logits)
    tarval = val  # slowtar: False
    weight = torch.cumprod(con, 1).detach()  # contdisc: disc = 1
    ret = replay_lambda_return(rew, torch.zeros_like(con), 1.0 - con, tarval, 1.0, lam)
    if update:
        retnorm.update(ret if gather is None else gather(ret.detach()))
    _, rscale = retnorm.stats()
    adv = (ret - tarval[:, :-1]) / rscale
    policy = weight[:, :-1] * -(logpi[:, :-1] * adv.detach() + actent * ent[:, :-1])
    target = torch.cat([ret, torch.zeros_like(ret[:, -1:])], 1).detach()
    value = weight[:, :-1] * (twohot.loss(value_logits, target)
                              + slowreg * twohot.loss(value_logits, slowval.detach()))[:, :-1]
    return policy, value, ret, adv


def replay_value_loss(twohot: SymexpTwoHot, last: torch.Tensor, term: torch.Tensor,
                      rew: torch.Tensor, boot: torch.Tensor, value_logits: torch.Tensor,
                      slow_logits: torch.Tensor, horizon: float = 333.0, lam: float = 0.95,
                      slowreg: float = 1.0):
    """The replay value loss (N, T-1) of replayed rows (N, T): `boot` the imagined λ-return
    from each replayed state. Returns the loss and the replayed λ-returns (N, T-1)."""
    slowval = twohot.mean(slow_logits)
    ret = replay_lambda_return(rew.to(boot.dtype), last, term, boot, 1.0 - 1.0 / horizon, lam)
    target = torch.cat([ret, torch.zeros_like(ret[:, -1:])], 1).detach()
    weight = 1.0 - last.float()
    loss = weight[:, :-1] * (twohot.loss(value_logits, target)
                             + slowreg * twohot.loss(value_logits, slowval.detach()))[:, :-1]
    return loss, ret
