"""Several seeds for the price of one: K agents of the same spaces and config, each with its own
parameters, optimizers, return normalizer and slow critic, updated as one batched computation.

Every parameter and buffer of the K agents is stored once, stacked along a leading seed axis,
and each agent's own tensors are views of its row (`Parameter.data` set to the row), so an
agent acts, saves and loads as an ordinary single-seed agent. The update runs the agent's own
steps (`Agent._update`'s named steps, the same code) under `torch.func.vmap` over the stacked
parameters through `torch.func.functional_call`: each matrix product of one seed becomes one
batched product of K, and the number of kernels stays that of one seed. The losses of the K
seeds are summed for one backward pass (their parameters are disjoint, so each seed's gradient
is that of its own loss); then each agent clips and steps its own gradients with its own
optimizer, so clipping (global norm per seed), non-finite skips and the slow critic's update
are per seed, as K separate runs would have them.

An agent whose update is one loss and one optimizer (the Nature recipe's: `loss(batch)`, then
`apply(loss, latents)` after the backward pass) is batched the same way: its `loss` under vmap,
one backward pass of the K losses' sum, then each agent's own `apply`.

The batched update reads nothing back to the host, so under train.cuda_graph it is captured
whole as one CUDA graph (lucid.graph), as one agent's is.

Why vmap, not layers written with a seed axis: it batches lucid's networks and any custom
network of `model.agent` without a second implementation of each; the steps' maths is the
single-seed code (tests/test_batched.py compares the two update by update).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.func import functional_call, vmap

from .agent import Agent, Imagined
from .behavior import actor_loss
from .graph import graphed_or_eager
from .ops.onehot import OneHotCat


class _Holder(nn.Module):
    """One agent's modules under one root, so that one `functional_call` swaps them all; its
    forward calls the function it is given (an update step of that agent)."""

    def __init__(self, agent: Agent):
        super().__init__()
        self.parts = nn.ModuleDict(agent.modules())

    def forward(self, fn, *args):
        return fn(*args)


def _fields(im: Imagined) -> dict:
    """An Imagined's tensors by field name (vmap takes and returns tensors and containers of
    them): one-hot features kept as class indices (`OneHotCat`) as their two tensors."""
    out = {f.name: getattr(im, f.name) for f in dataclasses.fields(im)
           if getattr(im, f.name) is not None}
    if isinstance(im.feat, OneHotCat):
        out["feat"] = {"dense": im.feat.dense, "idx": im.feat.idx}
    return out


def _imagined(fields: dict, agent: Agent) -> Imagined:
    """`_fields` back as an Imagined of `agent`'s world model."""
    feat = fields["feat"]
    if isinstance(feat, dict):
        feat = OneHotCat(feat["dense"], feat["idx"], agent.wm.K, at=agent.wm.D)
    return Imagined(**{**fields, "feat": feat})


def stack_batches(batches: list[dict]) -> dict:
    """K batches (dicts of (B, T, ...) tensors, nested for observations) as one with a
    leading seed axis (K, B, T, ...)."""
    first = batches[0]
    return {k: stack_batches([b[k] for b in batches]) if isinstance(v, dict)
            else torch.stack([b[k] for b in batches]) for k, v in first.items()}


class BatchedAgents:
    """K agents trained as one batched update (`train(batch)` with a leading seed axis)."""

    def __init__(self, agents: list[Agent], randomness: str = "different",
                 vmap: bool | None = None):
        if len(agents) < 1:
            raise ValueError("BatchedAgents needs at least one agent")
        first = agents[0]
        def shapes(a: Agent) -> dict:  # the spaces and sizes, as the networks hold them
            return {n: t.shape for n, t in _Holder(a).state_dict().items()}
        for a in agents[1:]:
            if (type(a) is not type(first) or a.device != first.device
                    or a.config.model != first.config.model
                    or a.config.train != first.config.train or shapes(a) != shapes(first)):
                raise ValueError("the agents of one batched update need the same class, "
                                 "spaces, device, model and train settings")
        t = first.config.train
        self.agents = agents
        self.template = first
        # what lucid.graph needs of an agent: under train.cuda_graph the batched update is
        # captured whole at its first call (`train_step`)
        self.config, self.device, self._graph = first.config, first.device, None
        self._loads = _loads(agents)  # a seed loaded since the capture: capture again
        # `vmap`: the batched update, or (False) each agent's own update in turn. Null: the
        # device's choice (`batches_by_default`).
        self.vmap = batches_by_default(first.device, t) if vmap is None else vmap
        # train.compile with the batched update: each batched step (the vmap of one of the
        # agent's steps) is compiled as a whole, not the agent's own pieces.
        self.compiled = bool(t.compile) and self.vmap
        if self.vmap and isinstance(first, Agent):
            # vmap cannot branch on values read back to the host (the CPU's shortcut of
            # skipping the reset arithmetic at steps where no row starts an episode): the
            # same maths, unskipped; and it keeps one memory layout. A compiled agent's
            # `observe` feeds its compiled filter in chunks, code for its own graphs that
            # the batched step's compile need not trace: all T steps at once instead.
            first.wm.skip_resets = False
            first.wm.chunk = None
            if getattr(first.wm.encoder, "cnn", None) is not None:
                first.wm.encoder.cnn.channels_last = False
        # "different": each seed draws its own random numbers; "same": every seed draws the
        # numbers one agent would (all seeds then see the same noise).
        self.randomness = randomness
        self.holder = _Holder(first)
        holders = [_Holder(a) for a in agents]
        self.stacked: dict[str, torch.Tensor] = {}
        self.trained: dict[str, list[torch.Tensor]] = {}  # name -> the K agents' parameters
        for name, tensor in self.holder.state_dict(keep_vars=True).items():
            own = [h.state_dict(keep_vars=True)[name] for h in holders]
            stacked = torch.stack([x.detach() for x in own])
            for k, x in enumerate(own):
                x.data = stacked[k]  # a view: the agent's tensor is its row of the stack
            if isinstance(tensor, nn.Parameter) and tensor.requires_grad:
                stacked.requires_grad_(True)
                self.trained[name] = own
            self.stacked[name] = stacked
        if self.compiled:
            # The steps and the agent's compiled pieces share one code object each across
            # shapes and grad modes (as Agent.compile).
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                                       64)
            self._compiled = torch.compile(self._eager, dynamic=False)
        self._groups = {part: [n for n in self.trained if n.startswith(f"parts.{part}.")]
                        for part in ("world_model", "actor", "critic")}

    @property
    def k(self) -> int:
        return len(self.agents)

    # ------------------------------------------------------------------ the batched steps

    def _vmap(self, fn, *args, frozen: tuple[str, ...] = (), detach: bool = False):
        """`fn(*args)` of the template agent, batched over the seeds: the stacked parameters
        stand in for its own, and the args carry a leading seed axis. The parameters of the
        parts in `frozen` enter without gradient; with `detach`, the args too. Compiled,
        each call is one autograd node, whose saved tensors the first backward through any
        of its outputs frees: a step's args that its loss takes no gradient through are
        passed detached, and the one node two losses go through (imagination's: the actor's
        distributions, the critic's logits) is kept by the first backward (`_backward`)."""
        params = {n: s.detach() if any(n.startswith(f"parts.{p}.") for p in frozen) else s
                  for n, s in self.stacked.items()}
        if detach:
            args = _detached(args)
        return self._run(params, fn, *args)

    def _run(self, params: dict, fn, *args):
        if self.compiled:
            # the actor's backward keeps imagination's node for the critic's (retain_graph),
            # which a compiled backward allows only without donated buffers
            with torch._functorch.config.patch(donated_buffer=False):
                return self._compiled(params, fn, *args)
        return self._eager(params, fn, *args)

    def _eager(self, params: dict, fn, *args):
        def call(p, *a):
            return functional_call(self.holder, p, (fn, *a), strict=True)
        return vmap(call, randomness=self.randomness)(params, *args)

    def _backward(self, loss: torch.Tensor, keep: bool = False) -> None:
        """Backward of the K losses' sum into the stacked parameters. Inside vmap a module's
        parameters report no requires_grad, so `agent.frozen` cannot stop gradients there:
        a frozen part's gradient (the critic's, from the actor's values) is computed and
        dropped here, before the step that takes its own. `keep`: a later backward goes
        through the same compiled nodes (`_vmap`)."""
        for s in self.stacked.values():
            s.grad = None
        loss.sum().backward(retain_graph=keep and self.compiled)

    def _steps(self, part: str, loss: torch.Tensor, norm_name: str, metrics: dict,
               backward: bool = True, reported_loss: torch.Tensor | None = None,
               keep: bool = False):
        """Backward of the K losses' sum, then each agent clips and steps its own gradients
        (Agent._apply: global norm and non-finite skip per seed). Returns ok (K,)."""
        names = self._groups[part]
        if backward:
            self._backward(loss, keep)
        norms, oks = [], []
        reported = loss if reported_loss is None else reported_loss
        for k, agent in enumerate(self.agents):
            params = self._seed_grads(k, names)
            opt = agent.optimizers()[part]
            norm, ok = agent._apply(opt, reported[k], params, agent.clip(part))
            norms.append(norm)
            oks.append(ok)
        for n in names:
            self.stacked[n].grad = None
        metrics[norm_name] = torch.stack(norms)
        return torch.stack(oks)

    def _seed_grads(self, k: int, names: list[str]) -> list[torch.Tensor]:
        """Seed k's parameters `names`, each given its row of the stacked gradient."""
        params = []
        for n in names:
            p, g = self.trained[n][k], self.stacked[n].grad
            p.grad = None if g is None else g[k]
            params.append(p)
        return params

    def modules(self) -> dict[str, nn.Module]:
        return {f"{k}/{name}": m for k, a in enumerate(self.agents)
                for name, m in a.modules().items()}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {f"{k}/{name}": o for k, a in enumerate(self.agents)
                for name, o in a.optimizers().items()}

    def train_step(self, batch: dict) -> dict[str, torch.Tensor]:
        """One update of the K agents on a batch with a leading seed axis (`stack_batches`);
        metrics as (K,) tensors. Under train.cuda_graph the batched update is captured once
        and replayed (or, in turn, each agent's own graph)."""
        if not self.vmap:
            rows = [a.train_step(_row(batch, k)) for k, a in enumerate(self.agents)]
            return {name: torch.stack([r[name] for r in rows]) for name in rows[0]}
        loads = _loads(self.agents)
        if loads != self._loads:  # an agent's optimizer state was replaced by a load
            self._graph, self._loads = None, loads
        metrics = graphed_or_eager(self, batch)
        for agent in self.agents:
            agent.updates += 1
        return metrics

    def _update(self, batch: dict) -> dict[str, torch.Tensor]:
        """The batched update (what a graph captures): reads nothing back to the host."""
        if not isinstance(self.template, Agent):
            return self._one_loss_step(batch)
        tm, t = self.template, self.template.config.train
        joint = tm._joint
        def world_model_loss(batch):  # the posterior states' tensors (not the last State)
            loss, metrics, out = tm._world_model_loss(batch)
            return loss, metrics, {k: v for k, v in out.items() if torch.is_tensor(v)}
        wm_loss, metrics, out = self._vmap(world_model_loss, batch)
        if not joint:
            wm_ok = self._steps("world_model", wm_loss, "world_model/grad_norm", metrics)

        def imagine(out, batch):
            return _fields(tm._imagine(out, batch))
        im = _imagined(self._vmap(imagine, out, batch, frozen=("world_model",), detach=True),
                       tm)
        ret, weight, scale = self._vmap(lambda f: tm._returns(_imagined(f, tm)), _fields(im),
                                        frozen=("world_model",))

        def actor_step(im, ret, weight, scale):
            return actor_loss(tm.actor, im.dist, im.action, ret, im.value, weight, scale, t)
        a_loss, m = self._vmap(lambda *a: actor_step(_imagined(a[0], tm), *a[1:]),
                               _fields(im), ret, weight, scale, frozen=("world_model",))
        metrics.update(m)
        actor_ok = self._steps("actor", a_loss, "actor/grad_norm", metrics, keep=True)

        def critic_step(b, o, im, ret, weight):
            m = {}
            loss, r_loss = tm._critic_loss(b, o, _imagined(im, tm), ret, weight, m)
            return loss, r_loss if r_loss is not None else loss.new_zeros(()), m
        frozen = () if joint else ("world_model",)
        c_loss, r_loss, m = self._vmap(critic_step, batch, out if joint else _detached(out),
                                       _fields(im), ret.detach(), weight.detach(),
                                       frozen=frozen)
        metrics.update(m)
        if joint:
            self._backward(wm_loss + c_loss)
            wm_ok = self._steps("world_model", wm_loss, "world_model/grad_norm", metrics,
                                backward=False,
                                reported_loss=wm_loss.detach() + t.replay_value_scale
                                * r_loss.detach())
            critic_ok = self._steps("critic", c_loss, "critic/grad_norm", metrics,
                                    backward=False)
        else:
            critic_ok = self._steps("critic", c_loss, "critic/grad_norm", metrics)
        for k, agent in enumerate(self.agents):
            agent.critic.update_slow(t.slow_critic_fraction * critic_ok[k].float())
        metrics["train/nonfinite_steps"] = 3.0 - (wm_ok.float() + actor_ok.float()
                                                  + critic_ok.float())
        metrics.update(self._vmap(lambda f, r, s: tm._imagination_metrics(_imagined(f, tm), r, s),
                                  _fields(im), ret, scale, detach=True,
                                  frozen=("world_model", "actor", "critic")))
        return metrics

    def _one_loss_step(self, batch: dict) -> dict[str, torch.Tensor]:
        """The update of agents with one loss and one optimizer (`loss`, then `apply`)."""
        loss, metrics, latents = self._vmap(self.template.loss, batch)
        self._backward(loss)
        steps = []
        for k, agent in enumerate(self.agents):
            self._seed_grads(k, list(self.trained))
            steps.append(agent.apply(loss[k].detach(), tuple(x[k] for x in latents)))
        for s in self.stacked.values():
            s.grad = None
        metrics.update({name: torch.stack([st[name] for st in steps]) for name in steps[0]})
        return metrics

    def train(self, batch: dict) -> list[dict[str, float]]:
        """One update; each seed's metrics as floats."""
        metrics = self.train_step(batch)
        values = torch.stack([v.detach().float().reshape(self.k) for v in metrics.values()])
        rows = values.t().cpu().tolist()
        return [dict(zip(metrics.keys(), row)) for row in rows]


def batches_by_default(device: torch.device, t) -> bool:
    """Whether K seeds update as one batched computation (else one after another). On a GPU
    one seed's update leaves it mostly idle, so K batched cost little more than one. On a
    CPU the cores are busy already; batching still gains a little at small batches, and
    loses at large ones, whose batched tensors outgrow the allocator's cache
    (docs/scaling.md, benchmarks/seeds.py). Under train.cuda_graph the choice is the same:
    the batched update is captured as one graph, or each agent's own in turn."""
    return device.type == "cuda" or t.batch_size * t.batch_length <= 256


def _detached(tree):
    """Tensors, and dicts, lists and tuples of them, without gradient."""
    if torch.is_tensor(tree):
        return tree.detach()
    if isinstance(tree, dict):
        return {k: _detached(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_detached(v) for v in tree)
    return tree


def _row(batch: dict, k: int) -> dict:
    """Seed k's batch of a stacked one."""
    return {n: _row(v, k) if isinstance(v, dict) else v[k] for n, v in batch.items()}


def _loads(agents: list) -> list[int]:
    """Each agent's count of `load_state_dict` calls (0 for a class that keeps none)."""
    return [getattr(a, "loads", 0) for a in agents]
