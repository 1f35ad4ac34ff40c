"""`train.cuda_graph`: an agent's whole update captured once as one CUDA graph and replayed per
batch (`GraphedUpdate`), for any agent whose update reads nothing back to the host: the 2023
agent's (`Agent`), the Nature recipe's (`NatureAgent`) and K seeds' batched update
(`BatchedAgents`). The agent gives `_update(batch)` (one update, its metrics as tensors of
one shape), `modules()`, `optimizers()`, `device`, `config` and `_graph`."""

from __future__ import annotations

import torch


def check_device(cuda_graph: bool | None, device: torch.device) -> None:
    """A graph is captured on a CUDA device only."""
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"train.cuda_graph=true needs a CUDA device, not {device}: "
                         f"use --device cuda, or train.cuda_graph=false")


def _map(tree: dict, fn) -> dict:
    return {k: _map(v, fn) if isinstance(v, dict) else fn(v) for k, v in tree.items()}


def _copy_into(dst: dict, src: dict, prefix: str = "") -> None:
    for k, d in dst.items():
        s = src[k]
        if isinstance(d, dict):
            _copy_into(d, s, f"{prefix}{k}/")
        elif s.shape != d.shape:
            raise ValueError(f"train.cuda_graph replays one batch shape: {prefix}{k} was captured "
                             f"as {tuple(d.shape)} and is now {tuple(s.shape)}; keep "
                             f"train.batch_size and train.batch_length fixed")
        else:
            d.copy_(s, non_blocking=True)


def snapshot(agent):
    """Copies of the agent's parameters, buffers and optimizer state, for `restore`, in host
    memory (a GPU's memory holds no second copy of the model while a graph is captured)."""
    def copy(t):
        return t.detach().to("cpu", copy=True)
    modules = [[copy(t) for t in m.state_dict().values()] for m in agent.modules().values()]
    opts = [{p: {k: copy(v) for k, v in st.items() if torch.is_tensor(v)}
             for p, st in o.state.items()} for o in agent.optimizers().values()]
    return modules, opts


@torch.no_grad()
def restore(agent, saved) -> None:
    """Put a `snapshot` back in place (the same tensors, as a captured graph needs them).
    Optimizer state made since the snapshot is zeroed: Adam's fresh state is all zeros."""
    modules, opts = saved
    for m, values in zip(agent.modules().values(), modules):
        for t, v in zip(m.state_dict().values(), values):
            t.copy_(v)
    for o, before in zip(agent.optimizers().values(), opts):
        for p, st in o.state.items():
            for k, v in st.items():
                if torch.is_tensor(v):
                    v.copy_(before[p][k]) if p in before else v.zero_()


class GraphedUpdate:
    """`train.cuda_graph`: the whole update (world-model, actor and critic losses, backward
    passes, clipping, fused Adam steps, slow critic) captured once as one CUDA graph and then
    replayed per batch: one launch instead of thousands of small kernels, whose launch cost
    dominates the update at the paper's batch sizes. This works because the update reads
    nothing back to the host (non-finite steps are skipped on the device; metrics stay on it).

    Capturing needs warm-up updates (lazy optimizer state, library workspaces, compiled
    kernels). They run on a side stream, and afterwards the agent's parameters, buffers and
    optimizer state are put back in place, so the first replay starts from the state the agent
    had: the replayed updates are the eager updates, with the same maths and a different draw
    of random numbers. Batches are copied into the captured input buffers (fixed B and T)."""

    def __init__(self, agent, batch: dict, warmup: int = 3):
        self.batch = _map(batch, lambda x: x.clone())
        saved = snapshot(agent)
        device = agent.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                agent._update(self.batch)
        torch.cuda.current_stream(device).wait_stream(side)
        restore(agent, saved)
        del saved
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the prefetch thread may copy the next batch while this one captures.
        try:
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                metrics = agent._update(self.batch)
                self.keys = list(metrics)
                # one shape for all: 0-d for one agent, (K,) for K seeds batched
                shape = next(iter(metrics.values())).shape
                self.values = torch.stack([v.detach().float().reshape(shape)
                                           for v in metrics.values()])
        except RuntimeError as exc:  # e.g. a custom network's .item(): name the way out
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise RuntimeError(
                f"train.cuda_graph (CUDA's default for one process) could not capture the "
                f"update ({first}): something in it reads a value back to the host (.item(), "
                f"a Python branch on a tensor, a data-dependent shape), which a CUDA graph "
                f"cannot hold; tests/test_cuda_graph.py's host-read probe shows where. "
                f"train.cuda_graph=false runs the same update uncaptured") from exc

    def __call__(self, batch: dict) -> dict[str, torch.Tensor]:
        _copy_into(self.batch, batch)
        self.graph.replay()
        return dict(zip(self.keys, self.values.clone().unbind()))


def graphed_or_eager(agent, batch: dict) -> dict[str, torch.Tensor]:
    """`agent._update(batch)`, or under `train.cuda_graph` the agent's update graph
    (`agent._graph`, captured at the first call) replayed on it; the batch's host-side keys
    (`_env`, `_step`: where the replay holds its steps) stay outside the graph."""
    if not agent.config.train.cuda_graph:
        return agent._update(batch)
    tensors = {k: v for k, v in batch.items() if not k.startswith("_")}
    if agent._graph is None:
        agent._graph = GraphedUpdate(agent, tensors)
    return agent._graph(tensors)
