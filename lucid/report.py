"""One self-contained HTML page per run: `write_report(run_dir) -> RUN_DIR/report.html`.

The page holds the resolved config, summary numbers (from episodes.jsonl and the last row of
metrics.jsonl), the learning curve and the diagnostics over time (PNGs made by lucid.plot,
embedded as base64) and the
videos found in RUN_DIR/videos/ in the order of their env steps (MP4 as <video>, GIF/PNG as
<img>, embedded as base64; of a run with videos of more than MAX_VIDEO_STEPS steps, those of
the first, the last and evenly spaced steps between). It
references no external file, script or stylesheet, so it can be mailed or archived as is.
"""

from __future__ import annotations

import base64
import html
import tempfile
import time
from pathlib import Path

import numpy as np

from . import reference
from .checkpoint import atomic_write_text
from .io import read_jsonl
from .seeds import seed_dirs
from .plot import plot_diagnostics, plot_runs, train_episodes
from .warn import warn

VIDEO_TYPES = {".mp4": "video/mp4", ".webm": "video/webm"}
IMAGE_TYPES = {".gif": "image/gif", ".png": "image/png"}

MAX_VIDEO_STEPS = 4  # a run with run.video_every has videos of many steps: embed this many


def _videos_to_embed(videos: list[Path]) -> tuple[list[Path], list[Path]]:
    """The videos in the order of the env steps in their names (at a step the evaluation
    episode before the dream; names without a step after them), and those left out: of
    more than MAX_VIDEO_STEPS steps, only the first, the last and evenly spaced ones between
    are embedded, so that the page stays small enough to open and mail."""
    from .video import video_step as step
    ordered = sorted(videos, key=lambda v: (step(v) is None, step(v) or 0,
                                            not v.name.startswith("eval"), v.name))
    steps = sorted({step(v) for v in ordered} - {None})
    if len(steps) <= MAX_VIDEO_STEPS:
        return ordered, []
    keep = {steps[i] for i in np.linspace(0, len(steps) - 1, MAX_VIDEO_STEPS).round().astype(int)}
    return ([v for v in ordered if step(v) is None or step(v) in keep],
            [v for v in ordered if step(v) is not None and step(v) not in keep])


CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; border-bottom: 1px solid #ddd;
text-align: left; font-variant-numeric: tabular-nums; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 0.85em; }
figure { margin: 1em 0; } figcaption { font-size: 0.9em; color: #555; }
video, img.media { max-width: 100%; border: 1px solid #ccc; }
"""


def _data_uri(path: Path, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _table(rows: list[tuple[str, object]]) -> str:
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
                   for k, v in rows)
    return f"<table>{body}</table>"


def summary(run_dir: str | Path) -> dict:
    """Final numbers of a run from its JSONL files."""
    run_dir = Path(run_dir)
    eps = read_jsonl(run_dir / "episodes.jsonl")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    train = train_episodes(eps)
    greedy = [e for e in eps if e.get("eval") and e.get("policy", "greedy") == "greedy"]
    out: dict = {}
    last = metrics[-1] if metrics else {}
    for key in ("env_steps", "updates", "episodes", "wall_time"):
        if key in last:
            out[key] = last[key]
    if train:
        rets = np.array([e["return"] for e in train], float)
        out["train episodes"] = len(rets)
        out["return, last 10 train episodes (mean)"] = float(rets[-10:].mean())
        out["return, best train episode"] = float(rets.max())
    cut = sum(1 for e in eps if e.get("cut"))
    if cut:
        out["episodes cut short by an env crash (left out above)"] = cut
    if greedy:
        at = max(e["env_steps"] for e in greedy)
        last_eval = [e["return"] for e in greedy if e["env_steps"] == at]
        out["eval return at last evaluation (mean)"] = float(np.mean(last_eval))
        out["eval: env steps of last evaluation"] = at
    return out


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the run's report (default RUN_DIR/report.html) and return its path."""
    run_dir = Path(run_dir)
    if out is not None and Path(out).suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"the report's file must end in .html, got {str(out)!r} (a page "
                         f"written there would replace that file: a run's episodes.jsonl, "
                         f"say)")
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory")
    if seeds := seed_dirs(run_dir):
        return _write_seeds_report(run_dir, seeds, out)
    if not any((run_dir / n).exists() for n in ("config.yaml", "metrics.jsonl", "episodes.jsonl")):
        raise FileNotFoundError(f"{run_dir} is not a lucid run directory (it has no "
                                f"config.yaml, metrics.jsonl or episodes.jsonl)")
    out = Path(out) if out else run_dir / "report.html"
    cfg_path = run_dir / "config.yaml"
    config = cfg_path.read_text() if cfg_path.exists() else "(no config.yaml)"
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    parts = [f"<h1>lucid run: {html.escape(run_dir.name)}</h1>",
             f"<p>Directory <code>{html.escape(str(run_dir.resolve()))}</code>; report written "
             f"{html.escape(time.strftime('%Y-%m-%d %H:%M:%S'))}.</p>"]

    parts.append("<h2>Summary</h2>")
    s = summary(run_dir)
    parts.append(_table(list(s.items())) if s else "<p>No episodes or metrics logged yet.</p>")

    parts += _learning_curve([run_dir])
    parts += _diagnostics(run_dir)
    parts += _against_authors([run_dir])

    videos = sorted((run_dir / "videos").glob("*")) if (run_dir / "videos").is_dir() else []
    videos = [v for v in videos if v.suffix.lower() in VIDEO_TYPES or
              v.suffix.lower() in IMAGE_TYPES]
    videos, left_out = _videos_to_embed(videos)
    parts.append("<h2>Videos</h2>")
    if videos:
        for v in videos:
            ext = v.suffix.lower()
            cap = html.escape(v.name)
            if ext in VIDEO_TYPES:
                media = (f'<video controls loop muted preload="metadata">'
                         f'<source src="{_data_uri(v, VIDEO_TYPES[ext])}" '
                         f'type="{VIDEO_TYPES[ext]}">your browser cannot play {cap}</video>')
            else:
                media = f'<img class="media" alt="{cap}" src="{_data_uri(v, IMAGE_TYPES[ext])}">'
            parts.append(f"<figure>{media}<figcaption>{cap}</figcaption></figure>")
        if left_out:
            names = ", ".join(f"<code>{html.escape(v.name)}</code>" for v in left_out)
            parts.append(f"<p>Not embedded (the page holds the videos of {MAX_VIDEO_STEPS} "
                         f"env steps, evenly spaced), in <code>videos/</code>: {names}</p>")
    else:
        parts.append("<p>No videos in <code>videos/</code>; make some with "
                     "<code>lucid eval RUN_DIR --video</code> and <code>lucid dream RUN_DIR"
                     "</code>.</p>")

    if metrics:
        last = metrics[-1]
        rows = [(k, v) for k, v in last.items() if isinstance(v, (int, float))]
        parts.append("<h2>Last logged metrics</h2>")
        parts.append(_table(rows))

    parts.append("<h2>Config</h2>")
    parts.append(f'<pre id="config">{html.escape(config)}</pre>')

    return _write_page(out, run_dir.name, parts)


def _write_page(out: Path, name: str, parts: list[str]) -> Path:
    page = ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>lucid report: {html.escape(name)}</title>\n"
            f"<style>{CSS}</style>\n</head>\n<body>\n" + "\n".join(parts)
            + "\n</body>\n</html>\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, page)
    return out


def _write_seeds_report(run_dir: Path, seeds: list[Path], out: str | Path | None) -> Path:
    """The page of a multi-seed run (`lucid train --seeds`): each seed's final numbers, the
    seeds' mean return with its min–max band, and the seeds beside the authors' curves;
    each seed's own page is its `lucid report RUN_DIR/seed-S`."""
    out = Path(out) if out else run_dir / "report.html"
    parts = [f"<h1>lucid run: {html.escape(run_dir.name)} ({len(seeds)} seeds)</h1>",
             f"<p>Directory <code>{html.escape(str(run_dir.resolve()))}</code>; report written "
             f"{html.escape(time.strftime('%Y-%m-%d %H:%M:%S'))}. Each seed is a run of its "
             f"own: <code>lucid report {html.escape(str(run_dir))}/seed-S</code>.</p>",
             "<h2>Seeds</h2>"]
    keys = ("env_steps", "updates", "return, last 10 train episodes (mean)",
            "return, best train episode")
    rows = [("seed", *keys)] + [(d.name, *(_fmt(summary(d).get(k, "-")) for k in keys))
                                for d in seeds]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows[1:])
    parts.append(f'<table id="seeds"><tr>{head}</tr>{body}</table>')
    parts += _learning_curve(seeds, "mean over the seeds, band: min–max")
    parts += _against_authors(seeds)
    cfg = seeds[0] / "config.yaml"
    parts += ["<h2>Config (the first seed's; the others differ in run.seed)</h2>",
              f'<pre id="config">{html.escape(cfg.read_text())}</pre>']
    return _write_page(out, run_dir.name, parts)


def _learning_curve(run_dirs: list[Path], over: str = "") -> list[str]:
    """The training return, and the greedy evaluations where the runs made any."""
    parts = ["<h2>Learning curve</h2>"]
    episodes = [e for d in run_dirs for e in read_jsonl(d / "episodes.jsonl")]
    if not episodes:
        return parts + ["<p>No episodes logged yet.</p>"]
    evals = any(e.get("eval") and e.get("policy", "greedy") == "greedy" for e in episodes)
    with tempfile.TemporaryDirectory() as tmp:
        png = plot_runs(run_dirs, Path(tmp) / "curve.png")
        parts.append(f'<figure><img class="media" id="learning-curve" alt="learning curve" '
                     f'src="{_data_uri(png, "image/png")}"><figcaption>Training episode '
                     f'return (running mean of 10{"; " + over if over else ""}) against '
                     f'environment steps'
                     + ("; circles: greedy evaluation episodes." if evals else
                        " (no evaluation episodes: run.eval_every=0).")
                     + "</figcaption></figure>")
    return parts


def _diagnostics(run_dir: Path) -> list[str]:
    """The world model's losses, KL, entropies, return scale, values, gradient norms and
    update rate over the run, from metrics.jsonl."""
    with tempfile.TemporaryDirectory() as tmp:
        png = plot_diagnostics(run_dir, Path(tmp) / "diagnostics.png")
        if png is None:
            return []
        return ["<h2>Diagnostics</h2>",
                f'<figure><img class="media" id="diagnostics" alt="diagnostics" '
                f'src="{_data_uri(png, "image/png")}"><figcaption>Metrics logged during '
                f'training (metrics.jsonl; each point the mean over one logging interval) '
                f'against environment steps: read a change in the return above next to the '
                f'world model, the actor and the critic. World-model losses and gradient '
                f'norms on log scales.</figcaption></figure>']


def _against_authors(run_dirs: list[Path]) -> list[str]:
    """The runs (seeds of one task) beside the authors' published curves of their task
    (lucid.reference), where there are any and the runs have episodes."""
    if not all((d / "config.yaml").exists() for d in run_dirs) or not any(
            train_episodes(read_jsonl(d / "episodes.jsonl")) for d in run_dirs):
        return []
    try:
        result = reference.compare(run_dirs)
    except reference.NoReference:
        return []
    rows = [("env steps (frames)", "lucid", "authors mean (min–max)", "verdict")]
    fr = reference.format_return
    def ours(r: dict) -> str:
        m = r["lucid"]
        return fr(m["mean"]) + (f" ({fr(m['min'])}–{fr(m['max'])})" if len(run_dirs) > 1
                                else "")
    rows += [(f"{r['env_steps']:,} ({r['frames']:,})", ours(r),
              f"{fr(r['authors']['mean'])} ({fr(r['authors']['min'])}–{fr(r['authors']['max'])})",
              r["verdict"]) for r in result["rows"]]
    ref = result["reference"]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows[1:])
    parts = ["<h2>Against the authors' curves</h2>",
             f"<p>The authors' {ref['year']} curves of <code>{html.escape(ref['task'])}</code> "
             f"({ref['seeds']} seeds, x in frames = {ref['frames_per_step']} per env step). "
             f"Several seeds: <code>lucid repro --runs DIR --runs DIR</code>.</p>",
             f'<table id="against-authors"><tr>{head}</tr>{body}</table>' if result["rows"]
             else f"<p>No matched step yet (the run reached {result['reached_env_steps']:,} "
                  f"env steps).</p>"]
    with tempfile.TemporaryDirectory() as tmp:
        png = reference.plot(result, Path(tmp) / "against.png")
        parts.append(f'<figure><img class="media" alt="against the authors\' curves" '
                     f'src="{_data_uri(png, "image/png")}"><figcaption>Episode return: lucid '
                     f'and the authors\' mean and min–max over seeds, against env steps.'
                     f'</figcaption></figure>')
    return parts


def finish_run(trainer, writer=None, videos: bool = True, horizon: int = 45
               ) -> dict[str, Path]:
    """End-of-run artifacts for the training loop: RUN_DIR/curves.png, an evaluation video and
    an open-loop dream video in RUN_DIR/videos/ (also added to TensorBoard through `writer`),
    and RUN_DIR/report.html. A failure here only warns: it never costs a finished run."""
    run_dir = Path(trainer.run_dir)
    out: dict[str, Path] = {}
    steps = [("curves", lambda: {"curves": plot_runs([run_dir], run_dir / "curves.png")})]
    if videos and trainer.videos_logged_at != trainer.counters["env_steps"]:
        from .video import log_videos  # (not again where run.video_every made them at the end)
        steps.append(("videos", lambda: log_videos(trainer, writer,
                                                   trainer.counters["env_steps"], horizon)))
    steps.append(("report", lambda: {"report": write_report(run_dir)}))
    for name, fn in steps:
        try:
            out.update(fn())
        except Exception as exc:  # noqa: BLE001 - artifacts are a courtesy, the run is done
            warn(f"could not write the run's {name}: {type(exc).__name__}: {exc}")
    return out
