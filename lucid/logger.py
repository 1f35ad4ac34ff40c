"""Run logging: metrics.jsonl and episodes.jsonl always, TensorBoard when available, and a
progress display on the terminal (rich; plain lines when stdout is not a TTY)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


class Logger:
    def __init__(self, run_dir: Path, tensorboard: bool = True, progress: bool = True,
                 total_steps: int = 0, start_steps: int = 0):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_f = open(self.run_dir / "metrics.jsonl", "a")
        self.episodes_f = open(self.run_dir / "episodes.jsonl", "a")
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(str(self.run_dir / "tb"))
            except ImportError:  # tensorboard not installed: JSONL only
                self.tb = None
        self.tty = progress and sys.stdout.isatty()
        self.plain = progress and not self.tty
        self.bar = None
        if self.tty:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
            self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TimeRemainingColumn(),
                                TextColumn("{task.fields[info]}"))
            self.task = self.bar.add_task("train", total=total_steps, completed=start_steps,
                                          info="")
            self.bar.start()

    def episode(self, row: dict) -> None:
        self.episodes_f.write(json.dumps(row) + "\n")
        self.episodes_f.flush()
        if self.tb is not None:
            prefix = "eval" if row.get("eval") else "episode"
            self.tb.add_scalar(f"{prefix}/return", row["return"], row["env_steps"])
            self.tb.add_scalar(f"{prefix}/length", row["length"], row["env_steps"])

    def metrics(self, row: dict) -> None:
        self.metrics_f.write(json.dumps(row) + "\n")
        self.metrics_f.flush()
        step = row["env_steps"]
        if self.tb is not None:
            for k, v in row.items():
                if "/" in k and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
        ret = row.get("episode/return_recent")
        info = (f"upd {row['updates']}  {row.get('perf/env_steps_per_s', 0):.0f} sps  "
                f"{row.get('perf/updates_per_s', 0):.1f} ups  return {ret if ret is None else round(ret, 1)}")
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=info)
        elif self.plain:
            print(f"[{time.strftime('%H:%M:%S')}] steps {step}  {info}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self.tb is not None:
            self.tb.close()
        self.metrics_f.close()
        self.episodes_f.close()
