"""The Nature (2025) recipe's agent: its networks (nature_model), losses (nature_losses) and
one optimizer (optim.LaProp), with the interface lucid's loop uses (`policy`, `train_step`,
`state_dict`), as the authors' `Agent.train` and `Agent.loss` (danijar/dreamerv3):

    1. observe the replayed (B, T) windows, resets masking h, z and the previous action,
       from the state stored with the step before each window (`train.replay_context`: the
       replay holds each step's latents, written when the policy acted and rewritten by each
       update that replays the step) or from the zero state; the world model's losses on the
       posterior states;
    2. imagine H = 15 steps from every posterior state with the policy (no gradient reaches
       the world model), then predict rewards, continue probabilities and values;
    3. policy (REINFORCE for every action space) and value losses of the imagined rows; the
       replay value loss, bootstrapped from the imagined returns, with its gradient into the
       world model;
    4. one backward pass of the scaled sum, one LaProp step over all networks, and the slow
       critic moved 2% toward the critic.

Speed paths, the same maths: `train.compile` compiles the update's steps and networks
(`compile`), `train.precision=bf16` runs the networks' forward passes under bf16 autocast
(`autocast`: the losses and distributions stay fp32) and `train.cuda_graph` captures the
whole update as one CUDA graph (`lucid.graph`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .behavior import policy_noise
from .nature_losses import (PercentileNorm, continue_loss, continue_target, image_loss,
                            imagination_losses, kl_losses, replay_value_loss, vector_loss)
from .nature_model import NATURE_SIZES, nature_modules
from .nature_nets import SymexpTwoHot
from .graph import GraphedUpdate, check_device, graphed_or_eager
from .nets import autocast, fp32, one_hot, onehot_sample, symexp, unimix_logits
from .optim import LaProp
from .config import Config, for_device
from .specs import ActionSpec, ObsSpec


@dataclass
class NatureSettings:
    """What the update reads of the config (the `nature` preset: the authors' values)."""
    lr: float
    agc: float
    eps: float
    warmup: int
    horizon: int  # imagined steps
    discount_horizon: float  # 1 / (1 - γ): `contdisc`'s continue target, replay returns
    lam: float
    actent: float
    slowreg: float
    slow_rate: float
    unimix: float
    free_nats: float
    minstd: float
    maxstd: float
    scales: tuple

    @classmethod
    def of(cls, config: Config) -> "NatureSettings":
        t, m = config.train, config.model
        scales = (("dyn", t.dyn_scale), ("rep", t.rep_scale), ("rec", t.decoder_scale),
                  ("rew", t.reward_scale), ("con", t.cont_scale), ("policy", 1.0),
                  ("value", 1.0), ("repval", t.replay_value_scale))
        return cls(lr=t.model_lr, agc=t.agc, eps=t.model_eps, warmup=t.lr_warmup,
                   horizon=t.horizon, discount_horizon=1.0 / (1.0 - t.gamma), lam=t.lam,
                   actent=t.entropy, slowreg=t.slow_critic_reg,
                   slow_rate=t.slow_critic_fraction, unimix=m.unimix, free_nats=t.free_nats,
                   minstd=m.actor_min_std, maxstd=m.actor_max_std, scales=scales)


@dataclass
class NatureState:
    """Recurrent state of N rows: h (N, deter), z (N, stoch, classes), previous action."""
    h: torch.Tensor
    z: torch.Tensor
    action: torch.Tensor


class NatureAgent:
    """World model, actor and critic of the Nature recipe with their one optimizer."""

    def __init__(self, obs_spec: ObsSpec, act_spec: ActionSpec, config: Config,
                 device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.config = config = for_device(config, self.device.type)
        check_device(config.train.cuda_graph, self.device)
        self.obs_spec, self.act_spec = obs_spec, act_spec
        self.s = NatureSettings.of(config)
        size = config.model.size
        mods = nature_modules(obs_spec, act_spec, size)  # an unknown size is refused there
        self.size = NATURE_SIZES[size]
        # data-parallel learners hook these (lucid.distributed.DataParallel.attach)
        self.grad_sync = self.gather = None
        self.wm = mods["world_model"].to(self.device)
        self.actor = mods["actor"].to(self.device)
        self.critic = mods["critic"].to(self.device)
        self.retnorm = PercentileNorm().to(self.device)
        self.twohot = SymexpTwoHot(self.size.bins)
        self.opt = LaProp(self.trained_parameters(), lr=self.s.lr, agc=self.s.agc,
                          eps=self.s.eps, warmup=self.s.warmup)
        self.updates = 0
        self.context = config.train.replay_context  # steps before each window: 0 or 1
        self._latents: tuple[torch.Tensor, torch.Tensor] | None = None  # of the last update
        self._graph: GraphedUpdate | None = None  # train.cuda_graph: captured at first update
        self.loads = 0  # load_state_dict calls (a graph captured before one is stale)
        if config.train.compile:
            self.compile()

    @staticmethod
    def context_fields(config: Config) -> dict[str, tuple[tuple, np.dtype]]:
        """The replay fields of each step's latent state (`train.replay_context`): h in
        float32, z as its classes + 1 per latent, where 0 means none was stored (steps of
        random actions): the zero state."""
        if not config.train.replay_context:
            return {}
        s = NATURE_SIZES[config.model.size]
        return {"latent/h": ((s.deter,), np.dtype(np.float32)),
                "latent/z": ((s.stoch,), np.dtype(np.uint8))}

    @staticmethod
    def _stored(h: torch.Tensor, z: torch.Tensor) -> dict[str, np.ndarray]:
        return {"latent/h": h.detach().float().cpu().numpy(),
                "latent/z": (z.detach().argmax(-1) + 1).to(torch.uint8).cpu().numpy()}

    def _unstored(self, code: torch.Tensor) -> torch.Tensor:
        """z from its stored classes + 1 (0: none stored, the zero state)."""
        code = code.long()
        z = one_hot((code - 1).clamp(min=0), self.size.classes, torch.float32)
        return z * (code > 0).to(z.dtype)[..., None]

    def replay_record(self, state: NatureState) -> dict[str, np.ndarray]:
        """The latents of the steps just acted on, for their replay records (`Collector`)."""
        return self._stored(state.h, state.z) if self.context else {}

    def replay_writes(self) -> dict[str, np.ndarray]:
        """The posterior latents the last update inferred for its window's steps, (B, T)
        each, to refresh the replay's (the authors' `replay.update`); {} without context."""
        if not self.context or self._latents is None:
            return {}
        return self._stored(*self._latents)

    def check_optimizers(self) -> None:
        """Every network's parameters are in the optimizer (as Agent.check_optimizers)."""
        held = {id(p) for g in self.opt.param_groups for p in g["params"]}
        if not {id(p) for p in self.trained_parameters()} <= held:
            raise ValueError("a network of the Nature agent was replaced after its optimizer "
                             "was made; it would never train")

    def compile(self) -> None:
        """`train.compile`: torch.compile, as fixed-shape graphs (`dynamic=False`), the
        filter's step (forward and backward), the whole imagined rollout (no gradient), the
        encoder, decoder, heads, actor and critic networks, the policy's log-probabilities
        and entropies and the two-hot's loss and mean. The random numbers are drawn in eager
        code and passed in, so compiled and eager updates draw the same samples. The loss
        sums, the backward pass and the optimizer stay eager; `state_dict` keys do not
        change."""
        t = self.config.train
        # the heads' shared forward is called in several shapes and grad modes (as Agent)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        cpp_wrapper = t.cpp_wrapper and self.device.type == "cpu"
        opts = {"dynamic": False, "options": {"cpp_wrapper": cpp_wrapper}}
        for name in ("_step", "_rollout", "_logp_entropy"):  # bound methods -> compiled
            setattr(self, name, torch.compile(getattr(self, name), **opts))
        wm = self.wm
        for m in (wm.encoder, wm.decoder, wm.reward, wm.cont, wm.rssm.prior,
                  wm.rssm.prior_logit, self.critic.net, self.critic.slow):
            m.compile(**opts)  # in place: parameters and their names are unchanged
        self.twohot.bins(torch.empty(0, device=self.device))  # cached now, not in a graph
        self.twohot.loss = torch.compile(self.twohot.loss, **opts)
        self.twohot.mean = torch.compile(self.twohot.mean, **opts)

    def autocast(self):
        """`train.precision=bf16`: the networks' forward passes of an update under bf16
        autocast (matmuls and convolutions in bf16); every network's output is cast to fp32
        (`nets.fp32`: logits, heads, decoder, actor), so distributions, losses, returns and
        the recurrent state h stay fp32, as do parameters and the optimizer. Acting stays
        fp32. fp32: a no-op context."""
        return autocast(self.config.train.precision, self.device)

    def optimizers(self) -> dict:
        return {"all": self.opt}

    def trained_parameters(self) -> list[torch.Tensor]:
        return [*self.wm.parameters(), *self.actor.parameters(), *self.critic.net.parameters()]

    # ------------------------------------------------------------------ the RSSM's steps

    def initial(self, n: int) -> NatureState:
        s = self.size
        zeros = lambda *shape: torch.zeros(*shape, device=self.device)  # noqa: E731
        return NatureState(zeros(n, s.deter), zeros(n, s.stoch, s.classes),
                           zeros(n, self.act_spec.dim))

    def _sample_z(self, logits: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
        """A one-hot sample of the 1%-unimix categoricals, straight-through (`u`: its
        uniforms (N, stoch, 1), if drawn beforehand)."""
        return onehot_sample(unimix_logits(logits, self.s.unimix), u=u)

    def _step(self, h: torch.Tensor, z: torch.Tensor, a: torch.Tensor, tokens: torch.Tensor,
              reset: torch.Tensor, u: torch.Tensor | None = None):
        """`obs_step` on tensors (what `train.compile` compiles): h', z', the previous action
        (zeroed on reset rows) and the posterior logits."""
        keep = (~reset).float()
        h = h * keep[:, None]
        z = z * keep[:, None, None]
        a = a * keep[:, None]
        h = self.wm.rssm.core(h, z, a)
        logits = self.wm.rssm.post_logits(h, tokens)
        return h, self._sample_z(logits, u), a, logits

    def obs_step(self, state: NatureState, tokens: torch.Tensor, reset: torch.Tensor,
                 u: torch.Tensor | None = None):
        """Reset rows (zeros), h' = core(h, z, a), z' ~ post(h', tokens) (`u`: the
        sample's uniforms). Returns the new state (its action slot: the previous action) and
        the posterior logits."""
        h, z, a, logits = self._step(state.h, state.z, state.action, tokens, reset, u)
        return NatureState(h, z, a), logits

    def observe(self, state: NatureState, tokens: torch.Tensor, action: torch.Tensor,
                is_first: torch.Tensor):
        """`obs_step` along (B, T) windows from `state`, each step's action the next one's
        previous action: h (B, T, deter), z and the posterior logits (B, T, stoch, classes).
        Each step's uniforms are drawn here, in eager code, so that a compiled step samples
        what the eager one would."""
        hs, zs, post = [], [], []
        h, z, a = state.h, state.z, state.action
        for t in range(tokens.shape[1]):
            u = torch.rand(*z.shape[:-1], 1, device=z.device)
            h, z, _, logits = self._step(h, z, a, tokens[:, t], is_first[:, t], u)
            hs.append(h)
            zs.append(z)
            post.append(logits)
            a = action[:, t]
        return torch.stack(hs, 1), torch.stack(zs, 1), torch.stack(post, 1)

    def feat(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return torch.cat([h, z.flatten(-2)], -1)

    # ------------------------------------------------------------------ the actor

    def _policy_parts(self, feat: torch.Tensor):
        x = self.actor.mlp(feat)
        logits = [fp32(head(x)) for head in self.actor.logits]
        normal = None
        if self.actor.mean is not None:
            lo, hi = self.s.minstd, self.s.maxstd
            std = (hi - lo) * torch.sigmoid(fp32(self.actor.std(x)) + 2.0) + lo
            normal = (torch.tanh(fp32(self.actor.mean(x))), std)
        return logits, normal

    def sample_action(self, feat: torch.Tensor, explore: bool = True,
                       noise: torch.Tensor | None = None) -> torch.Tensor:
        """A sample of the policy (`explore`; `noise`: its random numbers drawn beforehand,
        in `noise`'s layout) or its mode."""
        logits, normal = self._policy_parts(feat)
        parts, box = [], normal is not None
        for k, lg in enumerate(logits):  # categorical without unimix
            u = None if noise is None else noise[:, k:k + 1] if box else noise[:, k]
            parts.append(onehot_sample(torch.log_softmax(lg, -1), straight_through=False, u=u)
                         if explore else one_hot(lg.argmax(-1), lg.shape[-1], lg.dtype))
        if box:
            mean, std = normal
            eps = torch.randn_like(mean) if noise is None else noise[:, len(logits):]
            parts.append(mean + std * eps if explore else mean)
        return torch.cat(parts, -1)

    def noise(self, *shape: int) -> torch.Tensor:
        """The random numbers of one policy sample for (*shape) rows, drawn in advance
        (`behavior.policy_noise`'s layout, as the 2023 actor's)."""
        box = 0 if self.actor.mean is None else self.actor.mean.out_features
        return policy_noise(len(self.actor.logits), box, *shape, device=self.device)

    def _logp_entropy(self, feat: torch.Tensor, action: torch.Tensor):
        logits, normal = self._policy_parts(feat)
        sizes = [lg.shape[-1] for lg in logits] + ([normal[0].shape[-1]] if normal else [])
        acts = action.split(sizes, -1)
        logp, ent = 0.0, 0.0
        for lg, a in zip(logits, acts):
            lp = torch.log_softmax(lg, -1)
            logp = logp + (lp * a).sum(-1)
            ent = ent - (lp.exp() * lp).sum(-1)
        if normal is not None:
            dist = torch.distributions.Normal(*normal, validate_args=False)
            logp = logp + dist.log_prob(acts[-1]).sum(-1)
            ent = ent + dist.entropy().sum(-1)
        return logp, ent

    def acting(self, env_steps: int):
        """What acts in the training envs: this agent (`Agent.acting`)."""
        return self

    @torch.no_grad()  # acting records no graph
    def policy(self, obs: dict[str, torch.Tensor], state: NatureState | None = None,
               explore: bool = True, is_first: torch.Tensor | None = None):
        """One step for N envs: model-space actions (N, A) and the next state."""
        n = next(iter(obs.values())).shape[0]
        if state is None:
            state, is_first = self.initial(n), torch.ones(n, dtype=torch.bool,
                                                          device=self.device)
        elif is_first is None:
            is_first = torch.zeros(n, dtype=torch.bool, device=self.device)
        tokens = self.wm.encoder(obs)
        u = torch.rand(*state.z.shape[:-1], 1, device=self.device)  # as `observe` draws it
        state, _ = self.obs_step(state, tokens, is_first.to(self.device), u)
        action = self.sample_action(self.feat(state.h, state.z), explore)
        return action, NatureState(state.h, state.z, action)

    # ------------------------------------------------------------------ dreams

    def _decode(self, h: torch.Tensor, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each observation key's prediction (..., ...) in observation space: vectors back
        from symlog space, images as uint8 pixels (the stacked channels split by key)."""
        dec, out = self.wm.decoder, {}
        if dec.mlp is not None:
            x = dec.mlp(torch.cat([z.flatten(-2), h], -1))
            out.update({k: symexp(head(x)) for k, head in dec.heads.items()})
        if dec.cnn is not None:
            pixels = (dec.cnn(h, z.flatten(-2)).clamp(0, 1) * 255).round().to(torch.uint8)
            keys = self.wm.encoder.image_keys
            sizes = [self.obs_spec.images[k][2] for k in keys]
            out.update(zip(keys, pixels.split(sizes, -1)))
        return out

    @torch.no_grad()
    def dream(self, obs: dict[str, torch.Tensor], action: torch.Tensor,
              is_first: torch.Tensor, context: int, horizon: int, sample: bool = False
              ) -> dict[str, torch.Tensor]:
        """The open-loop rollout of `lucid dream` (as `WorldModel.dream`): `context` steps
        filter the real observations from the zero state, then `horizon` steps of the prior
        driven by the recorded actions (z its mode, or a sample). Returns each key's decoded
        prediction (B, context + horizon, ...) in observation space."""
        tokens = self.wm.encoder({k: v[:, :context] for k, v in obs.items()})
        h, z, _ = self.observe(self.initial(action.shape[0]), tokens, action, is_first)
        hs, zs = list(h.unbind(1)), list(z.unbind(1))
        h, z = hs[-1], zs[-1]
        for t in range(context, context + horizon):
            h = self.wm.rssm.core(h, z, action[:, t - 1])
            logits = unimix_logits(self.wm.rssm.prior_logits(h), self.s.unimix)
            z = onehot_sample(logits) if sample else one_hot(logits.argmax(-1),
                                                             logits.shape[-1], h.dtype)
            hs.append(h)
            zs.append(z)
        return self._decode(torch.stack(hs, 1), torch.stack(zs, 1))

    # ------------------------------------------------------------------ learning

    def _window(self, batch: dict) -> tuple[dict, NatureState]:
        """The window to learn from and the state before its first step: with replay
        context, the batch's first row holds that state (the latents stored with it and its
        action); without, the zero state."""
        if not self.context:
            return batch, self.initial(batch["reward"].shape[0])
        if "latent/h" not in batch or "latent/z" not in batch:
            raise KeyError("train.replay_context=1: each window starts with the step before "
                           "it and its stored latents (latent/h, latent/z), which this batch "
                           "lacks; sample it from the run's replay, or set "
                           "train.replay_context=0 to start windows from the zero state")
        start = NatureState(batch["latent/h"][:, 0].float(),
                            self._unstored(batch["latent/z"][:, 0]), batch["action"][:, 0])
        rest = lambda v: v[:, 1:]  # noqa: E731
        window = {k: ({kk: rest(vv) for kk, vv in v.items()} if isinstance(v, dict)
                      else v if k.startswith("_") else rest(v)) for k, v in batch.items()}
        return window, start

    def _world_model(self, batch: dict, state: NatureState):
        """1. Observe the windows from `state`; the world model's per-step losses (B, T)
        and states."""
        wm, s, dec = self.wm, self.s, self.wm.decoder
        with self.autocast():  # the networks; their outputs are fp32, the losses below too
            h, z, post = self.observe(state, wm.encoder(batch["obs"]), batch["action"],
                                      batch["is_first"])
            prior = wm.rssm.prior_logits(h)
            feat = self.feat(h, z)
            reward, cont = wm.reward(feat), wm.cont(feat).squeeze(-1)
            vectors, image = {}, None
            if dec.mlp is not None:
                x = dec.mlp(torch.cat([z.flatten(-2), h], -1))
                vectors = {k: head(x) for k, head in dec.heads.items()}
            if dec.cnn is not None:
                image = dec.cnn(h, z.flatten(-2))
        losses = dict(zip(("dyn", "rep"), kl_losses(post, prior, s.unimix, s.free_nats)))
        losses["rew"] = self.twohot.loss(reward, batch["reward"])
        losses["con"] = continue_loss(cont, continue_target(batch["is_terminal"],
                                                            s.discount_horizon))
        rec = 0.0
        for k, pred in vectors.items():
            rec = rec + vector_loss(pred, batch["obs"][k])
        if image is not None:
            images = torch.cat([batch["obs"][k] for k in wm.encoder.image_keys], -1)
            rec = rec + image_loss(image, images)
        losses["rec"] = rec
        return losses, h, z, feat

    def _imagine(self, h: torch.Tensor, z: torch.Tensor):
        """2. H steps from every posterior state, without gradient into the world model:
        features (N, H+1, F) and actions (N, H+1, A), the last step's action sampled too.
        The random numbers are drawn here and passed in (see `observe`)."""
        horizon = self.s.horizon
        noise = self.noise(horizon + 1, h.shape[0])
        u = torch.rand(horizon, *z.shape[:-1], 1, device=self.device)
        with torch.no_grad():
            return self._rollout(h, z, noise, u)

    def _rollout(self, h: torch.Tensor, z: torch.Tensor, noise: torch.Tensor,
                 u: torch.Tensor):
        """The imagined steps of `_imagine` from its random numbers (compiled whole by
        `train.compile`)."""
        feats, acts = [self.feat(h, z)], []
        for k in range(self.s.horizon):
            a = self.sample_action(feats[-1], noise=noise[k])
            acts.append(a)
            h = self.wm.rssm.core(h, z, a)
            z = self._sample_z(self.wm.rssm.prior_logits(h), u[k])
            feats.append(self.feat(h, z))
        acts.append(self.sample_action(feats[-1], noise=noise[-1]))
        return torch.stack(feats, 1), torch.stack(acts, 1)

    def loss(self, batch: dict):
        """Steps 1-3 on one batch: the scaled sum of the losses, the metrics (detached) and
        the window's posterior latents (h, z), each (B, T, ...). Nothing of the agent
        changes but the return normaliser's statistics, so that `lucid.batched` can run it
        for several seeds at once."""
        s, wm, critic = self.s, self.wm, self.critic
        batch, start = self._window(batch)
        B, T = batch["reward"].shape
        losses, h, z, feat = self._world_model(batch, start)
        with self.autocast():  # the networks (fp32 outputs); the losses after, in fp32
            imfeat, imact = self._imagine(h.detach().reshape(B * T, -1),
                                          z.detach().reshape(B * T, *z.shape[2:]))
            with torch.no_grad():
                rew = wm.reward(imfeat)
                con = torch.sigmoid(wm.cont(imfeat).squeeze(-1))
                slow, slow_rep = critic.slow(imfeat), critic.slow(feat)
            logpi, ent = self._logp_entropy(imfeat, imact)
            val_logits, rep_logits = critic.net(imfeat), critic.net(feat)
        policy, value, ret, adv = imagination_losses(
            self.twohot, self.twohot.mean(rew), con, logpi, ent, val_logits, slow, self.retnorm,
            s.lam, s.actent, s.slowreg, gather=self.gather)
        losses["policy"], losses["value"] = policy, value
        losses["repval"], _ = replay_value_loss(
            self.twohot, batch["is_last"].float(), batch["is_terminal"].float(),
            batch["reward"], ret[:, 0].reshape(B, T), rep_logits, slow_rep,
            s.discount_horizon, s.lam, s.slowreg)
        scales = dict(s.scales)
        loss = sum(scales[k] * v.mean() for k, v in losses.items())
        metrics = {f"loss/{k}": v.detach().mean() for k, v in losses.items()}
        metrics.update({"actor/entropy": ent.detach().mean(),
                        "actor/advantage_mag": adv.detach().abs().mean(),
                        "critic/return_mean": ret.detach().mean(),
                        "actor/return_scale": self.retnorm.stats()[1]})
        return loss, metrics, (h.detach(), z.detach())

    def apply(self, loss: torch.Tensor, latents: tuple) -> dict[str, torch.Tensor]:
        """Step 4 after the backward pass of `loss`: the gradients' norm, one LaProp step
        over all networks (skipped where the loss or the norm is not finite) and the slow
        critic 2% toward the critic; the step's metrics. `latents`: `loss`'s, kept for
        `replay_writes`."""
        self._latents = latents if self.context else None
        params = self.trained_parameters()
        if self.grad_sync is not None:  # data-parallel: every rank steps the averaged gradients
            loss = self.grad_sync(params, loss)
        norm = torch.nn.utils.get_total_norm(
            [p.grad for p in params if p.grad is not None], foreach=True)
        ok = torch.isfinite(norm) & torch.isfinite(loss)
        self.opt.found_inf = (~ok).float()
        self.opt.step()
        with torch.no_grad():  # the slow critic 2% toward the critic (not on a skipped step)
            rate = self.s.slow_rate * ok.float()
            for slow_p, p in zip(self.critic.slow.parameters(), self.critic.net.parameters()):
                slow_p.lerp_(p, rate)
        return {"train/loss": loss, "train/grad_norm": norm.detach(),
                "train/nonfinite_steps": (~ok).float()}

    def train_step(self, batch: dict) -> dict[str, torch.Tensor]:
        """One update; metrics as 0-d tensors (no syncs). With `train.cuda_graph` the update
        is captured once and replayed (the batch's host-side keys, `_env` and `_step`, stay
        outside the graph)."""
        out = graphed_or_eager(self, batch)
        self.updates += 1
        return out

    def _update(self, batch: dict) -> dict[str, torch.Tensor]:
        loss, metrics, latents = self.loss(batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        metrics.update(self.apply(loss.detach(), latents))
        return metrics

    def train(self, batch: dict) -> dict[str, float]:
        metrics = self.train_step(batch)
        values = torch.stack([v.float() for v in metrics.values()]).cpu().tolist()
        return dict(zip(metrics.keys(), values))

    # ------------------------------------------------------------------ persistence

    def modules(self) -> dict:
        return {"world_model": self.wm, "actor": self.actor, "critic": self.critic,
                "return_norm": self.retnorm}

    def state_dict(self) -> dict:
        return {"recipe": "nature",
                "modules": {k: m.state_dict() for k, m in self.modules().items()},
                "optimizers": {"all": self.opt.state_dict()}, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        if state.get("recipe") != "nature":
            raise ValueError(f"this checkpoint holds an agent of the "
                             f"{state.get('recipe', '2023')} recipe, not of the Nature "
                             f"recipe's; load it with the recipe it was trained with")
        for k, m in self.modules().items():
            m.load_state_dict(state["modules"][k])
        self.opt.load_state_dict(state["optimizers"]["all"])
        self.updates = int(state.get("updates", 0))
        self._graph = None  # optimizer state tensors were replaced: capture again
        self.loads += 1


