"""Actor, critic, λ-returns and return normalization (paper eqs. 6-12)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from .config import ModelConfig, TrainConfig
from .specs import ActionSpec
from .nets import (Head, TwoHot, categorical_entropy, dense_for, fp32, onehot_mode,
                   onehot_sample, unimix_logits)


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


def episode_ends(is_last: torch.Tensor, is_first: torch.Tensor) -> torch.Tensor:
    """Steps (B, T) that end an episode within replayed windows: marked `is_last`, or followed
    by an `is_first` step, where the stream was cut without one (a resumed run, a replaced
    env runner: the old episode's last stored step is not marked)."""
    return is_last | torch.cat([is_first[:, 1:], torch.zeros_like(is_first[:, :1])], 1)


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


def percentiles(x: torch.Tensor, qs: tuple[float, ...]) -> list[torch.Tensor]:
    """Percentiles of all of x (qs in [0, 1]), interpolated linearly between the two nearest
    sorted values, as numpy's default and torch.quantile; NaN if x holds a NaN. One sort; the
    positions follow from x's size alone, so nothing is read back to the host (torch.quantile
    checks its q tensor on the host in some torch versions)."""
    s = x.detach().flatten().float().sort().values  # NaN sorts last
    nan = torch.isnan(s[-1])
    n, out = s.numel(), []
    for q in qs:
        i, frac = divmod(q * (n - 1), 1.0)
        i = int(i)
        v = s[i] if frac == 0 else s[i] + frac * (s[min(i + 1, n - 1)] - s[i])
        out.append(torch.where(nan, s[-1], v))
    return out


class ReturnNorm(nn.Module):
    """EMA of the low/high percentiles of λ-returns; scale S = max(min_scale, high - low)."""

    def __init__(self, decay: float = 0.99, low: float = 5.0, high: float = 95.0,
                 min_scale: float = 1.0):
        super().__init__()
        self.decay, self.min_scale = decay, min_scale
        # The percentiles are settings, not state: a resume takes the config's.
        self.q = (low / 100.0, high / 100.0)
        self.register_buffer("low", torch.zeros(()))
        self.register_buffer("high", torch.zeros(()))

    @torch.no_grad()
    def update(self, returns: torch.Tensor) -> None:
        lo, hi = percentiles(returns, self.q)
        ok = torch.isfinite(lo) & torch.isfinite(hi)  # a non-finite batch leaves the EMA as is
        self.low.copy_(torch.where(ok, self.decay * self.low + (1 - self.decay) * lo, self.low))
        self.high.copy_(torch.where(ok, self.decay * self.high + (1 - self.decay) * hi, self.high))

    def scale(self) -> torch.Tensor:
        return torch.clamp(self.high - self.low, min=self.min_scale)


def _normal(mean: torch.Tensor, std: torch.Tensor) -> torch.distributions.Normal:
    # No argument validation: it reads values back to the host (std > 0 holds by construction).
    return torch.distributions.Normal(mean, std, validate_args=False)


def uses_reinforce(spec: ActionSpec, tcfg: TrainConfig) -> bool:
    """Whether the actor learns by REINFORCE (eq. 11's score function): always where there
    are discrete actions (a space that mixes discrete and Box leaves learns by it for all its
    actions, as the authors' current code does for every space), for Box-only spaces with
    `continuous_grad=reinforce`; otherwise by backprop through the dynamics."""
    return not spec.is_continuous or tcfg.continuous_grad == "reinforce"


def policy_noise(groups: int, box: int, *shape: int, device=None) -> torch.Tensor:
    """The random numbers of one sample of a policy over `groups` categoricals and `box`
    Box dimensions for (*shape) rows, drawn in advance: uniforms (*shape, groups, 1) for
    categoricals alone, normals (*shape, box) for a Normal alone, and for both (*shape,
    groups + box), the uniforms first. Both recipes' actors and the exported policy step
    take them in this layout."""
    if not box:
        return torch.rand(*shape, groups, 1, device=device)
    eps = torch.randn(*shape, box, device=device)
    return torch.cat([torch.rand(*shape, groups, device=device), eps], -1) if groups else eps


class Actor(nn.Module):
    """π(a | s): factorised unimix categoricals for discrete actions, a Normal with tanh mean
    and std in [min_std, max_std] for Box actions (model space [-1, 1]); for a space with
    both, their product (the one-hots lead the action, `ActionSpec.slices`).

    Distribution parameters are a list: the log-probs of each categorical, then the Normal's
    mean and std if there are Box actions."""

    def __init__(self, feat_dim: int, spec: ActionSpec, mcfg: ModelConfig):
        super().__init__()
        dims = mcfg.dims()
        self.spec = spec
        self.unimix = mcfg.unimix if mcfg.actor_unimix is None else mcfg.actor_unimix
        self.min_std, self.max_std = mcfg.actor_min_std, mcfg.actor_max_std
        self.groups = list(spec.discrete or ())  # sizes of the categoricals
        self.n_box = spec.dim - spec.n_discrete  # dimensions of the Normal
        out = spec.n_discrete + 2 * self.n_box
        self.head = Head(feat_dim, dims["dense_units"], dims["dense_layers"], out)

    def params(self, feat: torch.Tensor) -> list[torch.Tensor]:
        x = fp32(self.head(dense_for(self.head, feat)))  # parameters in fp32 (bf16 autocast)
        sizes = self.groups + ([2 * self.n_box] if self.n_box else [])
        parts = x.split(sizes, -1)
        out = [unimix_logits(p, self.unimix) for p in parts[:len(self.groups)]]
        if self.n_box:
            mean, std = parts[-1].chunk(2, -1)
            std = (self.max_std - self.min_std) * torch.sigmoid(std + 2.0) + self.min_std
            out += [torch.tanh(mean), std]
        return out

    def _split(self, params):
        """(categoricals' log-probs, (mean, std) or None)."""
        k = len(self.groups)
        return params[:k], (params[k:] if self.n_box else None)

    @staticmethod
    def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(parts, -1) if len(parts) > 1 else parts[0]

    def sample(self, params, noise: torch.Tensor | None = None) -> torch.Tensor:
        """A sample of π(a | s); `noise` (from `noise`) are its random numbers if drawn
        beforehand (`noise`'s layout)."""
        cats, normal = self._split(params)
        out = []
        for k, lp in enumerate(cats):
            u = None if noise is None else noise[:, k] if not self.n_box else noise[:, k:k + 1]
            out.append(onehot_sample(lp, u=u))
        if normal is not None:
            mean, std = normal
            eps = torch.randn_like(mean) if noise is None else noise[:, len(cats):]
            out.append(mean + std * eps)  # reparameterised
        return self._cat(out)

    def noise(self, *shape: int, device=None) -> torch.Tensor:
        """The random numbers of `sample` for (*shape) rows, drawn in advance
        (`policy_noise`)."""
        return policy_noise(len(self.groups), self.n_box, *shape, device=device)

    def mode(self, params) -> torch.Tensor:
        cats, normal = self._split(params)
        return self._cat([onehot_mode(lp) for lp in cats] + ([normal[0]] if normal else []))

    def log_prob(self, params, action: torch.Tensor) -> torch.Tensor:
        """log π(a | s): the sum over the categoricals and the Normal's dimensions."""
        cats, normal = self._split(params)
        parts = action.split(self.groups + ([self.n_box] if self.n_box else []), -1)
        terms = [(lp * a).sum(-1) for lp, a in zip(cats, parts)]
        if normal is not None:
            terms.append(_normal(*normal).log_prob(parts[-1]).sum(-1))
        return sum(terms[1:], terms[0])

    def entropy(self, params) -> torch.Tensor:
        cats, normal = self._split(params)
        terms = [categorical_entropy(lp) for lp in cats]
        if normal is not None:
            terms.append(_normal(*normal).entropy().sum(-1))
        return sum(terms[1:], terms[0])

    @staticmethod
    def stack(params: list):
        """Stack per-step distribution parameters along a new leading (time) axis."""
        return [torch.stack(parts) for parts in zip(*params)]

    def forward(self, feat: torch.Tensor, explore: bool = True) -> torch.Tensor:
        p = self.params(feat)
        return self.sample(p) if explore else self.mode(p)


class Critic(nn.Module):
    """v(s): two-hot logits over symlog returns, zero-initialized output, with a slow EMA copy."""

    def __init__(self, feat_dim: int, mcfg: ModelConfig):
        super().__init__()
        dims = mcfg.dims()
        self.twohot = TwoHot(mcfg.num_bins, mcfg.bins_low, mcfg.bins_high)
        self.net = Head(feat_dim, dims["dense_units"], dims["dense_layers"], mcfg.num_bins,
                        zero=True)
        self.slow = copy.deepcopy(self.net).requires_grad_(False)

    def copy_to_slow(self) -> None:
        """slow := a copy of `net`, as at the start (Agent calls it after build_critic, which
        may have replaced `net`)."""
        self.slow = copy.deepcopy(self.net).requires_grad_(False)

    def forward(self, feat: torch.Tensor) -> torch.Tensor:
        return fp32(self.net(dense_for(self.net, feat)))  # fp32 logits (bf16 autocast)

    def value(self, feat: torch.Tensor, slow: bool = False) -> torch.Tensor:
        net = self.slow if slow else self.net
        return self.twohot.mean(net(dense_for(net, feat)))

    @torch.no_grad()
    def update_slow(self, fraction: float | torch.Tensor) -> None:
        """slow += fraction * (net - slow); `fraction` may be a 0-d tensor on the parameters'
        device (0 leaves the copy exactly as it was)."""
        for s, f in zip(self.slow.parameters(), self.net.parameters()):
            s.lerp_(f, fraction)


def advantage(ret: torch.Tensor, value: torch.Tensor, scale: torch.Tensor,
              tcfg: TrainConfig) -> torch.Tensor:
    """(R - v) / max(1, S) at imagined steps 0..H-1 (`ret` (H, N), `value` (H+1, N)); the
    baseline carries no gradient unless `actor_baseline_grad` (the authors' code)."""
    base = value[:-1] if tcfg.actor_baseline_grad else value[:-1].detach()
    return (ret - base) / scale


def policy_loss(actor: Actor, params, action: torch.Tensor, adv: torch.Tensor,
                weight: torch.Tensor, tcfg: TrainConfig):
    """Eq. 11 for given advantages `adv` (H, N) of imagined steps 0..H-1 (`params` and
    `action` of those steps, `weight` (H+1, N)): REINFORCE where `uses_reinforce`, else
    backprop of the advantages through the dynamics; plus the entropy bonus."""
    if uses_reinforce(actor.spec, tcfg):
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


def actor_loss(actor: Actor, params, action: torch.Tensor, ret: torch.Tensor,
               value: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
               tcfg: TrainConfig):
    """Eq. 11 over imagined steps 0..H-1 (`params` and `action` of those steps; `ret` (H, N);
    `value` and `weight` (H+1, N)). REINFORCE with advantages (R - v) / max(1, S) where
    `uses_reinforce`; otherwise backprop of (R - sg(v)) / max(1, S) through the dynamics
    (of (R - v) / max(1, S) with `actor_baseline_grad`, as the authors' code). Entropy bonus."""
    return policy_loss(actor, params, action, advantage(ret, value, scale, tcfg), weight, tcfg)


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
                       last: torch.Tensor, tcfg: TrainConfig, grad: bool = False):
    """The Nature recipe's replay value loss: the critic at the replayed posterior states
    `feat` (B, T, F) toward the replayed λ-returns `ret` (B, T-1) and toward the slow critic,
    at steps 0..T-2 that do not end an episode. `grad` (train.replay_value_grad): its
    gradient also reaches `feat`, so the world model's encoder and RSSM; else none does."""
    feat = feat[:, :-1] if grad else feat[:, :-1].detach()
    loss, _, _ = _value_loss(critic, critic(feat), feat, ret, 1.0 - last[:, :-1].float(), tcfg)
    return loss, {"critic/replay_loss": loss}
