"""Curves of benchmarks/explore.py's results: coverage (distinct cells) and the task policy's
greedy evaluations against env steps, one line per run, coloured by method.

    python benchmarks/explore_plot.py RESULT.json [RESULT.json ...] [--out exploration.png]
        [--title TEXT]

Each RESULT.json is one `benchmarks/explore.py --out` file (any methods and seeds); runs of
the same method share a colour, and a run's first rewarded episode is marked on its
coverage curve. The reward-free phase of the p2e runs is shaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lucid.plot import pyplot, save_figure  # noqa: E402

COLOURS = {"p2e": "tab:blue", "none": "tab:orange", "random": "tab:gray"}
NAMES = {"p2e": "Plan2Explore", "none": "the paper's agent", "random": "random actions"}


def load(paths: list[str]) -> list[dict]:
    """Every run of the files, with its file's settings (steps, reward-free phase)."""
    runs = []
    for p in paths:
        d = json.loads(Path(p).read_text())
        for r in d["rows"]:
            runs.append({**r, "steps": d["steps"],
                         "reward_free": d["reward_free"] if r["method"] == "p2e" else 0})
    return runs


def coverage(run: dict) -> tuple[list[int], list[int]]:
    """(env steps, cells) at each 2,500 steps and at the end."""
    marks = sorted((int(k), v) for k, v in run["cells_at"].items())
    return [m for m, _ in marks] + [run["steps"]], [c for _, c in marks] + [run["cells"]]


def plot(runs: list[dict], out: str, title: str) -> Path:
    plt = pyplot()
    fig, (cov, ev) = plt.subplots(1, 2, figsize=(11, 4))
    labelled: set[str] = set()
    end = max(r["steps"] for r in runs)
    free = sorted({min(r["reward_free"], end) for r in runs if r["reward_free"] > 0})
    for i, f in enumerate(free):
        for ax in (cov, ev):
            ax.axvspan(0, f, color="tab:blue", alpha=0.06, lw=0,
                       label="reward-free phase" if ax is cov and i == 0 else None)
    for r in runs:
        m, c = r["method"], COLOURS.get(r["method"], "black")
        label = None if m in labelled else NAMES.get(m, m)
        labelled.add(m)
        x, y = coverage(r)
        cov.plot(x, y, color=c, label=label, alpha=0.85)
        if r["first_reward_step"] is not None:
            first = r["first_reward_step"]
            cov.plot([first], [np.interp(first, x, y)], marker="*", ms=11, color=c,
                     mec="black", mew=0.5)
        curve = sorted((int(k), v) for k, v in (r.get("eval_curve") or {}).items())
        if curve:  # seeds a little apart, so that equal curves stay visible
            lift = 0.012 * (r["seed"] % 5)
            ev.plot([k for k, _ in curve], [v + lift for _, v in curve], color=c, marker="o",
                    ms=3, alpha=0.8, label=label)
    cov.set(xlabel="env steps", ylabel="distinct cells visited",
            title="coverage (star: first rewarded episode)")
    cov.legend(loc="lower right")
    ev.set(xlabel="env steps", ylabel="mean return, 10 greedy episodes",
           title="the task policy's evaluations (seeds lifted apart)", ylim=(-0.05, 1.1))
    ev.legend(loc="center right")
    fig.suptitle(title)
    return save_figure(fig, out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="benchmarks/explore.py --out files")
    p.add_argument("--out", default="exploration.png")
    p.add_argument("--title", default="sparse room (31 x 31, 100-step episodes)")
    a = p.parse_args()
    print(f"wrote {plot(load(a.results), a.out, a.title)}")


if __name__ == "__main__":
    main()
