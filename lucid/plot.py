"""Learning curves of one or more run directories.

`plot_runs(run_dirs, out)` reads each run's `config.yaml`, `episodes.jsonl` and
`metrics.jsonl`. Runs whose configs are equal apart from the seed, the run directory and the
keys a resume may change form one group (one curve): the mean over its seeds with a min–max
(or ±std) band. A key that a run's config.yaml lacks (the file is older than the key) counts
as its default. `y` is what is drawn: an episode key (`return`, the default, or `length`; each
run's running mean of the last `window` training episodes, evaluation episodes as markers) or
any numeric key of metrics.jsonl (its rows as logged, each a mean over its logging interval).
Each run's curve is interpolated onto a common x grid; at every x only the runs that reached
it count.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml

from .config import RESUME_SETTABLE, Config, suggest, as_dict, flatten
from .io import read_jsonl
from .seeds import seed_dirs

# Keys that do not change what a run learns: runs differing only in these are seeds of one
# config (a resumed seed with another --steps or time limit stays in its group)
IGNORED_KEYS = ("run.seed", "run.run_dir", "run.videos", *RESUME_SETTABLE)
X_KEYS = ("env_steps", "wall_time")
EPISODE_KEYS = ("return", "length")  # y keys read from episodes.jsonl; others: metrics.jsonl


@dataclass
class Run:
    path: Path
    config: dict  # flattened, every key this lucid knows (see load_run)
    episodes: list[dict] = field(default_factory=list)  # training episodes
    eval_rows: list[dict] = field(default_factory=list)  # evaluation episodes
    metrics: list[dict] = field(default_factory=list)  # rows of metrics.jsonl

    def series(self, y: str = "return", x: str = "env_steps", window: int = 10
               ) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) over the rows where `y` is a finite number: an episode key's running mean of
        the last `window` training episodes, or a metrics.jsonl key as logged; x is NaN in
        rows without it."""
        episodes = y in EPISODE_KEYS
        rows = [r for r in (self.episodes if episodes else self.metrics) if _finite(r.get(y))]
        xs = np.array([r.get(x, np.nan) for r in rows], float)
        ys = np.array([r[y] for r in rows], float)
        return xs, running_mean(ys, window) if episodes else ys


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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


def train_episodes(rows: list[dict]) -> list[dict]:
    """The rows of episodes.jsonl whose returns judge the agent: training episodes, less those
    an env crash cut short (`"cut": true`, their return only a part)."""
    return [r for r in rows if not r.get("eval") and not r.get("cut")]


@functools.cache
def config_defaults() -> dict:
    """Every config key with its dataclass default, flattened ({"run.tag": "", ...})."""
    return flatten(as_dict(Config()))


def expand_seeds(run_dirs: Sequence[str | Path]) -> list[Path]:
    """The run directories, a multi-seed run's (`lucid train --seeds`) as its seeds' ones."""
    return [d for r in run_dirs for d in (seed_dirs(r) or [Path(r)])]


def load_run(run_dir: str | Path) -> Run:
    """A run directory's config, episodes and metric rows. config.yaml holds the resolved
    config, so a key it lacks is newer than the file: it takes its dataclass default (not a
    preset's value), which is how the code behaved before the key existed as long as that
    default has not changed; a key this lucid no longer has is left out. A run without
    config.yaml has an empty config."""
    path = Path(run_dir)
    if not (path / "episodes.jsonl").exists():
        raise FileNotFoundError(f"{path} has no episodes.jsonl; is it a lucid run directory?")
    cfg_path = path / "config.yaml"
    config = flatten(yaml.safe_load(cfg_path.read_text()) or {}) if cfg_path.exists() else {}
    known = config_defaults()  # a key this lucid no longer has shapes nothing: left out
    config = {k: v for k, v in config.items() if k in known or k.startswith("env.kwargs.")}
    rows = read_jsonl(path / "episodes.jsonl")
    return Run(path, {**config_defaults(), **config} if config else {},
               episodes=train_episodes(rows),
               eval_rows=[r for r in rows if r.get("eval")],
               metrics=read_jsonl(path / "metrics.jsonl"))


def config_key(run: Run) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in run.config.items() if k not in IGNORED_KEYS))


def group_runs(runs: Sequence[Run], names: Sequence[str] | None = None
               ) -> dict[str, list[Run]]:
    """Group runs by config (ignoring IGNORED_KEYS) and label each group, with its number of
    seeds, by `names` (one per group in the order of their first runs) or else by the config
    keys that differ between groups: the env's name first, then the run.tag itself
    ("untagged" for ""), then `key=value`, three at most. One group is labeled by its env
    and its tag, if any; groups that three keys leave alike, by every differing key."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(config_key(r), []).append(r)
    keys = list(groups)
    if names is not None and len(names) != len(keys):
        raise ValueError(f"{len(names)} label(s) for {len(keys)} group(s) of runs (runs of one "
                         f"config, seeds aside, form a group); give one --label per group")
    differing = sorted({k for key in keys for k, _ in key
                        if len({dict(other).get(k) for other in keys}) > 1},
                       key=lambda k: (k != "env.id", k != "run.tag", k))
    def describe(cfg: dict, most: int | None = 3) -> str:
        shown = differing[:most]
        more = len(differing) - len(shown)
        return ", ".join(_describe(k, cfg) for k in shown) + (f", +{more} more" if more else "")

    short = [describe(m[0].config) for m in groups.values()]
    labels: dict[str, list[Run]] = {}
    for i, members in enumerate(groups.values()):
        cfg = members[0].config
        if names is not None:
            label = names[i]
        elif not differing:
            env = cfg.get("env.id")
            label = ", ".join(filter(None, [_env(env) if env is not None else
                                            members[0].path.name, cfg.get("run.tag")]))
        else:  # every differing key where three leave this group's label another's
            label = short[i] if short.count(short[i]) == 1 else describe(cfg, None)
        label = f"{label} ({_count(members)})"
        while label in labels:
            label += "'"
        labels[label] = members
    return labels


def _count(members: Sequence[Run]) -> str:
    """"3 seeds", or "3 runs, 1 seed" where runs share a seed (repeats, not seeds)."""
    n, seeds = len(members), len({repr(m.config.get("run.seed")) for m in members})
    if seeds == n:
        return f"{n} seed{'s' if n != 1 else ''}"
    return f"{n} runs, {seeds} seed{'s' if seeds != 1 else ''}"


def _describe(key: str, cfg: dict) -> str:
    """One differing key of a group's config as its label shows it."""
    if key == "env.id":
        return _env(cfg.get(key))
    if key == "run.tag":
        return cfg.get(key) or "untagged"
    if key == "model.agent":  # a file's name, not its absolute path
        return f"model.agent={_env(cfg.get(key)) if cfg.get(key) else 'lucid.agent:Agent'}"
    return f"{key}={cfg[key]}" if key in cfg else f"{key}=-"


def _env(v) -> str:
    """An env id as runs are named (my_env.py:MyEnv, not its absolute path)."""
    from .envs import env_label
    return "-" if v is None else env_label(str(v))


def running_mean(x: np.ndarray, window: int) -> np.ndarray:
    if len(x) == 0:
        return x
    c = np.cumsum(np.insert(x, 0, 0.0))
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def group_curve(runs: Sequence[Run], x: str = "env_steps", window: int = 10,
                points: int = 200, band: str = "minmax", y: str = "return"):
    """Common grid, mean and band of `y` (see Run.series) over the runs of one group. Returns
    (grid, mean, low, high, count) with NaN where no run has data."""
    curves = [r.series(y, x, window) for r in runs]
    curves = [(xs, ys) for xs, ys in curves if len(xs) and np.all(np.isfinite(xs))]
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


def eval_points(rows: Sequence[dict], x: str = "env_steps", y: str = "return"
                ) -> list[tuple[float, float]]:
    """(x, mean y) per evaluation: its episodes share env_steps (each has its own
    wall_time, so the evaluation is placed at their mean)."""
    by_step: dict[float, list[dict]] = {}
    for r in rows:
        by_step.setdefault(float(r["env_steps"]), []).append(r)
    return sorted((float(np.mean([float(r[x]) for r in group])),
                   float(np.mean([float(r[y]) for r in group])))
                  for group in by_step.values())


def plottable_keys(runs: Sequence[Run]) -> list[str]:
    """What `y` can be for these runs: the episode keys, then the metrics.jsonl keys that hold
    a number in some row (the x keys and the run's seed aside)."""
    logged = {k for r in runs for row in r.metrics for k, v in row.items() if _finite(v)}
    return [*EPISODE_KEYS, *sorted(logged - set(X_KEYS) - {"seed"})]


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path, x: str = "env_steps",
              band: str = "minmax", window: int = 10, title: str | None = None,
              labels: Sequence[str] | None = None, y: str = "return") -> Path:
    """Write a PNG of `y` against `x` for `run_dirs` (one curve per config) to `out`. `y`:
    "return" or "length" of the training episodes (running mean of the last `window`; greedy
    evaluations as markers) or any numeric key of metrics.jsonl, e.g. "world_model/loss"
    (as logged). `labels` name the curves (one per config, in the order of their first runs).
    A multi-seed run's directory stands for its seeds' runs."""
    if x not in X_KEYS:
        raise ValueError(f"x must be one of {', '.join(X_KEYS)}, got {x!r}")
    if band not in ("minmax", "std"):
        raise ValueError(f"band must be 'minmax' or 'std', got {band!r}")
    if not run_dirs:
        raise ValueError("no run directories given")
    plt = pyplot()

    runs = [load_run(d) for d in expand_seeds(run_dirs)]
    if y in EPISODE_KEYS and not any(r.episodes or r.eval_rows for r in runs):
        names = ", ".join(str(r.path) for r in runs)
        raise ValueError(f"no finished episodes to plot in {names} yet (episodes.jsonl lists "
                         f"episodes as they end); train longer, or give env.max_episode_steps "
                         f"to an env whose episodes are very long")
    if y not in EPISODE_KEYS and not any(len(r.series(y)[0]) for r in runs):
        keys = plottable_keys(runs)
        raise ValueError(f"no run has logged {y!r} (in metrics.jsonl) yet"
                         f"{suggest(y, keys)}; plot one of: {', '.join(keys)}")
    groups = group_runs(runs, labels)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (label, members) in enumerate(groups.items()):
        color = f"C{i % 10}"
        grid, mean, low, high, count = group_curve(members, x, window, band=band, y=y)
        if len(grid):  # a lone point (one logged row) as a marker: a line would not show
            ax.plot(grid, mean, color=color, label=label, marker="o" if len(grid) == 1 else None)
            if len(members) > 1:
                ax.fill_between(grid, low, high, color=color, alpha=0.2, linewidth=0)
        ex = [r for m in members for r in m.eval_rows if r.get("policy", "greedy") == "greedy"]
        if ex and y in EPISODE_KEYS:
            points = eval_points(ex, x, y)
            ax.plot([p[0] for p in points], [p[1] for p in points], "o", color=color,
                    markersize=4, markerfacecolor="white", label=f"{label}: eval")
    ax.set_xlabel("environment steps" if x == "env_steps" else "wall time (s)")
    ax.set_ylabel(f"episode {y} (mean of last {window})" if y in EPISODE_KEYS else y)
    spread = any(len(members) > 1 for members in groups.values())  # else no band is drawn
    ax.set_title(title or "learning curves" + ("" if not spread else
                                              " (band: min–max over seeds)" if band == "minmax"
                                              else " (band: ±1 std over seeds)"))
    ax.grid(alpha=0.3)
    if groups:
        ax.legend(fontsize=8, loc="best")
    return save_figure(fig, out, dpi=100)


# The report's diagnostics: one panel per question, the metrics.jsonl keys that answer it
# (a panel whose keys a run has not logged is left out). Log scales where values span decades.
DIAGNOSTICS = (
    ("episode return (mean of the last 10)", ("episode/return_recent",), False),
    ("world-model losses", ("world_model/decoder", "world_model/reward", "world_model/continue",
                            "world_model/dyn", "world_model/rep"), True),
    ("KL(posterior ‖ prior)", ("world_model/kl",), False),
    ("entropies", ("actor/entropy", "world_model/post_entropy", "world_model/prior_entropy"),
     False),
    ("return scale S (actor)", ("actor/return_scale",), False),
    ("critic: value and return means", ("critic/value_mean", "critic/return_mean"), False),
    ("gradient norms (before clipping)", ("world_model/grad_norm", "actor/grad_norm",
                                          "critic/grad_norm"), True),
    ("updates per second", ("perf/updates_per_s",), False),
)


def plot_diagnostics(run_dir: str | Path, out: str | Path) -> Path | None:
    """A grid of the run's main diagnostics against env steps, from metrics.jsonl (each
    point a logged row's mean over its interval), so a change in the return can be read
    next to its cause; None where no row has any of them yet."""
    run = Run(Path(run_dir), {}, metrics=read_jsonl(Path(run_dir) / "metrics.jsonl"))
    panels = []
    for title, keys, log in DIAGNOSTICS:
        lines = [(k, *run.series(k)) for k in keys]
        lines = [(k, xs, ys) for k, xs, ys in lines if len(xs)]
        if lines:
            panels.append((title, lines, log))
    if not panels:
        return None
    plt = pyplot()
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.6 * rows), sharex=True, squeeze=False)
    for ax, (title, lines, log) in zip(axes.flat, panels):
        for i, (key, xs, ys) in enumerate(lines):
            ax.plot(xs, ys, color=f"C{i}", label=key, marker="o" if len(xs) == 1 else None,
                    linewidth=1.2)
        if log and all((ys > 0).all() for _, _, ys in lines):
            ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=7, loc="best")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("environment steps")
    return save_figure(fig, out, dpi=90)
