"""lucid's runs beside the authors' published curves (lucid/scores/, see its README).

The authors' x axis counts frames, agent steps times the suite's action repeat (Atari 4,
DMC 2); lucid counts env steps, which are agent steps summed over envs. A curve point at `x`
frames is therefore compared with lucid at `x / repeat` env steps, where `repeat` is the run's
own (`env.kwargs.repeat`, else the suite's default): the same amount of experience.

Each authors' curve is already a binned mean of episode returns at evenly spaced `xs`; a
point counts the episodes that ended in the bin up to it. lucid's score at `s` env steps is
measured the same way: the mean return of the training episodes that ended in `(s - w, s]`,
with `w` the curve's bin width in env steps (for a run whose episodes are longer than `w`,
the last episode that ended within `2w` before `s`). At each matched step the table sets the
mean and min-max over lucid's seeds beside the mean and min-max over the authors' seeds, with
a verdict: `inside`, `above` or `below` the authors' seed range.

    compare(["runs/walker-s0", "runs/walker-s1"])      -> dict (also written as JSON)
    table(result) -> Markdown;  plot(result, "repro.png")
"""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .envs import parse_env_id
from .envs.atari import ATARI_DEFAULTS
from .envs.dmc import DMC_DEFAULTS, parse_task
from .plot import load_run, pyplot, save_figure

SCORES = Path(__file__).resolve().parent / "scores"
YEARS = ("2023", "2024")
# lucid suite -> the authors' score file per year (None: no curves of that year)
FILES = {
    "atari100k": {"2023": "atari100k", "2024": "atari100k"},
    "atari": {"2023": "atari200m", "2024": "atari57"},
    "dmc": {"2023": "dmc_proprio", "2024": "dmc_proprio"},
    "dmc-vision": {"2023": "dmc_vision", "2024": "dmc_vision"},
}
# the env steps at which the table compares (those the curves and the runs reach)
STEPS = (10_000, 20_000, 25_000, 40_000, 50_000, 75_000, 100_000, 150_000, 200_000,
         250_000, 300_000, 400_000, 500_000, 750_000, 1_000_000, 1_500_000, 2_000_000,
         3_000_000, 5_000_000, 10_000_000, 20_000_000, 30_000_000, 50_000_000)
_SUFFIX = {"k": 1_000, "m": 1_000_000}
MIN_WINDOW_FRAMES = 10_000  # the 2023 curves' bins for DMC proprio and Atari100k


class NoReference(LookupError):
    """The authors published no curve for this env (or not for that year)."""


def parse_steps(text: str) -> list[int]:
    """"20k,40k,100000" -> [20000, 40000, 100000]."""
    out = []
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM]?)", part)
        if not m:
            raise ValueError(f"{part!r} is not a number of env steps (e.g. 20000, 20k or 1.5M)")
        out.append(int(round(float(m[1]) * _SUFFIX.get(m[2].lower(), 1))))
    return sorted(set(out))


def frames_per_step(env_id: str, env_kwargs: dict | None = None) -> int:
    """Frames per env step of a lucid env: its action repeat (Atari 4 and DMC 2 unless
    `env.kwargs.repeat` says otherwise; 1 for every other env)."""
    suite, _ = parse_env_id(env_id)
    defaults = {"atari": ATARI_DEFAULTS, "atari100k": ATARI_DEFAULTS,
                "dmc": DMC_DEFAULTS, "dmc-vision": DMC_DEFAULTS}.get(suite)
    if defaults is None:
        return 1
    return int((env_kwargs or {}).get("repeat", defaults["repeat"]))


def task_names(env_id: str) -> tuple[str, list[str]]:
    """(lucid suite, the authors' names that the env's task may have): `dmc:cup-catch` ->
    ("dmc", ["dmc_ball_in_cup_catch", "dmc_cup_catch"]); `atari100k:MsPacman` ->
    ("atari100k", ["atari_ms_pacman"])."""
    suite, task = parse_env_id(env_id)
    if suite not in FILES:
        raise NoReference(f"the authors published curves for Atari, Atari100k, DMC proprio and "
                          f"DMC vision (lucid's atari:, atari100k:, dmc:, dmc-vision:), not "
                          f"for {env_id!r}")
    if suite.startswith("dmc"):
        domain, name = parse_task(task)
        short = {"ball_in_cup": "cup", "point_mass": "pointmass"}.get(domain)
        return suite, [f"dmc_{d}_{name}" for d in (domain, short) if d]
    game = task.removeprefix("ALE/").split("-v")[0]
    if not game.islower():
        game = re.sub(r"(?<!^)(?=[A-Z])", "_", game)
    return suite, [f"atari_{game.lower()}"]


@dataclass
class Reference:
    """The authors' curves of one task, x in lucid env steps (frames / repeat)."""
    task: str
    file: str
    year: str
    frames_per_step: int
    curves: list[tuple[np.ndarray, np.ndarray]]  # per seed: (env steps, returns)

    @property
    def window(self) -> float:
        """The env steps a score averages over: the spacing of the curves' points where they
        are binned (10k frames for DMC proprio and Atari100k in 2023), at least 10k frames
        where they list single episodes (2024)."""
        spacing = float(np.median(np.concatenate([np.diff(x) for x, _ in self.curves])))
        return max(spacing, MIN_WINDOW_FRAMES / self.frames_per_step)

    @property
    def last_step(self) -> float:
        """The last env step that a seed's curve reaches."""
        return float(max(x[-1] for x, _ in self.curves))

    def at(self, step: float) -> np.ndarray:
        """Each seed's score at `step` env steps (window_mean; NaN where it has none)."""
        return np.array([window_mean(x, y, step, self.window) for x, y in self.curves])


def _load_file(year: str, file: str) -> list[dict]:
    path = SCORES / year / f"{file}-dreamerv3.json.gz"
    with gzip.open(path, "rt") as f:
        return json.load(f)


def reference(env_id: str, env_kwargs: dict | None = None, year: str = "2023") -> Reference:
    """The authors' curves for a lucid env id, x converted to lucid env steps."""
    if year not in YEARS:
        raise ValueError(f"the authors' curves are of {' and '.join(YEARS)}, not {year!r}")
    suite, names = task_names(env_id)
    file = FILES[suite][year]
    rows = _load_file(year, file)
    for name in names:
        runs = [r for r in rows if r["task"] == name]
        if runs:
            break
    else:
        have = sorted({r["task"] for r in rows})
        raise NoReference(f"the authors' {year} {file} curves have no {names[0]!r}; they have "
                          f"{', '.join(have)}")
    fps = frames_per_step(env_id, env_kwargs)
    curves = [(np.asarray(r["xs"], float) / fps, np.asarray(r["ys"], float))
              for r in sorted(runs, key=lambda r: r["seed"])]
    return Reference(name, file, year, fps, curves)


def window_mean(steps: Sequence[float], returns: Sequence[float], step: float,
                window: float) -> float:
    """The score at `step`: the mean return of the episodes that ended in (step - window,
    step]; where none did (episodes longer than the window), the return of the last one that
    ended within 2 * window before `step`; NaN if none did either."""
    steps, returns = np.asarray(steps, float), np.asarray(returns, float)
    inside = (steps > step - window) & (steps <= step)
    if inside.any():
        return float(returns[inside].mean())
    before = np.flatnonzero((steps > step - 2 * window) & (steps <= step))
    return float(returns[before[np.argmax(steps[before])]]) if len(before) else math.nan


def run_curve(episodes: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(env steps at each training episode's end, its return) of a run's episodes."""
    rows = [(r["env_steps"], r["return"]) for r in episodes
            if isinstance(r.get("env_steps"), (int, float))
            and isinstance(r.get("return"), (int, float))]
    return np.array([s for s, _ in rows], float), np.array([v for _, v in rows], float)


def _band(values: np.ndarray) -> dict:
    v = values[np.isfinite(values)]
    if not len(v):
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max()), "n": int(len(v))}


def verdict(lucid: dict, authors: dict) -> str:
    """Where lucid's mean over seeds lies against the authors' range over seeds."""
    if lucid["mean"] is None or authors["mean"] is None:
        return "no data"
    if lucid["mean"] < authors["min"]:
        return "below"
    return "above" if lucid["mean"] > authors["max"] else "inside"


def _run_env(runs) -> tuple[str, dict]:
    envs = {(r.config.get("env.id"), json.dumps(_kwargs(r.config), sort_keys=True)) for r in runs}
    if len(envs) != 1:
        listed = "; ".join(f"{r.path}: {r.config.get('env.id')} {_kwargs(r.config)}" for r in runs)
        raise ValueError(f"the runs compared must share one env and its settings: {listed}")
    env_id, kwargs = envs.pop()
    if env_id is None:
        raise ValueError(f"{runs[0].path} has no config.yaml naming its env")
    return env_id, json.loads(kwargs)


def _kwargs(config: dict) -> dict:
    return {k.removeprefix("env.kwargs."): v for k, v in config.items()
            if k.startswith("env.kwargs.")}


def compare(run_dirs: Sequence[str | Path], year: str = "2023",
            steps: Sequence[int] | None = None) -> dict:
    """lucid's runs (seeds of one env) against the authors' curves at matched env steps:
    `steps`, or those of STEPS where some run and at least half of the authors' seeds have
    a score."""
    if not run_dirs:
        raise ValueError("no run directories to compare")
    runs = [load_run(d) for d in run_dirs]
    env_id, kwargs = _run_env(runs)
    ref = reference(env_id, kwargs, year)
    window = ref.window
    curves = [run_curve(r.episodes) for r in runs]
    reached = max((float(x.max()) for x, _ in curves if len(x)), default=0.0)

    def ours(step: float) -> np.ndarray:
        return np.array([window_mean(x, y, step, window) for x, y in curves], float)

    if steps is None:
        steps = [s for s in STEPS if s <= reached and np.isfinite(ours(s)).any()
                 and np.isfinite(ref.at(s)).sum() * 2 >= len(ref.curves)]
    rows = []
    for s in steps:
        row = {"env_steps": int(s), "frames": int(s * ref.frames_per_step),
               "lucid": _band(ours(s)), "authors": _band(ref.at(s))}
        row["verdict"] = verdict(row["lucid"], row["authors"])
        rows.append(row)
    grid = np.arange(window, max(reached, ref.last_step) + window / 2, window)
    return {"env": env_id, "env_kwargs": kwargs,
            "reference": {"year": year, "file": ref.file, "task": ref.task,
                          "seeds": len(ref.curves), "frames_per_step": ref.frames_per_step,
                          "window_env_steps": window},
            "runs": [str(r.path) for r in runs],
            "seeds": [r.config.get("run.seed") for r in runs],
            "reached_env_steps": int(reached),
            "rows": rows,
            "curves": {"authors": _curve_band(grid[grid <= ref.last_step], ref.at),
                       "lucid": _curve_band(grid[grid <= reached], ours)}}


def _curve_band(xs: np.ndarray, scores) -> dict:
    """Mean, min and max over seeds of `scores(x)` at each x (None where no seed has one)."""
    out: dict[str, list] = {"env_steps": xs.tolist(), "mean": [], "min": [], "max": []}
    for x in xs:
        band = _band(scores(x))
        for k in ("mean", "min", "max"):
            out[k].append(band[k])
    return out


def format_return(v: float | None) -> str:
    """A return to one decimal, or a dash for none."""
    return "–" if v is None else f"{v:.1f}"


def table(result: dict) -> str:
    """The comparison as a Markdown table."""
    ref = result["reference"]
    lines = [f"{result['env']} against the authors' {ref['year']} curves ({ref['file']}: "
             f"{ref['task']}, {ref['seeds']} seeds; {ref['frames_per_step']} frames per env "
             f"step), {len(result['runs'])} lucid run(s)", "",
             "| env steps | frames | lucid mean | lucid min–max | authors mean | "
             "authors min–max | verdict |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        lu, au = r["lucid"], r["authors"]
        fr = format_return
        lines.append(f"| {r['env_steps']:,} | {r['frames']:,} | {fr(lu['mean'])} | "
                     f"{fr(lu['min'])}–{fr(lu['max'])} | {fr(au['mean'])} | "
                     f"{fr(au['min'])}–{fr(au['max'])} | {r['verdict']} |")
    if not result["rows"]:
        lines.append(f"| (the runs reached {result['reached_env_steps']:,} env steps: no "
                     f"matched step yet) | | | | | | |")
    return "\n".join(lines)


def plot(result: dict, out: str | Path) -> Path:
    """Both bands (mean, min-max over seeds) against env steps, matched steps marked."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ref = result["reference"]
    for key, label, color in (("authors", f"authors {ref['year']} ({ref['seeds']} seeds)",
                                "tab:gray"),
                               ("lucid", f"lucid ({len(result['runs'])} seeds)", "tab:blue")):
        c = result["curves"][key]
        x = np.array(c["env_steps"], float)
        mean, lo, hi = (np.array([np.nan if v is None else v for v in c[k]], float)
                        for k in ("mean", "min", "max"))
        ax.plot(x, mean, color=color, label=label)
        ax.fill_between(x, lo, hi, color=color, alpha=0.2, linewidth=0)
    for r in result["rows"]:
        if r["lucid"]["mean"] is not None:
            ax.plot(r["env_steps"], r["lucid"]["mean"], "o", color="tab:blue", markersize=4)
    reached = result["reached_env_steps"]
    if reached:
        ax.set_xlim(0, max(reached, max((r["env_steps"] for r in result["rows"]), default=0))
                    * 1.05)
    ax.set_xlabel(f"env steps (x{ref['frames_per_step']} = the authors' frames)")
    ax.set_ylabel("episode return")
    ax.set_title(f"{result['env']}: mean and min–max over seeds", fontsize=10)
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, out, dpi=110)


def write(result: dict, out_dir: str | Path) -> dict[str, Path]:
    """repro.json, repro.md and repro.png in `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "repro.json", "table": out_dir / "repro.md",
             "plot": out_dir / "repro.png"}
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    paths["table"].write_text(table(result) + "\n")
    plot(result, paths["plot"])
    return paths
