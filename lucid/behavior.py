"""Actor, critic, λ-returns and return normalisation (paper eqs. 6-12)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from .config import ModelConfig, TrainConfig
from .envs.spaces import ActionSpec
from .nets import (Head, TwoHot, categorical_entropy, fp32, onehot_mode, onehot_sample,
                   unimix_logits)


def lambda_return(reward: torch.Tensor, cont: torch.Tensor, value: torch.Tensor,
                  gamma: float, lam: float) -> torch.Tensor:
    """λ-returns of imagined steps 0..H-1 from time-major (H+1, N) real-space predictions:

        R_H = V_H,  R_t = r_{t+1} + γ c_{t+1} ((1 - λ) V_{t+1} + λ R_{t+1}).
    """
    disc = gamma * cont[1:]
    inter = reward[1:] + disc * (1.0 - lam) * value[1:]
    out = [value[-1]]
    for t in reversed(range(disc.shape[0])):
        out.append(inter[t] + disc[t] * lam * out[-1])
    return torch.stack(out[::-1][:-1])


def replay_lambda_return(reward: torch.Tensor, last: torch.Tensor, terminal: torch.Tensor,
                         boot: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """λ-returns along replayed (B, T) windows for the replay value loss of the Nature (2025)
    recipe: real rewards, bootstrapped from `boot`, the imagined λ-return from each replayed
    step. Returns (B, T-1) for steps 0..T-2:

        R_{T-1} = boot_{T-1},
        R_t = r_{t+1} + γ (1 - term_{t+1}) ((1 - λ'_{t+1}) boot_{t+1} + λ' R_{t+1}),
        λ'_{t+1} = λ (1 - last_{t+1}),

    so the step that ends an episode is bootstrapped whole (from nothing if it is terminal).
    R_t at a step t that ends an episode would mix two episodes: the loss weights it 0."""
    live = gamma * (1.0 - terminal[:, 1:].to(reward.dtype))
    cont = lam * (1.0 - last[:, 1:].to(reward.dtype))
    inter = reward[:, 1:] + live * (1.0 - cont) * boot[:, 1:]
    out = [boot[:, -1]]
    for t in reversed(range(live.shape[1])):
        out.append(inter[:, t] + live[:, t] * cont[:, t] * out[-1])
    return torch.stack(out[::-1][:-1], 1)


def imagined_weights(cont: torch.Tensor, gamma: float) -> torch.Tensor:
    """Loss weights of imagined steps: the discounted cumulative product of predicted
    continues, w_t = prod_{i<=t} (γ c_i) / γ, so w_0 = c_0 (0 if the start was terminal)."""
    return torch.cumprod(gamma * cont, 0) / gamma


class ReturnNorm(nn.Module):
    """EMA of the low/high percentiles of λ-returns; scale S = max(min_scale, high - low)."""

    def __init__(self, decay: float = 0.99, low: float = 5.0, high: float = 95.0,
                 min_scale: float = 1.0):
        super().__init__()
        self.decay, self.min_scale = decay, min_scale
        self.register_buffer("q", torch.tensor([low / 100.0, high / 100.0]))
        self.register_buffer("low", torch.zeros(()))
        self.register_buffer("high", torch.zeros(()))

    @torch.no_grad()
    def update(self, returns: torch.Tensor) -> None:
        lo, hi = torch.quantile(returns.detach().flatten().float(), self.q.to(returns.device))
        ok = torch.isfinite(lo) & torch.isfinite(hi)  # a non-finite batch leaves the EMA as is
        self.low.copy_(torch.where(ok, self.decay * self.low + (1 - self.decay) * lo, self.low))
        self.high.copy_(torch.where(ok, self.decay * self.high + (1 - self.decay) * hi, self.high))

    def scale(self) -> torch.Tensor:
        return torch.clamp(self.high - self.low, min=self.min_scale)


def _normal(mean: torch.Tensor, std: torch.Tensor) -> torch.distributions.Normal:
    # No argument validation: it reads values back to the host (std > 0 holds by construction).
    return torch.distributions.Normal(mean, std, validate_args=False)


class Actor(nn.Module):
    """π(a | s): factorised unimix categoricals for (Multi)Discrete actions, a Normal with
    tanh mean and std in [min_std, max_std] for Box actions (model space [-1, 1])."""

    def __init__(self, feat_dim: int, spec: ActionSpec, mcfg: ModelConfig):
        super().__init__()
        dims = mcfg.dims()
        self.spec = spec
        self.unimix = mcfg.unimix
        self.min_std, self.max_std = mcfg.actor_min_std, mcfg.actor_max_std
        out = spec.dim if spec.is_discrete else 2 * spec.dim
        self.head = Head(feat_dim, dims["dense_units"], dims["dense_layers"], out)

    def params(self, feat: torch.Tensor):
        x = fp32(self.head(feat))  # distribution parameters in fp32 (bf16 autocast)
        if self.spec.is_discrete:
            return [unimix_logits(p, self.unimix) for p in x.split(self.spec.discrete, -1)]
        mean, std = x.chunk(2, -1)
        std = (self.max_std - self.min_std) * torch.sigmoid(std + 2.0) + self.min_std
        return torch.tanh(mean), std

    def sample(self, params, noise: torch.Tensor | None = None) -> torch.Tensor:
        """A sample of π(a | s); `noise` (from `noise`) are its random numbers if drawn
        beforehand: uniforms (N, groups, 1) for categoricals, normals (N, A) for a Normal."""
        if self.spec.is_discrete:
            return torch.cat([onehot_sample(lp, u=None if noise is None else noise[:, k])
                              for k, lp in enumerate(params)], -1)
        mean, std = params
        noise = torch.randn_like(mean) if noise is None else noise
        return mean + std * noise  # reparameterised

    def noise(self, *shape: int, device=None) -> torch.Tensor:
        """The random numbers of `sample` for (*shape) rows, drawn in advance."""
        if self.spec.is_discrete:
            return torch.rand(*shape, len(self.spec.discrete), 1, device=device)
        return torch.randn(*shape, self.spec.dim, device=device)

    def mode(self, params) -> torch.Tensor:
        if self.spec.is_discrete:
            return torch.cat([onehot_mode(lp) for lp in params], -1)
        return params[0]

    def log_prob(self, params, action: torch.Tensor) -> torch.Tensor:
        if self.spec.is_discrete:
            parts = action.split(self.spec.discrete, -1)
            return sum((lp * a).sum(-1) for lp, a in zip(params, parts))
        mean, std = params
        return _normal(mean, std).log_prob(action).sum(-1)

    def entropy(self, params) -> torch.Tensor:
        if self.spec.is_discrete:
            return sum(categorical_entropy(lp) for lp in params)
        return _normal(*params).entropy().sum(-1)

    @staticmethod
    def stack(params: list):
        """Stack per-step distribution parameters along a new leading (time) axis."""
        return [torch.stack(parts) for parts in zip(*params)]

    def forward(self, feat: torch.Tensor, explore: bool = True) -> torch.Tensor:
        p = self.params(feat)
        return self.sample(p) if explore else self.mode(p)


class Critic(nn.Module):
    """v(s): two-hot logits over symlog returns, zero-initialised output, with a slow EMA copy."""

    def __init__(self, feat_dim: int, mcfg: ModelConfig):
        super().__init__()
        dims = mcfg.dims()
        self.twohot = TwoHot(mcfg.num_bins, mcfg.bins_low, mcfg.bins_high)
        self.net = Head(feat_dim, dims["dense_units"], dims["dense_layers"], mcfg.num_bins,
                        zero=True)
        self.slow = copy.deepcopy(self.net).requires_grad_(False)

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        return fp32(self.net(feat))  # fp32 logits for the two-hot loss (bf16 autocast)

    def value(self, feat: torch.Tensor, slow: bool = False) -> torch.Tensor:
        return self.twohot.mean((self.slow if slow else self.net)(feat))

    @torch.no_grad()
    def update_slow(self, fraction: float | torch.Tensor) -> None:
        """slow += fraction * (net - slow); `fraction` may be a 0-d tensor on the parameters'
        device (0 leaves the copy exactly as it was)."""
        for s, f in zip(self.slow.parameters(), self.net.parameters()):
            s.lerp_(f, fraction)


def actor_loss(actor: Actor, params, action: torch.Tensor, ret: torch.Tensor,
               value: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
               tcfg: TrainConfig):
    """Eq. 11 over imagined steps 0..H-1 (`params` and `action` of those steps; `ret` (H, N);
    `value` and `weight` (H+1, N)). REINFORCE with advantages (R - v) / max(1, S) for discrete
    actions (and for continuous ones with continuous_grad='reinforce'); backprop of
    (R - sg(v)) / max(1, S) through the dynamics for continuous actions. Entropy bonus."""
    adv = (ret - value[:-1].detach()) / scale
    if actor.spec.is_discrete or tcfg.continuous_grad == "reinforce":
        logp = actor.log_prob(params, action.detach())
        if logp.shape != adv.shape:  # a broadcast here would silently mix up steps
            raise ValueError(f"actor log-probs {tuple(logp.shape)} do not line up with the "
                             f"advantages {tuple(adv.shape)}")
        objective = logp * adv.detach()
    else:
        objective = adv
    ent = actor.entropy(params)
    loss = -(weight[:-1].detach() * (objective + tcfg.entropy * ent)).mean()
    return loss, {"actor/loss": loss, "actor/entropy": ent.mean(),
                  "actor/advantage_mag": adv.detach().abs().mean()}


def _value_loss(critic: Critic, logits: torch.Tensor, feat: torch.Tensor, ret: torch.Tensor,
                weight: torch.Tensor, tcfg: TrainConfig, probs: torch.Tensor | None = None):
    """Weighted mean of the two-hot cross-entropy of the critic's `logits` toward symlog(ret)
    plus the same toward the slow critic's mean at `feat`; also returns both terms. `probs`:
    the logits' softmax, if the caller has it (`TwoHot.probs`)."""
    with torch.no_grad():
        slow = critic.value(feat.detach(), slow=True)
    l_ret, l_reg = critic.twohot.losses(logits, ret.detach(), slow, probs=probs)  # one pass
    loss = (weight.detach() * (l_ret + tcfg.slow_critic_reg * l_reg)).mean()
    return loss, l_ret, l_reg


def critic_loss(critic: Critic, logits: torch.Tensor, feat: torch.Tensor, ret: torch.Tensor,
                weight: torch.Tensor, tcfg: TrainConfig, probs: torch.Tensor | None = None):
    """Two-hot cross-entropy of the critic's `logits` at imagined steps 0..H-1 toward
    symlog(R), plus the same toward the slow critic's mean at `feat` (regulariser). `probs`:
    the logits' softmax, if already computed for the values."""
    loss, l_ret, l_reg = _value_loss(critic, logits, feat, ret, weight[:-1], tcfg, probs)
    return loss, {"critic/loss": loss, "critic/return_loss": l_ret.mean(),
                  "critic/slow_reg": l_reg.mean()}


def replay_critic_loss(critic: Critic, feat: torch.Tensor, ret: torch.Tensor,
                       last: torch.Tensor, tcfg: TrainConfig):
    """The Nature recipe's replay value loss: the critic at the replayed posterior states
    `feat` (B, T, F; no gradient into the world model) toward the replayed λ-returns `ret`
    (B, T-1) and toward the slow critic, at steps 0..T-2 that do not end an episode."""
    feat = feat[:, :-1].detach()
    loss, _, _ = _value_loss(critic, critic(feat), feat, ret, 1.0 - last[:, :-1].float(), tcfg)
    return loss, {"critic/replay_loss": loss}
