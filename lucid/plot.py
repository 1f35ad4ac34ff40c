"""Learning curves of one or more run directories.

`plot_runs(run_dirs, out)` reads each run's `episodes.jsonl` and `config.yaml`. Runs whose
configs are equal apart from the seed and the run directory form one group (one curve): the
mean over its seeds with a min–max (or ±std) band. Each run is first smoothed (running mean
of the last `window` training episodes) and interpolated onto a common x grid; at every x
only the runs that reached it count. Evaluation episodes (`eval: true`) are drawn as markers.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml

from .config import RESUME_SETTABLE, flatten

# Keys that do not change what a run learns: runs differing only in these are seeds of one
# config (a resumed seed with another --steps or time limit stays in its group)
IGNORED_KEYS = ("run.seed", "run.run_dir", "run.videos", *RESUME_SETTABLE)
X_KEYS = ("env_steps", "wall_time")


@dataclass
class Run:
    path: Path
    config: dict
    train_env_steps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    train_wall: np.ndarray = field(default_factory=lambda: np.zeros(0))
    train_ret: np.ndarray = field(default_factory=lambda: np.zeros(0))
    eval_rows: list[dict] = field(default_factory=list)

    def x(self, key: str) -> np.ndarray:
        return self.train_env_steps if key == "env_steps" else self.train_wall


def pyplot():
    """matplotlib.pyplot on the headless Agg backend (imported on first use)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str | Path, dpi: int) -> Path:
    """Lay out, write (making the folder) and close a figure; returns the path."""
    with warnings.catch_warnings():  # a long legend: matplotlib lays out what it can
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file; a truncated last line (a run killed mid-write) is skipped."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def load_run(run_dir: str | Path) -> Run:
    path = Path(run_dir)
    if not (path / "episodes.jsonl").exists():
        raise FileNotFoundError(f"{path} has no episodes.jsonl; is it a lucid run directory?")
    cfg_path = path / "config.yaml"
    config = yaml.safe_load(cfg_path.read_text()) if cfg_path.exists() else {}
    rows = read_jsonl(path / "episodes.jsonl")
    train = [r for r in rows if not r.get("eval")]
    evals = [r for r in rows if r.get("eval")]
    return Run(path, flatten(config or {}),
               train_env_steps=np.array([r["env_steps"] for r in train], float),
               train_wall=np.array([r.get("wall_time", np.nan) for r in train], float),
               train_ret=np.array([r["return"] for r in train], float),
               eval_rows=evals)


def config_key(run: Run) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in run.config.items() if k not in IGNORED_KEYS))


def group_runs(runs: Sequence[Run], names: Sequence[str] | None = None
               ) -> dict[str, list[Run]]:
    """Group runs by config (ignoring seed and run directory); label each group by the config
    keys that differ between groups (or by the env when there is one group), or by `names`,
    one per group in the order of their first runs."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(config_key(r), []).append(r)
    keys = list(groups)
    if names is not None and len(names) != len(keys):
        raise ValueError(f"{len(names)} label(s) for {len(keys)} group(s) of runs (runs of one "
                         f"config, seeds aside, form a group); give one --label per group")
    differing = sorted({k for key in keys for k, _ in key
                        if len({dict(other).get(k) for other in keys}) > 1})
    labels: dict[str, list[Run]] = {}
    shown = sorted(differing, key=lambda k: k != "env.id")  # the env first, then 2 more
    for i, key in enumerate(keys):
        cfg = dict(key)
        if names is not None:
            label = names[i]
        elif len(keys) == 1 or not differing:
            env = groups[key][0].config.get("env.id")
            label = _env(env) if env is not None else groups[key][0].path.name
        else:
            label = ", ".join(_env(cfg.get(k)) if k == "env.id" else f"{k}={_unrepr(cfg.get(k))}"
                              for k in shown[:3])
            label += f", +{len(shown) - 3} more" if len(shown) > 3 else ""
        n = len(groups[key])
        label = f"{label} ({n} seed{'s' if n != 1 else ''})"
        while label in labels:
            label += "'"
        labels[label] = groups[key]
    return labels


def _env(v) -> str:
    """An env id as runs are named (my_env.py:MyEnv, not its absolute path)."""
    from .envs import env_label
    return env_label(_unrepr(v))


def _unrepr(v) -> str:
    if v is None:
        return "-"
    return v.strip("'") if isinstance(v, str) else str(v)


def running_mean(x: np.ndarray, window: int) -> np.ndarray:
    if len(x) == 0:
        return x
    c = np.cumsum(np.insert(x, 0, 0.0))
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def group_curve(runs: Sequence[Run], x: str = "env_steps", window: int = 10,
                points: int = 200, band: str = "minmax"):
    """Common grid, mean and band over the runs of one group. Returns (grid, mean, low,
    high, count) with NaN where no run has data."""
    curves = [(r.x(x), running_mean(r.train_ret, window)) for r in runs if len(r.train_ret)]
    curves = [(xs, ys) for xs, ys in curves if np.all(np.isfinite(xs))]
    if not curves:
        return (np.zeros(0),) * 5
    lo = min(xs[0] for xs, _ in curves)
    hi = max(xs[-1] for xs, _ in curves)
    grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
    vals = np.full((len(curves), len(grid)), np.nan)
    for i, (xs, ys) in enumerate(curves):
        inside = (grid >= xs[0]) & (grid <= xs[-1])
        vals[i, inside] = np.interp(grid[inside], xs, ys)
    count = np.sum(np.isfinite(vals), 0)
    with warnings.catch_warnings():  # all-NaN columns (no run there) stay NaN, quietly
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(vals, 0)
        if band == "std":
            sd = np.nanstd(vals, 0)
            low, high = mean - sd, mean + sd
        else:
            low, high = np.nanmin(vals, 0), np.nanmax(vals, 0)
    return grid, mean, low, high, count


def eval_points(rows: Sequence[dict], x: str = "env_steps") -> list[tuple[float, float]]:
    """(x, mean return) per evaluation: its episodes share env_steps (each has its own
    wall_time, so the evaluation is placed at their mean)."""
    by_step: dict[float, list[dict]] = {}
    for r in rows:
        by_step.setdefault(float(r["env_steps"]), []).append(r)
    return sorted((float(np.mean([float(r[x]) for r in group])),
                   float(np.mean([float(r["return"]) for r in group])))
                  for group in by_step.values())


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path, x: str = "env_steps",
              band: str = "minmax", window: int = 10, title: str | None = None,
              labels: Sequence[str] | None = None) -> Path:
    """Write a PNG of the learning curves of `run_dirs` (one curve per config) to `out`;
    `labels` name the curves (one per config, in the order of their first runs)."""
    if x not in X_KEYS:
        raise ValueError(f"x must be one of {', '.join(X_KEYS)}, got {x!r}")
    if band not in ("minmax", "std"):
        raise ValueError(f"band must be 'minmax' or 'std', got {band!r}")
    if not run_dirs:
        raise ValueError("no run directories given")
    plt = pyplot()

    runs = [load_run(d) for d in run_dirs]
    if not any(len(r.train_ret) or r.eval_rows for r in runs):
        names = ", ".join(str(r.path) for r in runs)
        raise ValueError(f"no finished episodes to plot in {names} yet (episodes.jsonl lists "
                         f"episodes as they end); train longer, or give env.max_episode_steps "
                         f"to an env whose episodes are very long")
    groups = group_runs(runs, labels)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (label, members) in enumerate(groups.items()):
        colour = f"C{i % 10}"
        grid, mean, low, high, count = group_curve(members, x, window, band=band)
        if len(grid):
            ax.plot(grid, mean, color=colour, label=label)
            if len(members) > 1:
                ax.fill_between(grid, low, high, color=colour, alpha=0.2, linewidth=0)
        ex = [r for m in members for r in m.eval_rows if r.get("policy", "greedy") == "greedy"]
        if ex:
            points = eval_points(ex, x)
            ax.plot([p[0] for p in points], [p[1] for p in points], "o", color=colour,
                    markersize=4, markerfacecolor="white", label=f"{label}: eval")
    ax.set_xlabel("environment steps" if x == "env_steps" else "wall time (s)")
    ax.set_ylabel(f"episode return (mean of last {window})")
    spread = any(len(members) > 1 for members in groups.values())  # else no band is drawn
    ax.set_title(title or "learning curves" + ("" if not spread else
                                              " (band: min–max over seeds)" if band == "minmax"
                                              else " (band: ±1 std over seeds)"))
    ax.grid(alpha=0.3)
    if groups:
        ax.legend(fontsize=8, loc="best")
    return save_figure(fig, out, dpi=100)
