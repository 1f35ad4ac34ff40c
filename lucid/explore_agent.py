"""Plan2Explore on lucid's agent (`explore.method=p2e`, docs/exploration.md).

Besides the paper's update (world model, task actor and critic, unchanged), each update:
(7) trains the ensemble (`lucid.explore.Disagreement`) on the replayed posterior states to
predict each next step's embedding (explore.target); (8) imagines H steps from the same
start states with the exploration actor; the intrinsic reward of step k is the ensemble's disagreement about the
transition into it, r_int[k] = Var(s_{k-1}, a_{k-1}), the reward of the action a_{k-1};
the disagreement is divided by its running mean (explore.intr_norm, `lucid.explore`: by
default the batch's own);
(9) one critic and one return normalizer per reward (intrinsic; extrinsic where
explore.extr_scale > 0, as the authors' 2023 code), and the exploration actor's advantage

    A = Σ_k w_k (R_k - v_k) / S_k / Σ_k w_k,   w_int = intr_scale, w_ext = extr_scale
                                               (0 in the reward-free phase);

(10) the exploration actor's and critics' steps. Each of these losses steps only its own
parameters: the world model and the task's actor and critic see no gradient of them.

The exploration policy acts in the training envs during the reward-free phase and after it
with explore.then=explore; evaluations always use the task policy.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .agent import Agent, _adam, _check_trained, frozen
from .behavior import Critic, ReturnNorm, advantage, critic_loss, imagined_weights, \
    lambda_return, policy_loss
from .explore import Disagreement, RunningMean
from .ops.onehot import OneHotCat


def _dense(feat) -> torch.Tensor:
    return feat.to_dense() if isinstance(feat, OneHotCat) else feat


class Explorer:
    """The exploration policy as the collector takes it (`device`, `policy`)."""

    def __init__(self, agent: "ExploreAgent"):
        self.agent = agent

    @property
    def device(self) -> torch.device:
        return self.agent.device

    def policy(self, obs, state=None, explore: bool = True, is_first=None):
        a = self.agent
        return a._act(a.explorer, obs, state, explore, is_first)


class ExploreAgent(Agent):
    """The paper's agent plus Plan2Explore: an ensemble, an exploration actor, its critics
    and return normalizers, each with its own optimizer."""

    def __init__(self, obs_spec, act_spec, config, device="cpu"):
        super().__init__(obs_spec, act_spec, config, device)
        e, t, wm = self.config.explore, self.config.train, self.wm
        units = e.units or self.config.model.dims()["dense_units"]
        out_dim = wm.encoder.out_dim if e.target == "embed" else wm.G * wm.K
        in_dim = (wm.feat_dim if e.inputs == "feat" else wm.D) + act_spec.dim
        self.ensemble = Disagreement(in_dim, out_dim, e.members, e.layers,
                                     units).to(self.device)
        self.explorer = self.build_actor().to(self.device)
        # One critic and one return normalizer per reward the exploration actor weighs.
        self.rewards = {"intr": e.intr_scale, **({"extr": e.extr_scale} if e.extr_scale else {})}
        self.expl_critics = nn.ModuleDict({k: Critic(wm.feat_dim, self.config.model)
                                           for k in self.rewards}).to(self.device)
        for c in self.expl_critics.values():
            c.copy_to_slow()
            for head in (c.net, c.slow):
                head.pad_to = 8 if t.pad_bins else 0
        self.expl_retnorms = nn.ModuleDict({
            k: ReturnNorm(t.return_norm_decay, t.return_norm_low, t.return_norm_high,
                          t.return_norm_min_scale) for k in self.rewards}).to(self.device)
        self.intr_mean = RunningMean(e.intr_norm_decay).to(self.device)
        graph = t.cuda_graph
        self.opt_ensemble = _adam(self.ensemble.parameters(), e.lr, e.eps, graph)
        self.opt_explorer = _adam(self.explorer.parameters(), t.actor_lr, t.actor_eps, graph)
        self.opt_expl_critics = {k: _adam(c.net.parameters(), t.critic_lr, t.critic_eps, graph)
                                 for k, c in self.expl_critics.items()}
        # 1 during the reward-free phase: a tensor, so a captured update reads the phase
        self.reward_free = torch.ones((), device=self.device)
        self._free = True
        self.exploring = True  # whether the explorer acted in the last training step
        self._explorer_view = Explorer(self)
        # the task actor's settings with the explorer's entropy scale
        self._explore_tcfg = t if e.entropy is None else dataclasses.replace(t, entropy=e.entropy)

    # ------------------------------------------------------------------ acting

    def acting(self, env_steps: int):
        e = self.config.explore
        free = env_steps < e.reward_free_steps
        if free != self._free:  # written on a change only: no transfer per env step
            self._free = free
            self.reward_free.fill_(float(free))
        self.exploring = free or e.then == "explore"
        return self._explorer_view if self.exploring else self

    # ------------------------------------------------------------------ learning

    def clip(self, part: str) -> float:
        if part == "ensemble":
            return self.config.explore.clip
        if part == "explore_actor":
            return self.config.train.actor_clip
        if part.startswith("explore_critic"):
            return self.config.train.critic_clip
        return super().clip(part)

    def train_step(self, batch: dict) -> dict[str, torch.Tensor]:
        metrics = super().train_step(batch)
        metrics["explore/explorer_acts"] = torch.tensor(float(self.exploring),
                                                        device=self.device)
        return metrics

    def _more(self, batch: dict, out: dict, metrics: dict) -> None:
        skipped = (~self._ensemble_step(batch, out, metrics)).float()
        skipped = skipped + self._explore_steps(batch, out, metrics)
        metrics["train/nonfinite_steps"] = metrics["train/nonfinite_steps"] + skipped

    def _ensemble_step(self, batch: dict, out: dict, metrics: dict) -> torch.Tensor:
        """7. Each member predicts the next step's embedding (or posterior z_{t+1}) from the
        replayed [h_t, a_t] (or [h_t, z_t, a_t]: explore.inputs); transitions into a new
        episode (is_first at t+1) are left out: nothing predicts a reset."""
        feat = self._ensemble_input(out["feat"].detach()[:, :-1])
        x = torch.cat([feat, batch["action"][:, :-1].to(feat.dtype)], -1)
        nxt = out["embed"] if self.config.explore.target == "embed" else out["z"].flatten(-2)
        target = nxt.detach()[:, 1:]
        keep = ~batch["is_first"][:, 1:]
        with self.autocast():
            loss = self.ensemble.loss(x, target, keep)
        metrics["explore/ensemble_loss"] = loss.detach()
        metrics["explore/ensemble_grad_norm"], ok = self._step(
            self.opt_ensemble, loss, self.ensemble.parameters(), self.clip("ensemble"))
        return ok

    def _ensemble_input(self, feat: torch.Tensor | OneHotCat) -> torch.Tensor:
        """What of a state [h, z] the ensemble reads (`explore.inputs`): all of it, or h
        (taken from a `OneHotCat`'s dense part without building z's one-hots)."""
        if self.config.explore.inputs == "feat":
            return _dense(feat)
        return (feat.dense if isinstance(feat, OneHotCat) else feat)[..., :self.wm.D]

    def _explore_steps(self, batch: dict, out: dict, metrics: dict) -> torch.Tensor:
        """8.-10. Imagine with the explorer, reward it by disagreement (and the env's reward),
        and step its actor and critics. Returns the count of skipped steps."""
        t = self.config.train
        first = next(iter(self.rewards))
        im = self._imagine(out, batch, self.explorer, self.expl_critics[first])
        with self.autocast(), frozen(self.ensemble), \
                torch.set_grad_enabled(not self._reinforce):
            feat = self._ensemble_input(im.feat[:-1])
            intr = self.ensemble.disagreement(torch.cat([feat, im.action.to(feat.dtype)], -1))
        metrics["explore/disagreement_mean"] = intr.detach().mean()
        if self.config.explore.intr_norm:
            self.intr_mean.update(intr if self.gather is None else self.gather(intr.detach()))
            intr = self.intr_mean.normalize(intr)
        rewards = {"intr": torch.cat([torch.zeros_like(intr[:1]), intr], 0),
                   "extr": im.reward}
        weight = imagined_weights(im.cont, t.gamma).detach()
        scales = {"intr": torch.full_like(self.reward_free, self.rewards["intr"]),
                  "extr": self.rewards.get("extr", 0.0) * (1.0 - self.reward_free)}
        total = sum(scales[k] for k in self.rewards)
        adv, c_losses = 0.0, {}
        for k, critic in self.expl_critics.items():
            if k == first:
                logits, probs, value = im.critic_logits, im.critic_probs, im.value
            else:
                logits, probs, value = self._critic_values(critic, im.feat)
            ret = lambda_return(rewards[k], im.cont, value, t.gamma, t.lam)
            norm = self.expl_retnorms[k]
            norm.update(ret if self.gather is None else self.gather(ret.detach()))
            adv = adv + scales[k] / total * advantage(ret, value, norm.scale(), t)
            c_losses[k], _ = critic_loss(critic, logits, im.feat[:-1], ret, weight, t, probs)
            metrics[f"explore/{k}_return_mean"] = ret.detach().mean()
        metrics["explore/intrinsic_reward_mean"] = intr.detach().mean()
        a_loss, m = policy_loss(self.explorer, im.dist, im.action, adv, weight,
                                self._explore_tcfg)
        metrics.update({f"explore/actor_{k.split('/')[1]}": v.detach() for k, v in m.items()})
        metrics["explore/actor_grad_norm"], a_ok = self._step(
            self.opt_explorer, a_loss, self.explorer.parameters(), self.clip("explore_actor"))
        skipped = (~a_ok).float()
        params = {k: list(c.net.parameters()) for k, c in self.expl_critics.items()}
        for k in params:
            self._zero(self.opt_expl_critics[k], params[k])
        sum(c_losses.values()).backward()  # the critics share no parameter
        for k, critic in self.expl_critics.items():
            norm, ok = self._apply(self.opt_expl_critics[k], c_losses[k], params[k],
                                   self.clip("explore_critic"))
            metrics[f"explore/{k}_critic_grad_norm"] = norm
            metrics[f"explore/{k}_critic_loss"] = c_losses[k].detach()
            critic.update_slow(t.slow_critic_fraction * ok.float())
            skipped = skipped + (~ok).float()
        return skipped

    def _critic_values(self, critic: Critic, feat):
        """A further critic's logits at steps 0..H-1 (for its loss) and its values at 0..H
        (gradients reach the imagined states through it, not its parameters)."""
        with self.autocast():
            logits = critic(feat[:-1].detach())
            with frozen(critic), torch.set_grad_enabled(not self._reinforce):
                value = critic.value(feat)
        return logits, None, value

    # ------------------------------------------------------------------ persistence

    def modules(self) -> dict[str, nn.Module]:
        return {**super().modules(), "ensemble": self.ensemble, "explore_actor": self.explorer,
                "explore_critics": self.expl_critics,
                "explore_return_norms": self.expl_retnorms, "explore_intr_mean": self.intr_mean}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super().optimizers(), "ensemble": self.opt_ensemble,
                "explore_actor": self.opt_explorer,
                **{f"explore_critic_{k}": o for k, o in self.opt_expl_critics.items()}}

    def check_optimizers(self) -> None:
        super().check_optimizers()
        _check_trained(self.opt_ensemble, list(self.ensemble.parameters()), self.optimizers())
        _check_trained(self.opt_explorer, list(self.explorer.parameters()), self.optimizers())

    def load_state_dict(self, state: dict) -> None:
        missing = [k for k in self.modules() if k not in state["modules"]]
        if missing:
            raise ValueError(f"checkpoint has no {', '.join(missing)}: it was saved by an "
                             f"agent without explore.method=p2e; load it with "
                             f"explore.method=none")
        super().load_state_dict(state)

    def num_params(self) -> dict[str, int]:
        count = lambda m: sum(p.numel() for p in m.parameters() if p.requires_grad)  # noqa: E731
        return {**super().num_params(), "ensemble": count(self.ensemble),
                "explore_actor": count(self.explorer),
                "explore_critics": sum(count(c.net) for c in self.expl_critics.values())}

