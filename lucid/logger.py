"""Run logging.

Backends (`run.logger`, docs/configuration.md):

- JSONL, always: `metrics.jsonl` (one row per `run.log_every` seconds: counters, then grouped
  metrics `train/`, `world_model/`, `actor/`, `critic/`, `episode/`, `replay/`, `perf/`, and
  `runners/`, `dist/` when scaled out) and `episodes.jsonl` (one row per finished episode,
  training and evaluation).
- TensorBoard (`tensorboard`, the default), in `RUN_DIR/tb/`: every grouped metric as a scalar
  at x = env steps, the counters as `train/updates`, `train/episodes`, `perf/wall_time`,
  training episodes as `episode/return` and `episode/length`, each evaluation's mean as
  `eval/return` / `eval/length` (greedy) and `eval/sampled_return` / `eval/sampled_length`,
  histograms of the episode returns and lengths since the previous histogram every
  `run.histogram_every` metric rows, the resolved config as text, and the videos that
  `lucid.video.log_videos` adds through `Logger.tb`.
- Weights & Biases (`wandb`, optional: `pip install 'lucid-rl[wandb]'`), in `RUN_DIR/wandb/`:
  the same scalars and histograms with env steps as their x-axis, and the config. Offline by
  default (`run.wandb_mode`), so it needs no network or account; upload later with
  `wandb sync RUN_DIR/wandb/offline-run-*`. The W&B run id is kept in `RUN_DIR/wandb/run_id`,
  so a resumed run logs to the same W&B run: online, W&B continues it; offline (which W&B
  does not resume), each session writes its own offline-run folder with that id, and the
  rows a killed session logged past its checkpoint stay in its folder.

The progress display is a rich progress bar when stdout is a terminal. When it is not (CI logs,
`nohup`, a pipe) there is no bar and no terminal control codes: one plain status line at the
first metric row and then at most one every `PLAIN_EVERY` seconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from .checkpoint import atomic_write_text
from .config import logger_backends
from .io import read_jsonl
from .warn import warn

PLAIN_EVERY = 60.0  # seconds between plain progress lines when stdout is not a terminal
SLOW_FACTOR = 3.0  # updates this many times slower than the run's best get a hint


def machine_load() -> tuple[float, int] | None:
    """(load average over the last minute, cores) where the load exceeds the cores this
    process may use, i.e. runnable work is waiting for a core; else None."""
    try:
        load, cores = os.getloadavg()[0], len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux or macOS
        return None
    return (load, cores) if load > cores else None
WANDB_EXTRA = "pip install 'lucid-rl[wandb]'"


def import_wandb():
    """The wandb module, or an ImportError that names the extra to install."""
    try:
        import wandb
    except ImportError as exc:
        raise ImportError(f"run.logger includes 'wandb' but the wandb package is not "
                          f"installed; install it with {WANDB_EXTRA}") from exc
    return wandb


def drop_rows_after(path: Path, env_steps: int) -> None:
    """Rewrite a JSONL log without its rows past `env_steps` (and any torn last line),
    atomically."""
    if path.exists():
        keep = [r for r in read_jsonl(path)
                if not (isinstance(r, dict) and r.get("env_steps", 0) > env_steps)]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in keep))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Logger:
    """Writes one run's metric rows and episodes to every enabled backend and shows progress.

    `backends` is `run.logger` ("tensorboard", "tensorboard,wandb", ["wandb"], "none"); when
    None it is taken from `config.run.logger` (default: TensorBoard). `config` (a lucid
    Config) also gives the W&B project and mode, the histogram interval, and is stored with
    the run in TensorBoard and W&B. `tensorboard=False` turns TensorBoard off whatever the
    backends say. `purge_after` (a resumed run's env steps at its checkpoint) drops the rows
    and TensorBoard events that a killed run wrote after that point, so that curves do not
    run twice over the same steps. `fields` lead every JSONL row (`{"seed": 3}`)."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, progress: bool = True,
                 total_steps: int = 0, start_steps: int = 0, backends: Any = None,
                 config: Any = None, purge_after: int | None = None,
                 fields: dict | None = None):
        self.run_dir = Path(run_dir)
        self.fields = dict(fields or {})  # leading every JSONL row (the run's seed)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        run_cfg = getattr(config, "run", None)
        if backends is None:
            backends = run_cfg.logger if run_cfg is not None else "tensorboard"
        self.backends = logger_backends(backends)
        if not tensorboard and "tensorboard" in self.backends:
            self.backends.remove("tensorboard")
        self.histogram_every = int(getattr(run_cfg, "histogram_every", 10))
        self.total_steps, self.start_steps = total_steps, start_steps
        self._last_step: int | None = None  # of the last metric row (histograms at close)
        self._rows = 0
        self._ups_rows, self._best_ups = 0, 0.0  # rows with updates, their best rate
        self._hist: dict[str, list[float]] = {"return": [], "length": []}
        self._eval: tuple[int, str] | None = None  # (env steps, policy) of buffered eval eps
        self._eval_eps: list[dict] = []
        if purge_after is not None:
            for name in ("metrics.jsonl", "episodes.jsonl"):
                drop_rows_after(self.run_dir / name, purge_after)
        self._purge_step = None if purge_after is None else purge_after + 1
        self.metrics_f = open(self.run_dir / "metrics.jsonl", "a")
        self.episodes_f = open(self.run_dir / "episodes.jsonl", "a")
        self.tb = None
        self.wandb = None
        try:
            if "tensorboard" in self.backends:
                self._open_tensorboard(config)
            if "wandb" in self.backends:
                self._open_wandb(config)
        except BaseException:
            if self.tb is not None:
                self.tb.close()
            self._close_files()
            raise
        self.tty = progress and sys.stdout.isatty()
        self.plain = progress and not self.tty
        self._last_plain = -float("inf")
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

    # ------------------------------------------------------------------ backends

    def _open_tensorboard(self, config) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is a dependency, but keep running without it
            warn("tensorboard is not installed; logging to the JSONL files only "
                 "(pip install tensorboard)")
            return
        _wait_to_sort_last(self.run_dir / "tb")
        # purge_step: TensorBoard hides the earlier files' events at and after that step
        self.tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=self._purge_step)
        if config is not None:
            from .config import to_yaml
            text = "\n".join("    " + line for line in to_yaml(config).splitlines())
            # indented: shown as a code block; at the session's first step, so a resumed
            # run's config (its run.steps, say) is the one TensorBoard shows last
            self.tb.add_text("config", text, self.start_steps)

    def _open_wandb(self, config) -> None:
        wandb = import_wandb()
        run_cfg = getattr(config, "run", None)
        directory = self.run_dir / "wandb"
        directory.mkdir(parents=True, exist_ok=True)
        id_file = directory / "run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else None
        if not run_id:
            run_id = uuid.uuid4().hex[:8]
            id_file.write_text(run_id + "\n")
        mode = os.environ.get("WANDB_MODE") or getattr(run_cfg, "wandb_mode", "offline")
        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True,
                                  save_code=False, disable_git=True)
        self.wandb = wandb.init(
            project=getattr(run_cfg, "wandb_project", None) or "lucid",
            dir=str(self.run_dir), mode=mode, id=run_id, resume="allow",
            name=self.run_dir.name, reinit="create_new", settings=settings,
            config=dataclasses.asdict(config) if dataclasses.is_dataclass(config) else None)
        self.wandb.define_metric("env_steps")
        self.wandb.define_metric("*", step_metric="env_steps")

    def _scalars(self, values: dict[str, float], step: int) -> None:
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log({"env_steps": step, **values})

    def _histograms(self, step: int) -> None:
        hists = {f"episode/{k}s": v for k, v in self._hist.items() if v}
        self._hist = {k: [] for k in self._hist}
        if not hists:
            return
        import numpy as np
        if self.tb is not None:
            for k, v in hists.items():
                self.tb.add_histogram(k, np.asarray(v, np.float64), step)
        if self.wandb is not None:
            import wandb
            self.wandb.log({"env_steps": step,
                            **{k: wandb.Histogram(np.asarray(v)) for k, v in hists.items()}})

    def videos(self, paths: dict[str, Path], step: int) -> None:
        """Videos that lucid.video.log_videos wrote (`{"eval": mp4, "dream": mp4 or png}`),
        to W&B under the tags log_videos gives them in TensorBoard (which gets them there)."""
        if self.wandb is None or not paths:
            return
        import wandb
        tags = {"eval": "eval/video", "dream": "world_model/open_loop"}
        media = {tags[k]: wandb.Image(str(p)) if Path(p).suffix == ".png"
                 else wandb.Video(str(p), format=Path(p).suffix[1:])
                 for k, p in paths.items() if k in tags}
        if media:
            self.wandb.log({"env_steps": step, **media})

    def _flush_eval(self) -> None:
        """One point per evaluation: the mean of its episodes (they share env steps)."""
        if not self._eval_eps:
            return
        step, policy = self._eval
        eps, self._eval_eps, self._eval = self._eval_eps, [], None
        prefix = "eval/" if policy == "greedy" else f"eval/{policy}_"
        self._scalars({prefix + "return": sum(e["return"] for e in eps) / len(eps),
                       prefix + "length": sum(e["length"] for e in eps) / len(eps)}, step)

    # ------------------------------------------------------------------ rows

    def episode(self, row: dict) -> None:
        self.episodes_f.write(json.dumps({**self.fields, **row}) + "\n")
        self.episodes_f.flush()
        if self.tb is None and self.wandb is None:
            return
        step = row["env_steps"]
        if row.get("eval"):
            key = (step, row.get("policy", "greedy"))
            if self._eval is not None and self._eval != key:
                self._flush_eval()
            self._eval = key
            self._eval_eps.append(row)
            return
        self._flush_eval()
        if row.get("cut"):  # cut short by an env crash: a part of a return, kept out of curves
            return
        self._scalars({"episode/return": row["return"], "episode/length": row["length"]}, step)
        if self.histogram_every:  # only kept to be written (and emptied) every N rows
            self._hist["return"].append(float(row["return"]))
            self._hist["length"].append(float(row["length"]))

    def metrics(self, row: dict) -> None:
        self.metrics_f.write(json.dumps({**self.fields, **row}) + "\n")
        self.metrics_f.flush()
        step = row["env_steps"]
        self._last_step = step
        if self.tb is not None or self.wandb is not None:
            self._flush_eval()
            values = {k: v for k, v in row.items() if "/" in k and _number(v)}
            for k, name in (("updates", "train/updates"), ("episodes", "train/episodes"),
                            ("wall_time", "perf/wall_time")):
                if _number(row.get(k)):
                    values[name] = row[k]
            self._scalars(values, step)
            self._rows += 1
            if self.histogram_every and self._rows % self.histogram_every == 0:
                self._histograms(step)
        info = self.progress_info(row)
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=info)
        elif self.plain and time.monotonic() - self._last_plain >= PLAIN_EVERY:
            self._last_plain = time.monotonic()
            total = f"/{self.total_steps:,}" if self.total_steps else ""
            print(f"[{time.strftime('%H:%M:%S')}] steps {step:,}{total}  {info}", flush=True)

    def progress_info(self, row: dict) -> str:
        """The progress line's numbers for a metric row, and a hint where updates have become
        far slower than this run's best (from its third row on): most often another process
        on the same cores (the machine's load says whether)."""
        ret, ups = row.get("episode/return_recent"), row.get("perf/updates_per_s", 0)
        info = (f"upd {row['updates']}  {row.get('perf/env_steps_per_s', 0):.0f} sps  "
                f"{ups:.1f} ups  return {'-' if ret is None else round(ret, 1)}")
        self._ups_rows += ups > 0
        if self._ups_rows >= 3 and 0 < ups < self._best_ups / SLOW_FACTOR:
            info += f"  slow: updates at {ups / self._best_ups:.0%} of this run's best"
            if (busy := machine_load()) is not None:
                info += (f"; the machine is busy (load {busy[0]:.1f} on {busy[1]} cores: other "
                         f"processes take its cores; run.threads=1 shares them best)")
        if self._ups_rows >= 2:  # (the first row's rate includes compiling and warming up)
            self._best_ups = max(self._best_ups, ups)
        return info

    # ------------------------------------------------------------------ end

    def _close_files(self) -> None:
        self.metrics_f.close()
        self.episodes_f.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        self._flush_eval()
        if self.histogram_every and self._last_step is not None:  # the episodes since the
            self._histograms(self._last_step)                     # last histogram
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        self._close_files()


def _wait_to_sort_last(tb_dir: Path) -> None:
    """Wait until a new event file's name sorts after every file already in `tb_dir`.

    TensorBoard replays a directory's event files in name order, and a name starts with the
    second its writer opened, then a per-process counter that does not sort as a number
    ("10" before "9"). A second writer opened in the same second as an earlier one (a resume
    in the same process) could be replayed first, and its purge would then hide nothing."""
    stamps = [int(f.name.split(".")[3]) for f in tb_dir.glob("events.out.tfevents.*")
              if f.name.split(".")[3].isdigit()]
    if stamps and (wait := max(stamps) + 1 - time.time()) > 0:
        time.sleep(wait)
