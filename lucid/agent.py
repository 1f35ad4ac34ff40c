"""The DreamerV3 agent: world model, actor, critic, their three optimizers and one update.

`train(batch)` follows the paper's algorithm, one named step each (`Agent._update`): (1) the
world model's loss and step on the replayed (B, T) batch; (2) imagine H steps from every
posterior state with the actor and (3) predict their rewards, continues and values;
(4) λ-returns; (5) the actor's step and (6) the critic's. Each loss changes only its own
component's parameters, except that with `train.replay_value_grad` the replay value loss also
trains the world model, whose step then comes with the critic's (the authors' Nature code).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from .behavior import (Actor, Critic, ReturnNorm, actor_loss, critic_loss, episode_ends,
                       imagined_weights, lambda_return, replay_critic_loss, replay_lambda_return,
                       uses_reinforce)
from .config import Config, ConfigError, for_device
from .graph import GraphedUpdate, check_device, graphed_or_eager
from .nets import autocast, dense_for
from .plugins import import_attr
from .specs import ActionSpec, ObsSpec
from .warn import warn
from .world_model import State, WorldModel


@contextlib.contextmanager
def frozen(*modules: nn.Module):
    """Temporarily stop gradients into the parameters of `modules` (activations still carry
    gradients through them, as needed to backpropagate the actor loss through the dynamics)."""
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


@dataclass
class Imagined:
    """Imagined trajectories from every replayed state, time-major: features (H+1, N, F) of
    steps 0..H and actions (H, N, A) of steps 0..H-1; rewards, continues and values (H+1, N)
    in real space; the actor's distributions at steps 0..H-1; the critic's logits at steps
    0..H-1 and, where computed for the values, their softmax."""

    feat: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    cont: torch.Tensor
    value: torch.Tensor
    dist: list
    critic_logits: torch.Tensor
    critic_probs: torch.Tensor | None = None


def _adam(params, lr, eps, capturable=False):
    """Adam as one fused kernel per parameter group. The fused kernel also takes `found_inf`:
    when that tensor is non-zero it leaves parameters, moments and step count as they were,
    so a non-finite step is skipped on the device, without reading a value back."""
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=True, capturable=capturable)


# train.compile: observe steps per compiled graph. Longer chunks cut the per-call cost of the
# graphs' boundaries (forward and backward) and cost compile time (docs/performance.md).
COMPILE_CHUNK = 8


def _check_trained(opt, params: list, optimizers: dict) -> None:
    """A network replaced after Agent.__init__ would silently never train (its optimizer holds
    the old one's parameters): refuse it, naming the way that works. Each of `params` must be
    in `opt` (which may hold more: a subclass's extra parameter group)."""
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    if not {id(p) for p in params} <= held:
        name = next(k for k, o in optimizers.items() if o is opt)
        raise ConfigError(
            f"the {name}'s parameters are not the ones its optimizer was made over: a module "
            f"replaced after Agent.__init__ would never train. Return it from "
            f"Agent.build_{name} in a subclass "
            f"and name that in model.agent (docs/extending.md)")


def _key_difference(module: str, own: dict, theirs: dict, show: int = 3) -> str:
    """What a checkpoint's parameter names lack and hold beyond this agent's, a few of each."""
    def some(names):
        names = sorted(names)
        more = f" and {len(names) - show} more" if len(names) > show else ""
        return ", ".join(f"{module}.{n}" for n in names[:show]) + more
    missing, extra = own.keys() - theirs.keys(), theirs.keys() - own.keys()
    return "; ".join(([f"it lacks {some(missing)}"] if missing else [])
                     + ([f"it holds {some(extra)}, which this agent has not"] if extra else []))


def agent_class(config: Config) -> type:
    """The Agent class that `model.agent` names (lucid's own when it is empty)."""
    spec = config.model.agent
    if not spec:
        return Agent
    try:
        cls = import_attr(spec)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"model.agent={spec!r} cannot be loaded ({type(exc).__name__}: "
                          f"{exc}); give `module.path:Class` or `path/to/file.py:Class` of "
                          f"a subclass of lucid.agent.Agent") from None
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise ConfigError(f"model.agent={spec!r} is {cls!r}, not a subclass of "
                          f"lucid.agent.Agent")
    return cls


class Agent:
    """World model, actor and critic with their optimizers. To change a network, subclass
    and override `build_world_model`, `build_actor` or `build_critic`: they are called before
    the optimizers are made, so what they return is what trains. Name the subclass in
    `model.agent` (`module.path:Class` or `path/to/file.py:Class`), so that every process that
    builds the run's agent (evaluation, resume, Ray runners) builds the same (docs/extending.md)."""

    def __init__(self, obs_spec: ObsSpec, act_spec: ActionSpec, config: Config,
                 device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        # The settings left to the device (null), chosen for this one (a data-parallel
        # trainer chose them already: no graph there).
        self.config = config = for_device(config, self.device.type)
        self.obs_spec, self.act_spec = obs_spec, act_spec
        t = config.train
        check_device(t.cuda_graph, self.device)
        self.wm = self.build_world_model().to(self.device)
        if getattr(self.wm.encoder, "cnn", None) is not None:
            self.wm.encoder.cnn.channels_last = t.channels_last
        self.actor = self.build_actor().to(self.device)
        self.critic = self.build_critic()
        self.critic.copy_to_slow()
        self.critic.to(self.device)
        self.retnorm = ReturnNorm(t.return_norm_decay, t.return_norm_low, t.return_norm_high,
                                  t.return_norm_min_scale).to(self.device)
        # The update reads nothing back to the host (metrics stay tensors; non-finite steps
        # are skipped on the device). On CPU the RSSM skips the reset arithmetic at steps
        # where no row starts an episode, which needs the flags on the host: free there.
        self.wm.skip_resets = self.device.type == "cpu"
        for head in (self.wm.reward, self.critic.net, self.critic.slow):  # 255-bin heads
            head.pad_to = 8 if t.pad_bins else 0
        if t.cpp_kernels:
            warn("train.cpp_kernels has no effect any more (lucid has no C++ kernels of its "
                 "own); remove it from the config")
        graph = t.cuda_graph
        self.opt_wm = _adam(self.wm.parameters(), t.model_lr, t.model_eps, graph)
        self.opt_actor = _adam(self.actor.parameters(), t.actor_lr, t.actor_eps, graph)
        self.opt_critic = _adam(self.critic.net.parameters(), t.critic_lr, t.critic_eps, graph)
        self.updates = 0
        self._checked: set = set()  # optimizers whose parameters _step has compared
        self._graph: GraphedUpdate | None = None  # train.cuda_graph: captured at first update
        self.loads = 0  # load_state_dict calls (a graph captured before one is stale)
        # Data-parallel learners (lucid.distributed): `grad_sync(params, loss)` averages the
        # gradients and the loss over ranks between backward and clipping; `gather(x)` joins
        # a tensor over ranks (the return percentiles see the global batch). None = one process.
        self.grad_sync = None
        self.gather = None
        # The update's modes, fixed by the config and the action space: how the actor learns
        # (REINFORCE, or backprop through the dynamics), and whether the world model's step
        # waits for the replay value loss, whose gradient it then takes too.
        self._reinforce = uses_reinforce(act_spec, t)
        self._joint = t.replay_value_grad
        if t.compile:
            self.compile()

    def build_world_model(self) -> WorldModel:
        act = self.act_spec
        return WorldModel(self.obs_spec, act.dim, self.config.model,
                          box_from=None if act.is_discrete else act.n_discrete)

    def build_actor(self) -> Actor:
        return Actor(self.wm.feat_dim, self.act_spec, self.config.model)

    def build_critic(self) -> Critic:
        return Critic(self.wm.feat_dim, self.config.model)

    # ------------------------------------------------------------------ compilation

    def compile(self) -> None:
        """`train.compile`: torch.compile the loops' bodies as fixed-shape graphs
        (`dynamic=False`; one compile per shape and grad mode): `observe` runs its T steps
        as chunks of `COMPILE_CHUNK` steps through one compiled `filter` each (forward and
        backward, with the reset arithmetic at every step: no host-side branch inside a
        graph), and imagination without gradients (`imagine_no_grad`: REINFORCE) runs
        as one compiled `rollout` of all H steps (Box actions through the dynamics imagine
        eagerly, over the compiled networks); the batched
        prior, the two-hot means, the encoder, decoder, reward and continue heads, and the
        actor and critic networks are compiled as well. The random numbers are drawn in
        eager code and passed in, so compiled and eager updates draw the same samples.
        Losses' reductions and the optimizers stay eager. Nothing changes in the maths or in
        `state_dict` keys."""
        # The heads share one code object (Head.forward) and are called in ~10 variants
        # (module, shape, grad mode): past dynamo's default of 8 per code object, the rest
        # would silently run eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        wm = self.wm
        wm.chunk, wm.skip_resets = COMPILE_CHUNK, False
        # train.cpp_wrapper: C++ instead of Python between a graph's kernels (CPU only).
        cpp_wrapper = self.config.train.cpp_wrapper and self.device.type == "cpu"
        opts = {"dynamic": False, "options": {"cpp_wrapper": cpp_wrapper}}
        for name in ("filter", "rollout", "img_step", "prior_logp"):  # -> compiled
            setattr(wm, name, torch.compile(getattr(wm, name), **opts))
        for m in (wm.encoder, wm.decoder, wm.reward, wm.cont, self.actor.head,
                  self.critic.net, self.critic.slow):
            m.compile(**opts)  # in place: parameters and their names are unchanged
        for twohot in (wm.twohot, self.critic.twohot):  # softmax and sum in one pass
            twohot.bins(torch.empty(0, device=self.device))  # cached now, not in a graph
            twohot.mean = torch.compile(twohot.mean, **opts)
            twohot.mean_of = torch.compile(twohot.mean_of, **opts)


    # ------------------------------------------------------------------ precision

    def autocast(self):
        """`train.precision=bf16`: torch.autocast(bf16) for the forward passes of an update
        (world-model loss, imagination, actor and critic heads); backward passes and optimizer
        steps run outside it. Autocast runs matmuls and convolutions in bf16; the code keeps
        the rest fp32 explicitly (nets.LayerNorm, `.float()` before every distribution and
        loss), so λ-returns, return normalization and parameters never see bf16. Acting
        (`policy`) stays fp32. fp32: a no-op context."""
        return autocast(self.config.train.precision, self.device)

    # ------------------------------------------------------------------ acting

    @torch.no_grad()
    def policy(self, obs: dict[str, torch.Tensor], state: State | None = None,
               explore: bool = True, is_first: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, State]:
        """One step for a batch of N environments. `obs` holds the observation keys (N, ...);
        rows with `is_first` (N,) start from the initial state, as all do with state=None.
        Returns model-space actions (N, A) and the next state."""
        return self._act(self.actor, obs, state, explore, is_first)

    @torch.no_grad()
    def initial(self, n: int) -> State:
        """The recurrent state of n rows at an episode's start."""
        return self.wm.initial(n)

    @torch.no_grad()
    def dream(self, obs: dict[str, torch.Tensor], action: torch.Tensor, is_first: torch.Tensor,
              context: int, horizon: int, sample: bool = False) -> dict[str, torch.Tensor]:
        """The world model's open-loop rollout (`WorldModel.dream`), for `lucid dream`."""
        return self.wm.dream(obs, action, is_first, context, horizon, sample)

    def acting(self, env_steps: int):
        """What acts in the training envs after `env_steps` steps: an object with `device` and
        `policy` (this agent; an exploring agent's explorer while it explores)."""
        return self

    @torch.no_grad()
    def _act(self, actor: Actor, obs: dict[str, torch.Tensor], state: State | None,
             explore: bool, is_first: torch.Tensor | None) -> tuple[torch.Tensor, State]:
        """`policy` with `actor`, one of the actors that share this world model."""
        n = next(iter(obs.values())).shape[0]
        if state is None:
            state = self.wm.initial(n)
            is_first = torch.ones(n, dtype=torch.bool, device=self.device)
        elif is_first is None:
            is_first = torch.zeros(n, dtype=torch.bool, device=self.device)
        embed = self.wm.encoder(obs)
        state, _ = self.wm.obs_step(state, embed, is_first.to(self.device))
        action = actor(self.wm.feat(state.h, state.z), explore=explore)
        return action, State(state.h, state.z, action)

    # ------------------------------------------------------------------ learning

    def _step(self, opt: torch.optim.Optimizer, loss: torch.Tensor, params, clip: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Backward, clip and step. A non-finite loss or gradient skips the step on the device
        (fused Adam's `found_inf`: parameters, moments and step count stay as they were).
        Returns the gradient norm before clipping and whether the step was taken (0-d bool)."""
        params = list(params)
        self._zero(opt, params)
        loss.backward()
        return self._apply(opt, loss, params, clip)

    def _zero(self, opt: torch.optim.Optimizer, params: list) -> None:
        opt.zero_grad(set_to_none=True)
        if opt not in self._checked:
            _check_trained(opt, params, self.optimizers())
            self._checked.add(opt)

    def clip(self, part: str) -> float:
        """The gradient-norm clip of a component (a key of `optimizers`)."""
        t = self.config.train
        return {"world_model": t.model_clip, "actor": t.actor_clip, "critic": t.critic_clip}[part]

    def _apply(self, opt: torch.optim.Optimizer, loss: torch.Tensor, params: list, clip: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Clip and step `params` on the gradients they hold; `loss` is the one they are of."""
        if self.grad_sync is not None:  # same averaged gradients (and decision) on every rank
            loss = self.grad_sync(params, loss.detach())
        norm = torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
        ok = torch.isfinite(norm) & torch.isfinite(loss.detach())
        opt.found_inf = (~ok).float()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return norm, ok

    def train_step(self, batch: dict) -> dict[str, torch.Tensor]:
        """One update of all three components; returns metrics as 0-d tensors (no syncs).
        With `train.cuda_graph` the update is captured once and replayed."""
        out = graphed_or_eager(self, batch)
        self.updates += 1
        return out

    # The update's steps, in the paper's order (docs/architecture.md, "One update"). Each
    # loss changes only its own component's parameters, except the replay value loss under
    # `train.replay_value_grad`, which the world model's step then waits for.

    def _update(self, batch: dict) -> dict[str, torch.Tensor]:
        wm_loss, metrics, out = self._world_model_loss(batch)
        if not self._joint:
            wm_ok = self._world_model_step(wm_loss, metrics)
        im = self._imagine(out, batch)
        ret, weight, scale = self._returns(im)
        actor_ok = self._actor_step(im, ret, weight, scale, metrics)
        c_loss, r_loss = self._critic_loss(batch, out, im, ret, weight, metrics)
        if self._joint:
            wm_ok, critic_ok = self._joint_step(wm_loss, c_loss, r_loss, metrics)
        else:
            critic_ok = self._critic_step(c_loss, metrics)
        # A skipped critic step leaves its slow copy as it was too.
        self.critic.update_slow(self.config.train.slow_critic_fraction * critic_ok.float())
        metrics["train/nonfinite_steps"] = 3.0 - (wm_ok.float() + actor_ok.float()
                                                  + critic_ok.float())
        metrics.update(self._imagination_metrics(im, ret, scale))
        self._more(batch, out, metrics)
        return metrics

    def _more(self, batch: dict, out: dict, metrics: dict) -> None:
        """Learners a subclass adds on the same posterior states, after the task's steps
        (curiosity: lucid.explore_agent); they add their skipped steps to
        `train/nonfinite_steps`."""

    def _world_model_loss(self, batch: dict):
        """1. The world-model loss (eq. 4) on the replayed (B, T) batch, its metrics and the
        posterior states (`WorldModel.loss`)."""
        with self.autocast():
            return self.wm.loss(batch, self.config.train)

    def _world_model_step(self, loss: torch.Tensor, metrics: dict) -> torch.Tensor:
        metrics["world_model/grad_norm"], ok = self._step(self.opt_wm, loss,
                                                          self.wm.parameters(),
                                                          self.clip("world_model"))
        return ok

    def _imagine(self, out: dict, batch: dict, actor: Actor | None = None,
                 critic: Critic | None = None) -> Imagined:
        """2.-3. Imagine H steps from every posterior state (start states carry no gradient)
        with the world model frozen, and predict their rewards, continues and values.
        Step 0's continue is known from the replay. `actor` and `critic`: another pair than the
        task's (an explorer's) on the same world model."""
        h, z, start_cont = self._starts(out, batch)
        if self._reinforce:
            return self._imagine_reinforce(h, z, start_cont, actor, critic)
        return self._imagine_through_dynamics(h, z, start_cont, actor, critic)

    def _starts(self, out: dict, batch: dict):
        """Imagination's start states, every replayed posterior state (no gradient), and
        their continue flags, known from the replay."""
        wm = self.wm
        h = out["h"].detach().reshape(-1, wm.D)
        z = out["z"].detach().reshape(-1, wm.G, wm.K)
        return h, z, 1.0 - batch["is_terminal"].reshape(-1).float()

    def _imagine_reinforce(self, h: torch.Tensor, z: torch.Tensor, start_cont: torch.Tensor,
                           actor: Actor | None = None, critic: Critic | None = None
                           ) -> Imagined:
        """REINFORCE: imagination needs no gradient (`WorldModel.imagine_no_grad`). The
        actor's distributions at steps 0..H-1 (the same function of the same states that
        chose the actions) and the critic's logits are then computed in one batched call
        each; step H's value carries no gradient, and one softmax of the critic's logits
        serves its values and its loss."""
        t, actor, critic = self.config.train, actor or self.actor, critic or self.critic
        with self.autocast():  # heads' outputs are fp32 (cast before the two-hot means)
            with frozen(self.wm), torch.no_grad():
                feat, action = self.wm.imagine_no_grad(actor, h, z, t.horizon,
                                                       gather=t.onehot_gather)
                reward, cont = self._predict(feat, start_cont)
            dist = actor.params(feat[:-1])
            critic_logits = critic(feat[:-1])  # for the critic loss
            with torch.no_grad():
                probs, critic_value = critic.twohot.probs_and_mean(critic_logits)
                value = torch.cat([critic_value, critic.value(feat[-1:])])
        return Imagined(feat, action, reward, cont, value, dist, critic_logits, probs)

    def _imagine_through_dynamics(self, h: torch.Tensor, z: torch.Tensor,
                                  start_cont: torch.Tensor, actor: Actor | None = None,
                                  critic: Critic | None = None) -> Imagined:
        """Backprop through the dynamics: the actor sees sg(feat) and its reparameterised
        actions carry the gradient through the frozen world model and critic; its
        distributions are kept step by step."""
        t, actor, critic = self.config.train, actor or self.actor, critic or self.critic
        dists = []

        def policy(f):
            with torch.enable_grad():
                p = actor.params(f.detach())
                a = actor.sample(p)
            dists.append(p)
            return a

        with self.autocast():
            with frozen(self.wm), torch.enable_grad():
                feat, action = self.wm.imagine(policy, h, z, t.horizon)
                reward, cont = self._predict(feat, start_cont)
            critic_logits = critic(feat[:-1].detach())  # for the critic loss
            with frozen(critic):  # values pass gradients to the imagined states
                value = critic.value(feat)
        return Imagined(feat, action, reward, cont, value, actor.stack(dists), critic_logits)

    def _predict(self, feat, start_cont: torch.Tensor):
        """Imagined rewards (the two-hot mean) and continues (the mode) of steps 1..H, after
        step 0's: its reward is never used, its continue comes from the replay."""
        wm = self.wm
        reward = wm.twohot.mean(wm.reward(dense_for(wm.reward, feat[1:])))
        reward = torch.cat([torch.zeros_like(reward[:1]), reward], 0)
        cont = (wm.cont(dense_for(wm.cont, feat[1:])).squeeze(-1) > 0).float()
        return reward, torch.cat([start_cont[None], cont], 0)

    def _returns(self, im: Imagined):
        """4. λ-returns (real space, fp32: outside autocast), the loss weights of the imagined
        steps, and the return scale max(1, S) after this batch's percentiles (over all ranks'
        returns in data-parallel runs)."""
        t = self.config.train
        ret = lambda_return(im.reward, im.cont, im.value, t.gamma, t.lam)
        weight = imagined_weights(im.cont, t.gamma).detach()
        self.retnorm.update(ret if self.gather is None else self.gather(ret.detach()))
        return ret, weight, self.retnorm.scale()

    def _actor_step(self, im: Imagined, ret, weight, scale, metrics: dict) -> torch.Tensor:
        """5. The actor (eq. 11): gradients reach only its parameters."""
        t = self.config.train
        loss, m = actor_loss(self.actor, im.dist, im.action, ret, im.value, weight, scale, t)
        metrics.update(m)
        metrics["actor/grad_norm"], ok = self._step(self.opt_actor, loss,
                                                    self.actor.parameters(), self.clip("actor"))
        return ok

    def _critic_loss(self, batch: dict, out: dict, im: Imagined, ret, weight, metrics: dict):
        """6. The critic's loss on detached imagined states, plus (Nature recipe,
        `train.replay_value_scale`) the replay value loss, also returned on its own."""
        t = self.config.train
        with self.autocast():  # the slow critic's forward pass; the loss itself is fp32
            loss, m = critic_loss(self.critic, im.critic_logits, im.feat[:-1], ret, weight, t,
                                  im.critic_probs)
            r_loss = None
            if t.replay_value_scale > 0:
                r_loss, r_metrics = self._replay_value_loss(batch, out, ret)
                loss = loss + t.replay_value_scale * r_loss
                m.update(r_metrics)
        metrics.update(m)
        return loss, r_loss

    def _replay_value_loss(self, batch: dict, out: dict, ret: torch.Tensor):
        """The critic at the replayed states toward λ-returns of the replayed rewards,
        bootstrapped from the imagined return of each replayed state."""
        t = self.config.train
        B, T = batch["reward"].shape
        ends = episode_ends(batch["is_last"], batch["is_first"])
        rep_ret = replay_lambda_return(batch["reward"].float(), ends, batch["is_terminal"],
                                       ret[0].detach().reshape(B, T), t.gamma, t.lam)
        return replay_critic_loss(self.critic, out["feat"], rep_ret, ends, t, grad=self._joint)

    def _critic_step(self, loss: torch.Tensor, metrics: dict) -> torch.Tensor:
        metrics["critic/grad_norm"], ok = self._step(self.opt_critic, loss,
                                                     self.critic.net.parameters(),
                                                     self.clip("critic"))
        return ok

    def _joint_step(self, wm_loss, c_loss, r_loss, metrics: dict):
        """`train.replay_value_grad`: one backward pass of both losses, so the world model's
        gradient is of L_wm + scale·L_replay; both steps then see the parameters as they
        were before the update, as with the authors' single optimizer."""
        t = self.config.train
        wm_params = list(self.wm.parameters())
        critic_params = list(self.critic.net.parameters())
        self._zero(self.opt_wm, wm_params)
        self._zero(self.opt_critic, critic_params)
        (wm_loss + c_loss).backward()
        metrics["world_model/grad_norm"], wm_ok = self._apply(
            self.opt_wm, wm_loss.detach() + t.replay_value_scale * r_loss.detach(),
            wm_params, self.clip("world_model"))
        metrics["critic/grad_norm"], critic_ok = self._apply(
            self.opt_critic, c_loss, critic_params, self.clip("critic"))
        return wm_ok, critic_ok

    def _imagination_metrics(self, im: Imagined, ret, scale) -> dict[str, torch.Tensor]:
        ret_d = ret.detach()
        return {
            "actor/return_low": self.retnorm.low.clone(),
            "actor/return_high": self.retnorm.high.clone(),
            "actor/return_scale": scale.detach(),
            "critic/return_mean": ret_d.mean(),
            "critic/value_mean": im.value[:-1].detach().mean(),
            "world_model/imagined_reward_mean": im.reward[1:].detach().mean(),
            "world_model/imagined_continue_mean": im.cont.mean(),
        }

    def train(self, batch: dict) -> dict[str, float]:
        metrics = self.train_step(batch)
        values = torch.stack([v.detach().float() for v in metrics.values()]).cpu().tolist()
        return dict(zip(metrics.keys(), values))

    # ------------------------------------------------------------------ persistence

    def modules(self) -> dict[str, nn.Module]:
        return {"world_model": self.wm, "actor": self.actor, "critic": self.critic,
                "return_norm": self.retnorm}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"world_model": self.opt_wm, "actor": self.opt_actor, "critic": self.opt_critic}

    def check_optimizers(self) -> None:
        """Refuse a network assigned after the optimizers were made (`agent.actor.head =
        ...`, in a subclass's __init__ or on an agent at hand), before a run starts: each
        network's parameters must be in its optimizer (as the first update checks those it
        steps)."""
        for opt, net in ((self.opt_wm, self.wm), (self.opt_actor, self.actor),
                         (self.opt_critic, self.critic.net)):
            _check_trained(opt, list(net.parameters()), self.optimizers())

    def state_dict(self) -> dict:
        return {
            "modules": {k: m.state_dict() for k, m in self.modules().items()},
            "optimizers": {k: o.state_dict() for k, o in self.optimizers().items()},
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        for k, m in self.modules().items():
            own, theirs = m.state_dict(), state["modules"][k]
            if k == "return_norm":  # older checkpoints saved the percentiles as state
                theirs = {n: v for n, v in theirs.items() if n != "q"}
            if own.keys() != theirs.keys():
                raise ValueError(f"checkpoint does not match this agent's {k}: "
                                 f"{_key_difference(k, own, theirs)}; it was saved by another "
                                 f"model configuration, or by other networks than the ones "
                                 f"this agent builds (model.agent="
                                 f"{self.config.model.agent or 'lucid.agent:Agent'})")
            for name, tensor in own.items():
                if theirs[name].shape != tensor.shape:
                    raise ValueError(
                        f"checkpoint does not match this agent: {k}.{name} has shape "
                        f"{tuple(theirs[name].shape)} there but {tuple(tensor.shape)} here "
                        f"({_follows(k, name)}); use the same model size and "
                        f"observation/action spaces" + (
                            f", and networks of model.agent={self.config.model.agent} as "
                            f"they were when it was saved" if self.config.model.agent
                            else ""))
            m.load_state_dict(theirs)
        for k, o in self.optimizers().items():
            o.load_state_dict(state["optimizers"][k])
            # The settings are this config's, not the saved run's (which load_state_dict
            # restores): a learning rate edited in config.yaml, capturable Adam for a graph.
            for group in o.param_groups:
                group.update({key: v for key, v in o.defaults.items() if key in group})
        self.updates = int(state.get("updates", 0))
        self._graph = None  # optimizer state tensors were replaced: capture again
        self.loads += 1

    def num_params(self) -> dict[str, int]:
        count = lambda m: sum(p.numel() for p in m.parameters() if p.requires_grad)  # noqa: E731
        return {"world_model": count(self.wm), "actor": count(self.actor),
                "critic": count(self.critic.net)}


def _follows(module: str, name: str) -> str:
    """What a parameter's shape follows, for a checkpoint that does not fit."""
    if "encoder" in name or "decoder" in name:
        return "its size follows the observation space"
    if name.startswith("post_mlp"):  # the encoder's output (image sizes) and h
        return "its size follows the observation space and the model size"
    if module == "actor" or name.startswith("seq_in"):  # the RSSM's input: z and the action
        return "its size follows the action space and the model size"
    return "its size follows the model size"
