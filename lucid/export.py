"""A trained policy as one ONNX graph per step, runnable without torch or lucid.

`export_onnx(agent, obs_spec, act_spec, out)` writes `out` (e.g. policy.onnx) and, beside it,
`out` with `.json` (the spaces, input and output names, state shapes, the recipe and lucid's
version). One call of the graph is one step of `Dreamer.predict(obs, state,
deterministic=True)` for a batch of N envs (N free):

    inputs   obs.<key>   each observation leaf as the env gives it (its dtype and shape, with
                         a batch axis; Dict/Tuple leaves by their path joined with "/")
             h, z, action   the recurrent state a previous call returned (zeros with
                         is_first=true at an episode's start)
             is_first    (N,) bool: the episode starts at this observation (as after a reset)
             u           (N, G, 1) float32 uniforms in [0, 1): the posterior latent's sample
                         (lucid's predict draws them with torch.rand)
    outputs  act.<leaf>  the env action of each action leaf (Discrete and MultiDiscrete as
                         int64 with the space's start added, Box as float32 within its
                         bounds); "act" for a space that is not a Dict/Tuple
             h_next, z_next, action_next   the state to pass to the next call

The observation preprocessing (one-hot of discrete leaves, casts, image scaling) and the
action postprocessing (argmax per categorical, Box rescaling into the bounds) are inside the
graph, so a consumer feeds raw observations and gets env-ready actions
(examples/run_exported.py: onnxruntime and numpy only). Greedy actions, or with
`sampled` samples of the actor from one more input, `noise` (N, groups, 1) uniforms of its
categoricals, (N, A) normals of its Box dimensions, or both side by side (N, groups + A).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .nature_agent import NatureAgent, NatureState
from .specs import ActionSpec, ObsSpec
from .world_model import State

OPSET = 18


def _name(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if key else prefix


class PolicyStep(nn.Module):
    """One greedy policy step from raw observations to env actions (see the module's text)."""

    def __init__(self, agent, obs_spec: ObsSpec, act_spec: ActionSpec, sampled: bool = False):
        super().__init__()
        self.agent, self.obs_spec, self.act_spec = agent, obs_spec, act_spec
        self.keys, self.sampled = obs_spec.keys(), sampled

    def _model_obs(self, raw: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """What `ObsSpec.convert` makes of the env's leaves, as tensor operations."""
        spec, out = self.obs_spec, {}
        for key, x in zip(self.keys, raw):
            n = x.shape[0]
            if key in spec.images:
                if x.dtype != torch.uint8:
                    scaled = x.float() * spec.image_scale.get(key, 1.0)
                    x = torch.round(scaled.clamp(0, 255)).to(torch.uint8)
                out[key] = x
            elif key in spec.discrete:
                nvec = spec.discrete[key]
                start = torch.as_tensor(spec.discrete_start[key], dtype=torch.int64)
                idx = x.reshape(n, len(nvec)).to(torch.int64) - start
                out[key] = torch.cat([(idx[:, j:j + 1] == torch.arange(k)).float()
                                      for j, k in enumerate(nvec)], -1)
            else:
                out[key] = x.reshape(n, -1).float()
        return out

    def _env_action(self, part: ActionSpec, a: torch.Tensor) -> torch.Tensor:
        """What `ActionSpec.to_env` makes of one flat (non-Dict) leaf's model action."""
        n = a.shape[0]
        if part.discrete:
            blocks = torch.split(a, list(part.discrete), -1)
            idx = torch.stack([b.argmax(-1) for b in blocks], -1)
            if part.start is not None:
                idx = idx + torch.as_tensor(np.asarray(part.start).ravel(), dtype=torch.int64)
            return idx[:, 0] if not part.shape else idx.reshape(n, *part.shape)
        low = torch.as_tensor(part.low, dtype=torch.float32)
        high = torch.as_tensor(part.high, dtype=torch.float32)
        a = a.clamp(-1.0, 1.0)
        finite = torch.isfinite(low) & torch.isfinite(high)
        span = torch.where(finite, high - low, torch.zeros_like(low))
        scaled = torch.where(finite, torch.where(finite, low, 0.0) + (a + 1.0) / 2.0 * span, a)
        scaled = torch.minimum(torch.maximum(scaled, low), high)
        if part.int_bounds is not None:
            scaled = torch.round(scaled)
        return scaled.reshape(n, *part.shape)

    def forward(self, *inputs: torch.Tensor):
        k = len(self.keys)
        raw, (h, z, action, is_first, u), noise = inputs[:k], inputs[k:k + 5], inputs[k + 5:]
        agent, obs = self.agent, self._model_obs(list(raw))
        if isinstance(agent, NatureAgent):
            state, _ = agent.obs_step(NatureState(h, z, action), agent.wm.encoder(obs),
                                      is_first, u=u)
            model_action = agent.sample_action(agent.feat(state.h, state.z), self.sampled,
                                               noise[0] if self.sampled else None)
        else:
            wm, actor = agent.wm, agent.actor
            state, _ = wm.obs_step(State(h, z, action), wm.encoder(obs), is_first, u=u)
            params = actor.params(wm.feat(state.h, state.z))
            model_action = actor.sample(params, noise[0]) if self.sampled \
                else actor.mode(params)
        spec = self.act_spec
        if spec.parts:
            acts = [self._env_action(part, model_action[:, where])
                    for (_, part), where in zip(spec.parts, spec.slices())]
        else:
            acts = [self._env_action(spec, model_action)]
        return (*acts, state.h, state.z, model_action)


def _leaf_name(path: tuple) -> str:
    return "/".join(map(str, path))


def _noise_layout(agent) -> tuple[int, int]:
    """The actor's categoricals and Box dimensions: the layout of its `noise`."""
    if isinstance(agent, NatureAgent):
        mean = agent.actor.mean
        return len(agent.actor.logits), 0 if mean is None else mean.out_features
    return len(agent.actor.groups), agent.actor.n_box


def _noise(agent, n: int) -> torch.Tensor:
    return agent.noise(n) if isinstance(agent, NatureAgent) else agent.actor.noise(n)


def signature(agent, obs_spec: ObsSpec, act_spec: ActionSpec, sampled: bool = False) -> dict:
    """Input and output names, shapes (N for the batch) and dtypes of the exported step."""
    blank = agent.initial(1)  # the recurrent state's shapes, either recipe's
    h, z, a = ([int(d) for d in x.shape[1:]] for x in (blank.h, blank.z, blank.action))
    inputs = [{"name": _name("obs", k if obs_spec.structured else ""), "key": k,
               "shape": ["N", *obs_spec.shape(k)], "dtype": str(obs_spec.dtypes[k])}
              for k in obs_spec.keys()]
    inputs += [{"name": "h", "shape": ["N", *h], "dtype": "float32"},
               {"name": "z", "shape": ["N", *z], "dtype": "float32"},
               {"name": "action", "shape": ["N", *a], "dtype": "float32"},
               {"name": "is_first", "shape": ["N"], "dtype": "bool"},
               {"name": "u", "shape": ["N", z[0], 1], "dtype": "float32"}]
    if sampled:  # Actor.noise's layout: uniforms per categorical, then normals per Box dim
        groups, box = _noise_layout(agent)
        shape = ["N", groups, 1] if not box else ["N", groups + box]
        inputs.append({"name": "noise", "shape": shape, "dtype": "float32",
                       "uniform": groups, "normal": box})
    leaves = [(path, part) for path, part in act_spec.parts] if act_spec.parts \
        else [((), act_spec)]
    outputs = []
    for path, part in leaves:
        out = {"name": _name("act", _leaf_name(path)), "path": list(path),
               "shape": ["N", *part.shape]}
        if part.discrete:
            out.update(kind="discrete", dtype="int64",
                       env_dtype=str(np.dtype(part.dtype or np.int64)))
        else:
            out.update(kind="box", dtype="float32",
                       env_dtype=str(np.dtype(part.dtype or np.float32)),
                       low=part.low.tolist(), high=part.high.tolist())
        outputs.append(out)
    outputs += [{"name": "h_next", "shape": ["N", *h], "dtype": "float32"},
                {"name": "z_next", "shape": ["N", *z], "dtype": "float32"},
                {"name": "action_next", "shape": ["N", *a], "dtype": "float32"}]
    return {"inputs": inputs, "outputs": outputs}


def _searchsorted(sorted_seq, values, out_int32=False, right=False, side=None, sorter=None):
    """aten.searchsorted for one value per row (..., 1) against (..., K), as
    `nets.categorical_index` calls it: how many entries lie below the value. ONNX has no
    searchsorted; torch.onnx takes this translation (onnxscript) in its place."""
    from onnxscript import INT64
    from onnxscript import opset18 as op
    below = op.Cast(op.Less(sorted_seq, values), to=INT64.dtype)
    return op.ReduceSum(below, op.Constant(value_ints=[-1]), keepdims=1)


def export_onnx(agent, obs_spec: ObsSpec, act_spec: ActionSpec, out: str | Path,
                meta: dict | None = None, sampled: bool = False) -> Path:
    """Write the policy step of `agent` to `out` (ONNX) and its description to
    `out.with_suffix(".json")`; returns `out`. Greedy (the actor's mode), or with `sampled`
    a sample of the actor from the input `noise` (`Actor.noise`'s layout: the uniforms of
    its categoricals, then the normals of its Box dimensions)."""
    out = Path(out)
    if out.suffix.lower() != ".onnx":
        raise ValueError(f"the exported policy's file must end in .onnx, got {str(out)!r}")
    step = PolicyStep(agent, obs_spec, act_spec, sampled).eval()
    for p in step.parameters():
        p.requires_grad_(False)
    sig = signature(agent, obs_spec, act_spec, sampled)
    n = 2
    init = agent.initial(n)
    groups = int(init.z.shape[1])
    example = [torch.as_tensor(np.stack([_sample(obs_spec, k) for _ in range(n)]))
               for k in obs_spec.keys()]
    example += [init.h.detach().clone(), init.z.detach().clone(), init.action.detach().clone(),
                torch.ones(n, dtype=torch.bool), torch.rand(n, groups, 1)]
    if sampled:
        example.append(_noise(agent, n))
    batch = torch.export.Dim("N", min=1, max=65536)
    # torch.onnx's notes on its own internals (the batch axis named twice, its progress lines
    # on stdout) are not the user's business
    with torch.no_grad(), warnings.catch_warnings(), _quiet_loggers(), \
            contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            step, tuple(t.cpu() for t in example), dynamo=True, opset_version=OPSET,
            input_names=[i["name"] for i in sig["inputs"]],
            output_names=[o["name"] for o in sig["outputs"]],
            dynamic_shapes=(tuple({0: batch} for _ in example),),  # forward(*inputs)
            custom_translation_table={torch.ops.aten.searchsorted.Tensor: _searchsorted},
            verbose=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(out))
    from importlib.metadata import version
    info = {"format": "lucid policy step", "lucid": version("lucid-rl"), "opset": OPSET,
            "greedy": not sampled, **sig, "latent_groups": groups,
            "recipe": "nature" if isinstance(agent, NatureAgent) else "2023", **(meta or {})}
    out.with_suffix(".json").write_text(json.dumps(info, indent=1))
    return out


@contextlib.contextmanager
def _quiet_loggers():
    """The exporter's and its optimizer's log lines (torchvision ops it skips, constant
    folding it skips) only at ERROR while exporting."""
    names = ("torch.onnx", "torch._dynamo", "torch.export", "onnxscript", "onnx_ir")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _sample(spec: ObsSpec, key: str) -> np.ndarray:
    """One observation of `key` for tracing: zeros of its shape and dtype, a discrete leaf
    at its first value."""
    x = np.zeros(spec.shape(key), spec.dtypes[key])
    if key in spec.discrete:
        x = x + spec.discrete_start[key].reshape(x.shape).astype(x.dtype)
    return x
