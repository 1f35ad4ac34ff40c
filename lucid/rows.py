"""The metric rows of a run (metrics.jsonl, TensorBoard, W&B): the updates' metrics summed on
the device until the next row (one read back per row, not per update), and the rates since
the row before."""

from __future__ import annotations

import torch


class MetricRows:
    def __init__(self, counters: dict, now: float):
        self.sums: dict[str, torch.Tensor] = {}
        self.n = 0
        self.last, self.steps, self.updates = now, counters["env_steps"], counters["updates"]

    def add(self, metrics: dict[str, torch.Tensor]) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums[k] + v.detach() if k in self.sums else v.detach()
        self.n += 1

    def take(self, counters: dict, now: float, run: dict, tail: dict) -> dict:
        """The row at `now`: counters and rates, the run's own columns (`run`), the mean of
        each metric since the last row, then `tail`; the sums start again."""
        c, dt = counters, max(now - self.last, 1e-9)
        row = {"env_steps": c["env_steps"], "updates": c["updates"], "episodes": c["episodes"],
               "wall_time": round(c["wall_time"], 2),
               "perf/env_steps_per_s": (c["env_steps"] - self.steps) / dt,
               "perf/updates_per_s": (c["updates"] - self.updates) / dt, **run}
        if self.n:
            keys = list(self.sums)
            vals = (torch.stack([self.sums[k].float() for k in keys]) / self.n).cpu().tolist()
            row.update(dict(zip(keys, vals)))
        row.update(tail)
        self.sums, self.n = {}, 0
        self.last, self.steps, self.updates = now, c["env_steps"], c["updates"]
        return row
