"""Data-parallel learners with torch.distributed.

    torchrun --nproc-per-node G -m lucid train ENV ...          one machine, G processes
    torchrun --nnodes N --nproc-per-node G --rdzv-endpoint HOST:PORT -m lucid train ...

Every rank is a full learner: its own envs (or Ray runners) and replay, seeded by rank, and its
own batch of `train.batch_size` windows (the batch size is per learner, as RLlib's
`batch_size_B_per_learner`; the global batch is G·B). The agent's three losses keep their own
backward passes and optimizers (with `train.replay_value_grad`, the world model's and the
critic's share one backward pass); between each backward and the gradient clipping of each
component, `Agent.grad_sync` averages that component's gradients over the ranks (one all-reduce of
flattened buckets), together with the loss, so that the norm, the clipping and the skip of a
non-finite step are decided identically everywhere. The λ-returns are gathered over ranks
before the return-percentile update, so the return scale is the global batch's. The
parameters start identical (broadcast from rank 0) and every `run.dist_check_every` updates a
checksum of all parameters and buffers is compared across ranks. Only rank 0 logs, evaluates
and writes checkpoints. NCCL on GPUs (one per rank: cuda:LOCAL_RANK), gloo on CPUs.
"""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch._dynamo  # noqa: F401  (see below)
import torch.distributed as dist

from .device import resolve_device

# torch._dynamo is imported here, before any process group exists: imported after
# init_process_group (as the first optimizer or torch.compile does), it keeps references to
# the default group, so destroy_process_group cannot free it and gloo's threads run on into
# the interpreter's exit, where a rank can abort ("terminate called without an active
# exception"; torch 2.13, seen once in CI).
BUCKET_BYTES = 64 * 2**20  # gradients are all-reduced in flat buckets of about this size
CLOSE_WAIT_S = 60.0  # how long close() waits for the other ranks


def launched() -> bool:
    """True in a process started by torchrun (or with RANK/WORLD_SIZE set) with > 1 rank."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def ranks(device: str = "auto") -> "DataParallel | OneProcess":
    """This process's learners: the data-parallel group torchrun started, else one process."""
    return DataParallel(device) if launched() else OneProcess()


class OneProcess:
    """The learners of a run without data parallelism: DataParallel's calls, each what it
    means for a group of one (the trainer reads no rank branches)."""

    rank, world, is_main, parallel, checks = 0, 1, True, False, 0

    def device_for(self, name: str):
        """The learner's device: `run.device` (of the run as resumed) resolved here."""
        return resolve_device(name)

    def broadcast_object(self, obj):
        return obj

    def sum(self, value):
        return value

    def any(self, flag: bool) -> bool:
        return bool(flag)

    def barrier(self) -> None:
        pass

    def attach(self, agent) -> None:
        pass

    def check_identical(self, agent) -> None:
        pass

    def metrics(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class DataParallel:
    """This process's place among the learners, and the collectives the trainer uses."""

    _closes = 0  # close() calls in this process: every rank makes them in the same order
    parallel = True

    def __init__(self, device: str = "auto", timeout_minutes: float = 30.0):
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cuda = device != "cpu" and torch.cuda.is_available()
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("run.device=cuda but torch sees no CUDA device; "
                             "use --device cpu (or auto)")
        if cuda:
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
        self.backend = "nccl" if cuda else "gloo"
        self.owns_group = not dist.is_initialized()
        if self.owns_group:
            dist.init_process_group(self.backend,
                                    timeout=datetime.timedelta(minutes=timeout_minutes))
        self.checks = 0  # parameter checksums compared so far

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device_for(self, name: str):
        """The learner's device: each rank's own (cuda:LOCAL_RANK or the CPU)."""
        return self.device

    def metrics(self) -> dict:
        """The metric row's columns of the data-parallel learners."""
        return {"dist/world_size": self.world, "dist/param_checks": self.checks}

    def close(self) -> None:
        """Leave the group in step with the other ranks: each rank waits for all to arrive
        here before tearing down its backend (its gloo threads end with it), and rank 0,
        whose process hosts the rendezvous store when launched without torchrun's agent
        store, leaves last, so no rank's teardown runs against a peer that is gone. The waits
        go through the store with a deadline, so a rank that died (the error path) delays the
        others by CLOSE_WAIT_S at most."""
        if not (self.owns_group and dist.is_initialized()):
            return
        store = dist.distributed_c10d._get_default_store() if self.world > 1 else None
        DataParallel._closes += 1
        key = f"lucid/close{DataParallel._closes}"
        self._meet(store, key + "/arrived", wait=True)
        dist.destroy_process_group()
        self._meet(store, key + "/left", wait=self.is_main)

    def _meet(self, store, key: str, wait: bool) -> None:
        """Count this rank in at `key`; with `wait`, until all ranks are counted in (or
        CLOSE_WAIT_S passed, or the store is gone because its host exited)."""
        if store is None:
            return
        deadline = time.monotonic() + CLOSE_WAIT_S
        try:
            arrived = store.add(key, 1)
            while wait and arrived < self.world and time.monotonic() < deadline:
                time.sleep(0.005)
                arrived = store.add(key, 0)
        except (RuntimeError, dist.DistError):  # the store's host is gone: nobody to wait for
            pass

    # ------------------------------------------------------------------ small collectives

    def broadcast_object(self, obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=self.device if self.backend == "nccl"
                                   else None)
        return box[0]

    def sum(self, value: float) -> float:
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t.item())

    def any(self, flag: bool) -> bool:
        return self.sum(1.0 if flag else 0.0) > 0

    def barrier(self) -> None:
        """Return once every rank got here (an all-reduce: the same call on each backend)."""
        self.sum(0.0)

    # ------------------------------------------------------------------ the agent

    def attach(self, agent) -> None:
        """Make rank 0's parameters and buffers everyone's, and hook the gradient averaging
        and the return gathering into the agent's update."""
        if agent.config.train.cuda_graph:
            raise ValueError("train.cuda_graph=true is for one process; data-parallel learners "
                             "run the update uncaptured: set train.cuda_graph=false")
        with torch.no_grad():
            for module in agent.modules().values():
                for t in module.state_dict().values():  # views of the parameters/buffers
                    dist.broadcast(t, src=0)
        agent.grad_sync = self.grad_sync
        agent.gather = self.gather

    def grad_sync(self, params: list[torch.Tensor], loss: torch.Tensor) -> torch.Tensor:
        """Average the gradients of `params` (in place) and `loss` over ranks; returns the
        averaged loss. Every rank must have gradients for the same parameters (the graph of
        the loss is the same on every rank)."""
        loss_t = loss.detach().reshape(1).float()
        tensors = [p.grad for p in params if p.grad is not None] + [loss_t]
        buckets: list[list[torch.Tensor]] = []
        size = BUCKET_BYTES
        for t in tensors:  # consecutive tensors of one dtype, up to BUCKET_BYTES each
            nbytes = t.numel() * t.element_size()
            if not buckets or size + nbytes > BUCKET_BYTES or buckets[-1][0].dtype != t.dtype:
                buckets.append([])
                size = 0
            buckets[-1].append(t)
            size += nbytes
        pending = []
        for bucket in buckets:
            flat = torch.cat([t.reshape(-1) for t in bucket])
            pending.append((bucket, flat, dist.all_reduce(flat, async_op=True)))
        for bucket, flat, work in pending:
            work.wait()
            flat.div_(self.world)
            for t, avg in zip(bucket, flat.split([t.numel() for t in bucket])):
                t.copy_(avg.view_as(t))
        return loss_t[0].to(loss.dtype)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """`x` of every rank joined along a new leading axis (ranks in order)."""
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.stack(parts)

    def checksum(self, agent) -> torch.Tensor:
        """Per module: the sum and the sum of squares (float64) of its parameters and
        buffers."""
        sums = []
        with torch.no_grad():
            for module in agent.modules().values():
                ts = [t.detach().double().reshape(-1) for t in module.state_dict().values()
                      if t.is_floating_point()]
                flat = torch.cat(ts) if ts else torch.zeros(1, dtype=torch.float64,
                                                            device=self.device)
                sums += [flat.sum(), (flat * flat).sum()]
        return torch.stack(sums).to(self.device)

    def check_identical(self, agent) -> None:
        """Raise (on every rank alike) if any rank's parameters differ from rank 0's."""
        local = self.checksum(agent)
        every = self.gather(local)
        self.checks += 1
        bad = [r for r in range(self.world) if not torch.equal(every[r], every[0])]
        if bad:
            names = list(agent.modules())
            diff = (every[bad[0]] != every[0]).nonzero().flatten().tolist()
            raise RuntimeError(
                f"data-parallel learners diverged: rank(s) {bad} hold other parameters than "
                f"rank 0 in {sorted({names[i // 2] for i in diff})} after {agent.updates} "
                f"updates (checksums {every[bad[0]].tolist()} vs {every[0].tolist()})")
