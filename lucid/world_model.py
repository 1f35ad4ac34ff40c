"""The world model: encoder, RSSM (sequence model, posterior, prior), reward, continue and
decoder heads, and its loss (paper eqs. 3-5).

Time convention of a batch row: obs[t] is seen, action[t] is taken after seeing it, and
reward[t] / is_terminal[t] belong to arriving at obs[t]. The sequence model therefore builds
h[t] from (h[t-1], z[t-1], action[t-1]); at `is_first[t]` the previous state is replaced by the
learned initial state and the previous action by zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig, TrainConfig
from .specs import ObsSpec
from .nets import (MLP, Head, ImageDecoder, ImageEncoder, NormGRUCell, OneHotCat, TwoHot,
                   categorical_entropy, categorical_kl, fp32, linear, one_hot, onehot_mode,
                   onehot_sample, symexp, symlog, unimix_index, unimix_logits)


@dataclass
class State:
    """Recurrent state of the RSSM for a batch: h (N, D), z (N, G, K) and the previous action."""

    h: torch.Tensor
    z: torch.Tensor
    action: torch.Tensor


def image_input(img: torch.Tensor) -> torch.Tensor:
    """uint8 (..., H, W, C) in [0, 255] -> float (..., C, H, W) in [-0.5, 0.5]."""
    return img.float().div(255.0).sub(0.5).movedim(-1, -3)


def image_output(pred: torch.Tensor) -> torch.Tensor:
    """The inverse of `image_input` for the decoder's images: float (..., C, H, W) around
    [-0.5, 0.5] -> uint8 (..., H, W, C), rounded and clipped to [0, 255]."""
    return ((pred.float() + 0.5) * 255.0).clamp(0, 255).round().to(torch.uint8).movedim(-3, -1)


class Encoder(nn.Module):
    """Vector keys -> one MLP on their symlog'd concatenation; image keys -> one CNN on their
    channel concatenation. The embedding is the concatenation of both."""

    def __init__(self, spec: ObsSpec, dims: dict[str, int]):
        super().__init__()
        self.spec = spec
        self.mlp = (MLP(spec.vector_dim, dims["vector_units"], dims["vector_layers"])
                    if spec.vectors else None)
        self.cnn = None
        if spec.images:
            c, h, w = spec.image_shape
            self.cnn = ImageEncoder(c, dims["cnn_mult"], h, w)
        self.out_dim = (self.mlp.out_dim if self.mlp else 0) + (self.cnn.out_dim if self.cnn else 0)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = []
        if self.mlp is not None:
            vec = torch.cat([obs[k].float() for k in self.spec.vectors], -1)
            parts.append(self.mlp(symlog(vec)))
        if self.cnn is not None:
            img = torch.cat([image_input(obs[k]) for k in self.spec.images], -3)
            lead = img.shape[:-3]
            parts.append(self.cnn(img.reshape(-1, *img.shape[-3:])).reshape(*lead, -1))
        return torch.cat(parts, -1)


class Decoder(nn.Module):
    """Predicts the mean of a unit-variance Gaussian for every observation key: symlog space
    for vectors, [-0.5, 0.5] pixels for images. Loss: squared error summed over dimensions."""

    def __init__(self, spec: ObsSpec, feat_dim: int, dims: dict[str, int]):
        super().__init__()
        self.spec = spec
        self.mlp = (Head(feat_dim, dims["vector_units"], dims["vector_layers"], spec.vector_dim)
                    if spec.vectors else None)
        self.cnn = None
        if spec.images:
            c, h, w = spec.image_shape
            self.cnn = ImageDecoder(feat_dim, c, dims["cnn_mult"], h, w)

    def forward(self, feat: torch.Tensor) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        if self.mlp is not None:
            vec = fp32(self.mlp(feat))  # fp32 predictions (and loss) under bf16 autocast
            for k, part in zip(self.spec.vectors, vec.split(list(self.spec.vectors.values()), -1)):
                out[k] = part
        if self.cnn is not None:
            lead = feat.shape[:-1]
            img = fp32(self.cnn(feat.reshape(-1, feat.shape[-1])))
            img = img.reshape(*lead, *img.shape[1:])
            chans = [s[2] for s in self.spec.images.values()]
            for k, part in zip(self.spec.images, img.split(chans, -3)):
                out[k] = part
        return out

    def observation(self, pred: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Predictions in observation space: uint8 pixels (`image_output`), vectors mapped
        back from symlog space."""
        return {k: image_output(p) if k in self.spec.images else symexp(p.float())
                for k, p in pred.items()}

    def loss(self, pred: dict[str, torch.Tensor], obs: dict[str, torch.Tensor]) -> torch.Tensor:
        total = 0.0
        for k, p in pred.items():
            if k in self.spec.images:
                target = image_input(obs[k])
                total = total + (p - target).square().sum((-3, -2, -1))
            else:
                total = total + (p - symlog(obs[k].float())).square().sum(-1)
        return total


class WorldModel(nn.Module):
    skip_resets = True  # observe(): skip resets where no row starts (reads flags to the host)

    # Where a subclass changes the RSSM's distributions: every prior (the KL, the initial
    # state, imagination, dreams) comes from `prior_logits`, every posterior from
    # `post_logp_split`. The derived methods below are not on every path, so an override of
    # them would change some paths and silently not others: refused.
    _DERIVED = {"prior_logp": "prior_logits(h) (raw logits (..., G, K); unimix is applied "
                              "after it), which every prior goes through",
                "post_logp": "post_logp_split(h, e_part, w_h) (e_part = W_e·embed, the "
                             "posterior's first layer split for speed), which every "
                             "posterior goes through, or replace post_out"}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name, instead in WorldModel._DERIVED.items():
            if name in cls.__dict__:
                raise TypeError(f"{cls.__name__} overrides WorldModel.{name}, which not every "
                                f"path calls (imagination and filtering take faster routes); "
                                f"override {instead}")

    def __init__(self, spec: ObsSpec, action_dim: int, mcfg: ModelConfig,
                 box_from: int | None = None):
        """`box_from`: where the action's Box (continuous) dimensions begin, after its one-hots;
        None if it has none."""
        super().__init__()
        dims = mcfg.dims()
        self.dims = dims
        self.spec = spec
        self.action_dim = action_dim
        self.unimix = mcfg.unimix
        self.action_clip = mcfg.action_clip if box_from is not None else 0.0
        self.box_from = box_from or 0  # one-hots are within 1: only Box dims are clipped
        D, U = dims["gru_units"], dims["dense_units"]
        G, K = dims["latent_groups"], dims["latent_classes"]
        self.G, self.K, self.D = G, K, D
        self.feat_dim = D + G * K
        self.encoder = Encoder(spec, dims)
        # Posterior: one dense layer over [embedding, h], then the representation layer.
        self.post_mlp = MLP(self.encoder.out_dim + D, U, 1)
        self.post_out = linear(U, G * K)
        # Prior (dynamics predictor) from h alone.
        self.prior_mlp = MLP(D, U, 1)
        self.prior_out = linear(U, G * K)
        # Sequence model: dense layer over [z, a], then the normalized GRU.
        self.seq_in = MLP(G * K + action_dim, U, 1)
        self.gru = NormGRUCell(U, D)
        self.initial_h = nn.Parameter(torch.zeros(D))
        self.twohot = TwoHot(mcfg.num_bins, mcfg.bins_low, mcfg.bins_high)
        self.reward = Head(self.feat_dim, U, dims["dense_layers"], mcfg.num_bins, zero=True)
        self.cont = Head(self.feat_dim, U, dims["dense_layers"], 1)
        self.decoder = Decoder(spec, self.feat_dim, dims)

    # ------------------------------------------------------------------ RSSM pieces

    def feat(self, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor | OneHotCat:
        """[h, z]; z either one-hot (..., G, K) or class indices (..., G) (a `OneHotCat`)."""
        if not z.is_floating_point():
            return OneHotCat(h, z, self.K, at=h.shape[-1])
        return torch.cat([h, z.flatten(-2)], -1)

    def _latent_logp(self, x: torch.Tensor) -> torch.Tensor:
        return unimix_logits(x.reshape(*x.shape[:-1], self.G, self.K), self.unimix)

    def prior_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The dynamics predictor's raw logits (..., G, K) from h alone."""
        x = self.prior_out(self.prior_mlp(h))
        return x.reshape(*x.shape[:-1], self.G, self.K)

    def prior_logp(self, h: torch.Tensor) -> torch.Tensor:
        return unimix_logits(self.prior_logits(h), self.unimix)

    def post_logp(self, h: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
        """q(z | h, e): a dense layer over [e, h], its norm and activation, then the
        representation layer."""
        return self.post_logp_split(h, *self.post_split(embed))

    def post_split(self, embed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The posterior's first layer is linear in [e, h]: W [e, h] = W_e e + W_h h. Returns
        W_e e for every step of `embed` at once (`observe`: one large matmul instead of one
        per step) and W_h, for `post_logp_split`."""
        w_e, w_h = self.post_mlp.net[0].weight.split([embed.shape[-1], self.D], 1)
        return F.linear(embed, w_e), w_h

    def post_logp_split(self, h: torch.Tensor, e_part: torch.Tensor, w_h: torch.Tensor
                        ) -> torch.Tensor:
        """`post_logp(h, e)` from e_part = W_e e and W_h (`post_split`)."""
        rest = self.post_mlp.net[1:]  # the first layer's norm and activation
        return self._latent_logp(self.post_out(rest(e_part + F.linear(h, w_h))))

    def sequence(self, h: torch.Tensor, z: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """h' = GRU(dense([z, a]), h); z one-hot (N, G, K) or class indices (N, G). Continuous
        actions enter scaled to at most `action_clip` per dimension (the scale carries no
        gradient): a sampled Normal action can lie beyond the env's bounds."""
        if self.action_clip > 0:
            c, k = self.action_clip, self.box_from
            box = action[..., k:]
            box = box * (c / box.abs().clamp(min=c)).detach()
            action = torch.cat([action[..., :k], box], -1) if k else box
        if not z.is_floating_point():
            return self.gru(self.seq_in(OneHotCat(action, z, self.K, at=0)), h)
        return self.gru(self.seq_in(torch.cat([z.flatten(-2), action], -1)), h)

    def initial(self, n: int) -> State:
        """Learned initial state: h0 = tanh(param), z0 = mode of the prior at h0, zero action."""
        h = torch.tanh(self.initial_h).unsqueeze(0)
        # The class's prior_logp: `train.compile` compiles the instance's for batches, and
        # one row is not worth a graph of its own.
        z = onehot_mode(WorldModel.prior_logp(self, h))
        return State(h.expand(n, -1), z.expand(n, -1, -1),
                     torch.zeros(n, self.action_dim, device=h.device, dtype=h.dtype))

    def reset_where(self, state: State, is_first: torch.Tensor, init: State | None = None
                    ) -> State:
        """Replace the state of rows with `is_first` by the initial state (zero action)."""
        init = init if init is not None else self.initial(is_first.shape[0])
        m = is_first.to(state.h.dtype)
        return State(
            state.h * (1 - m)[:, None] + init.h * m[:, None],
            state.z * (1 - m)[:, None, None] + init.z * m[:, None, None],
            state.action * (1 - m)[:, None],
        )

    def obs_step(self, state: State, embed: torch.Tensor, is_first: torch.Tensor | None,
                 init: State | None = None, w_h: torch.Tensor | None = None,
                 u: torch.Tensor | None = None) -> tuple[State, torch.Tensor]:
        """One filtering step: reset, h = f(h, z, a), z ~ q(z | h, embed). Returns the new state
        (its action slot still holds the previous action), and the posterior log-probs.
        `is_first=None` means no row starts an episode (the reset is skipped). With `w_h`,
        `embed` is the embedding's share W_e e of the posterior's first layer (`post_split`).
        `u` (N, G, 1): the sample's uniforms, if drawn beforehand."""
        if is_first is not None:
            state = self.reset_where(state, is_first, init)
        h = self.sequence(state.h, state.z, state.action)
        if w_h is None:
            embed, w_h = self.post_split(embed)
        logp = self.post_logp_split(h, embed, w_h)
        return State(h, onehot_sample(logp, u=u), state.action), logp

    # ------------------------------------------------------------------ sequences

    def observe(self, embed: torch.Tensor, action: torch.Tensor, is_first: torch.Tensor,
                state: State | None = None):
        """Filter a (B, T) batch. Without `state`, every row starts from the initial state.

        Returns h (B,T,D), z (B,T,G,K), posterior and prior log-probs (B,T,G,K), final state.
        """
        B, T = is_first.shape
        init = self.initial(B)  # computed once: the same for every reset in the batch
        if state is None:
            state = init
            if self.chunk:
                # train.compile: step 0 resets every row to `init`, so these values are
                # replaced there. They are laid out as the state one `filter` call hands the
                # next (h and z dense, z with gradient, the action a view of `action`), so
                # that all the chunks of a batch run one compiled graph.
                dense = torch.contiguous_format  # copies: `init` itself is passed too
                state = State(init.h.clone(memory_format=dense),
                              init.z.clone(memory_format=dense)
                              .requires_grad_(torch.is_grad_enabled()),
                              torch.zeros_like(action)[:, 0])
            is_first = is_first.clone()
            is_first[:, 0].fill_(True)
        # Skip the reset arithmetic at steps where no row starts an episode: that reads the
        # flags back to the host, free on CPU; on GPUs and in compiled steps (`skip_resets`
        # off) every step resets.
        resets = is_first.any(0).tolist() if self.skip_resets else None
        # The embedding's share of the posterior for all B·T steps in one matmul (`filter`
        # splits it into steps with one op).
        e_part, w_h = self.post_split(embed)
        noise = self.latent_noise(T, B, device=embed.device)
        n = self.chunk or T
        outs = []
        for i, (e, a, first, u) in enumerate(zip(e_part.split(n, 1), action.split(n, 1),
                                                 is_first.split(n, 1), noise.split(n))):
            state, out = self.filter(state, e, a, first, u, init, w_h,
                                     resets[i * n:(i + 1) * n] if resets else None)
            outs.append(out)
        h, z, post = (x[0] if len(x) == 1 else torch.cat(x, 1) for x in zip(*outs))
        prior = self.prior_logp(h)  # all priors in one batched call
        return h, z, post, prior, state

    chunk: int | None = None  # steps per `filter` call in `observe` (None: all T at once)

    def filter(self, state: State, e_part: torch.Tensor, action: torch.Tensor,
               is_first: torch.Tensor, noise: torch.Tensor, init: State, w_h: torch.Tensor,
               resets: list[bool] | None = None):
        """`observe`'s loop over n steps: e_part (B, n, U) is the embedding's share of the
        posterior, action and is_first (B, n), noise (n, B, G, 1) the samples' uniforms;
        `resets[t]` False skips step t's reset (None: reset arithmetic at every step). One
        function of fixed shapes, so `train.compile` compiles n steps, forward and backward,
        as one graph. Returns the last state and h (B,n,D), z (B,n,G,K), posteriors."""
        hs, zs, post = [], [], []
        for t, (e, a) in enumerate(zip(e_part.unbind(1), action.unbind(1))):
            first = is_first[:, t] if resets is None or resets[t] else None
            state, logp = self.obs_step(state, e, first, init=init, w_h=w_h, u=noise[t])
            hs.append(state.h)
            zs.append(state.z)
            post.append(logp)
            state = State(state.h, state.z, a)
        return state, (torch.stack(hs, 1), torch.stack(zs, 1), torch.stack(post, 1))

    def latent_noise(self, *shape: int, device=None) -> torch.Tensor:
        """The uniforms (*shape, G, 1) of the latent samples of (*shape) rows, drawn in
        advance (as `Actor.noise` for the actions)."""
        return torch.rand(*shape, self.G, 1, device=device, dtype=torch.float32)

    def img_step(self, h: torch.Tensor, z: torch.Tensor, action: torch.Tensor,
                 u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One imagined step without gradients: h' = f(h, z, a), z' ~ p(z | h') from the
        uniforms u (N, G, 1), sampled from the probabilities (no log-probs needed); z' as
        class indices if z is, else one-hot."""
        h = self.sequence(h, z, action)
        idx = unimix_index(self.prior_logits(h), self.unimix, u)
        return h, (idx if not z.is_floating_point() else one_hot(idx, self.K, h.dtype))

    def imagine(self, policy, h: torch.Tensor, z: torch.Tensor, horizon: int,
                noise: torch.Tensor | None = None):
        """Roll the prior forward `horizon` steps from N start states with `policy(feat) ->
        action`, with straight-through samples so that gradients can flow through the
        dynamics (continuous actions, `continuous_grad=dynamics`; REINFORCE uses
        `imagine_no_grad`). `noise` (H, N, G, 1): the latents' uniforms, drawn beforehand
        (`latent_noise`); the same uniforms and actions give `imagine_no_grad`'s latents. Returns feats (H+1, N, F) of steps
        0..H and actions (H, N, A) of steps 0..H-1."""
        feats, actions = [self.feat(h, z)], []
        for t in range(horizon):
            a = policy(feats[-1])
            actions.append(a)
            h = self.sequence(h, z, a)
            z = onehot_sample(self.prior_logp(h), u=None if noise is None else noise[t])
            feats.append(self.feat(h, z))
        return torch.stack(feats), torch.stack(actions)

    def imagine_no_grad(self, actor, h: torch.Tensor, z: torch.Tensor, horizon: int,
                        gather: bool = False):
        """`imagine` without gradients with `actor` as the policy (REINFORCE): the random
        numbers of all H steps are drawn first, then `rollout` runs the steps, one function
        of fixed shapes (`train.compile` compiles the whole rollout as one graph). Returns
        feats (H+1, N, F) and actions (H, N, A) like `imagine`.

        `gather`: z is kept as class indices and the feats are a `OneHotCat`, so every layer
        over [h, z] or [z, a] gathers instead of multiplying by one-hots. The samples and the
        function are the same as the dense path's."""
        N = h.shape[0]
        if gather:
            z = z.argmax(-1)  # exact: the start states are detached one-hots
        act_noise = actor.noise(horizon, N, device=h.device)
        lat_noise = self.latent_noise(horizon, N, device=h.device)
        hs, zs, actions = self.rollout(actor, h, z, act_noise, lat_noise)
        return self.feat(hs, zs), actions

    def rollout(self, actor, h: torch.Tensor, z: torch.Tensor, act_noise: torch.Tensor,
                lat_noise: torch.Tensor):
        """`imagine_no_grad`'s loop: h (H+1, N, D), z (H+1, N, G[, K]) and actions (H, N, A)."""
        hs, zs, actions = [h], [z], []
        for a_u, z_u in zip(act_noise.unbind(0), lat_noise.unbind(0)):
            a = actor.sample(actor.params(self.feat(h, z)), a_u)
            h, z = self.img_step(h, z, a, z_u)
            hs.append(h)
            zs.append(z)
            actions.append(a)
        return torch.stack(hs), torch.stack(zs), torch.stack(actions)

    @torch.no_grad()
    def dream(self, obs: dict[str, torch.Tensor], action: torch.Tensor, is_first: torch.Tensor,
              context: int, horizon: int, sample: bool = False) -> dict[str, torch.Tensor]:
        """The open-loop rollout that videos show (`lucid.video.open_loop`), on (B, T)
        windows: steps 0..context-1 filter the real observations (`observe`, each row from
        the initial state); steps context..context+horizon-1 run the prior alone, driven by
        the recorded actions: h[t] = f(h[t-1], z[t-1], a[t-1]), z[t] the mode (or a sample)
        of p(z | h[t]). Returns each key's decoded prediction (B, context + horizon, ...) in
        observation space (`Decoder.observation`)."""
        embed = self.encoder({k: v[:, :context] for k, v in obs.items()})
        h, z, _, _, _ = self.observe(embed, action[:, :context], is_first[:, :context])
        feats = [self.feat(h, z)]
        h_t, z_t = h[:, -1], z[:, -1]
        pick = onehot_sample if sample else onehot_mode
        prior = []
        for t in range(context, context + horizon):
            h_t = self.sequence(h_t, z_t, action[:, t - 1])
            z_t = pick(self.prior_logp(h_t))
            prior.append(self.feat(h_t, z_t))
        if prior:
            feats.append(torch.stack(prior, 1))
        return self.decoder.observation(self.decoder(torch.cat(feats, 1)))

    # ------------------------------------------------------------------ loss

    def loss(self, batch: dict, tcfg: TrainConfig, state: State | None = None):
        """World-model loss (eq. 4): L_pred + dyn_scale * L_dyn + rep_scale * L_rep, each KL
        clipped below at `free_nats` (or at its own `dyn_free_nats` / `rep_free_nats`),
        averaged over B and T; L_pred weighs the decoder, reward and continue terms by their
        scales (1 each in the paper). Returns the loss, its
        metrics (0-d tensors, logged as they are named) and the tensors a subclass adding a
        term may need: h, z, feat = [h, z], recon, the embeddings and the last state."""
        obs = batch["obs"]
        embed = self.encoder(obs)
        h, z, post, prior, last = self.observe(embed, batch["action"], batch["is_first"], state)
        feat = self.feat(h, z)
        recon = self.decoder(feat)
        l_dec = self.decoder.loss(recon, obs)
        l_rew = self.twohot.loss(self.reward(feat), batch["reward"].float())
        cont_target = 1.0 - batch["is_terminal"].float()
        l_con = F.binary_cross_entropy_with_logits(
            fp32(self.cont(feat).squeeze(-1)), cont_target, reduction="none")
        kl_dyn = categorical_kl(post.detach(), prior)
        kl_rep = categorical_kl(post, prior.detach())
        free_dyn, free_rep = (tcfg.free_nats if f is None else f
                              for f in (tcfg.dyn_free_nats, tcfg.rep_free_nats))
        l_dyn = kl_dyn.clamp(min=free_dyn)
        l_rep = kl_rep.clamp(min=free_rep)
        l_pred = tcfg.decoder_scale * l_dec + tcfg.reward_scale * l_rew + tcfg.cont_scale * l_con
        total = (l_pred + tcfg.dyn_scale * l_dyn + tcfg.rep_scale * l_rep).mean()
        metrics = {
            "world_model/loss": total,
            "world_model/decoder": l_dec.mean(),
            "world_model/reward": l_rew.mean(),
            "world_model/continue": l_con.mean(),
            "world_model/dyn": l_dyn.mean(),
            "world_model/rep": l_rep.mean(),
            "world_model/kl": kl_dyn.mean(),
            "world_model/post_entropy": categorical_entropy(post).sum(-1).mean(),
            "world_model/prior_entropy": categorical_entropy(prior).sum(-1).mean(),
        }
        out = {"h": h, "z": z, "feat": feat, "recon": recon, "last": last, "embed": embed}
        return total, metrics, out
