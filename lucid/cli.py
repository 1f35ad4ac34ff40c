"""`lucid` command line: train, eval, config, check, dream, plot, report, export, repro. A thin
layer over lucid.train, lucid.repro and the visualizing modules (video, plot, report)."""

from __future__ import annotations

import errno
import inspect
import itertools
import json
import sys
from pathlib import Path
from typing import List, NoReturn, Optional

import typer

from .config import (NATURE_SIZES, PRESETS, RESUME_SETTABLE, SECTIONS, SIZES, ConfigError,
                     suggest, make_config, to_yaml)
from .seeds import eval_seed
from .warn import raised_at

app = typer.Typer(add_completion=False, no_args_is_help=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="DreamerV3 world-model agents. `lucid train` learns CartPole-v1 on a CPU.")


def _print_version(value: bool) -> None:
    if value:
        from . import __version__
        typer.echo(f"lucid {__version__} (torch {_torch_version()})")
        raise typer.Exit()


def _torch_version() -> str:
    from importlib.metadata import version
    return version("torch")


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_print_version,
                                       is_eager=True, help="print the version and exit")):
    # The commands below; --version is handled by its callback. lucid's warnings and notes
    # print as one line each (notes on stdout, among the command's own lines).
    from .warn import show_plainly
    show_plainly(lambda text: typer.secho(text, fg="yellow", err=True), typer.echo)

DEFAULT_ENV = "CartPole-v1"


def _fail(message) -> NoReturn:
    """Print a one-line error (the message names the problem and the fix) and exit 2; an
    error raised in the user's own code (an env's __init__, say) also says where."""
    where = raised_at(message) if isinstance(message, BaseException) else None
    typer.secho(f"error: {message}" + (f" (raised at {where})" if where else ""), fg="red",
                err=True)
    raise typer.Exit(2)



def _build(env: str, preset: Optional[str], size: Optional[str], steps: Optional[int],
           seed: Optional[int], run_dir: Optional[str], device: Optional[str],
           overrides: List[str]):
    sections: dict = {"env": {"id": env}, "run": {}, "model": {}}
    if size:
        if size not in SIZES and size not in NATURE_SIZES:
            raise ConfigError(f"unknown --size {size!r}; choose one of {', '.join(SIZES)} "
                              f"(--preset nature: {', '.join(NATURE_SIZES)})"
                              + suggest(size, [*SIZES, *NATURE_SIZES]))
        sections["model"]["size"] = size
    for key, val in (("steps", steps), ("seed", seed), ("run_dir", run_dir), ("device", device)):
        if val is not None:
            sections["run"][key] = val
    if not preset:  # the env's domain, or where that is no paper suite, the machine's
        from .device import preset_for  # (torch: not for `lucid --version`)
        preset = preset_for(make_config("default", overrides, **sections))
    return make_config(preset, overrides, **sections)


def _interrupted(trainer) -> None:
    """After Ctrl-C or SIGTERM (the checkpoint is saved): curves.png and report.html as at a
    normal end (not the videos, which take longer), and how to go on."""
    d, c, steps = trainer.run_dir, trainer.counters, trainer.cfg.run.steps
    written = ""
    if trainer.cfg.run.videos and trainer.ranks.is_main:
        from .report import finish_run
        typer.echo("writing curves.png and report.html ...", err=True)
        made = finish_run(trainer, videos=False)
        if "report" in made:
            written = (f"; its curves and report are in {d} (`lucid report {d}` makes the page "
                       f"again later)")
    if c["env_steps"] >= steps:  # stopped while the end was being written
        typer.echo(f"interrupted after the run's {steps} env steps, with a checkpoint: the "
                   f"run is complete{written}", err=True)
    else:
        typer.echo(f"interrupted at {c['env_steps']} of {steps} env steps, with a checkpoint"
                   f"{written}; continue with {trainer.resume_hint()}", err=True)


def _refuse_key_without_value(env: str) -> None:
    """An ENV argument that is a config key whose `=VALUE` was left out (`model.size`)."""
    if env.split(".")[0] in SECTIONS and ":" not in env and "/" not in env:
        _fail(f"{env!r} looks like a config key without a value: write {env}=VALUE "
              f"(`lucid config` lists the keys)")


def _not_applied_on_resume(env: str, overrides: List[str], **options) -> List[str]:
    """What a `train --resume` command line names that the saved config would override."""
    names = [] if env == DEFAULT_ENV else [f"the env {env!r}"]
    names += [f"--{k.replace('_', '-')}" for k, v in options.items() if v is not None]
    return names + [o for o in overrides if o.split("=")[0] not in RESUME_SETTABLE]


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def train(
    ctx: typer.Context,
    env: str = typer.Argument(DEFAULT_ENV, help="gymnasium id, a suite name (atari:Pong, atari100k:Pong, dmc:walker-walk, dmc-vision:walker-walk, crafter, minigrid:DoorKey-5x5, memory-maze:9x9, envpool:Pong-v5), module.path:EnvClass or path/to/file.py:EnvClass"),
    preset: Optional[str] = typer.Option(None, help=f"one of: {', '.join(PRESETS)}"),
    size: Optional[str] = typer.Option(None, help=f"model size: {', '.join(SIZES)} (--preset "
                                       f"nature: {', '.join(NATURE_SIZES)})"),
    steps: Optional[int] = typer.Option(None, help="environment steps to train for"),
    seed: Optional[int] = typer.Option(None, help="seed of python, numpy and torch (the "
                                       "envs' and the replay's derive from it)"),
    run_dir: Optional[str] = typer.Option(None, help="where config, logs and checkpoints go"),
    device: Optional[str] = typer.Option(None, help="auto, cpu or cuda"),
    resume: Optional[str] = typer.Option(None, help="continue the run in this directory"),
    runners: Optional[str] = typer.Option(None, help="env runners: local or ray "
                                          "(docs/scaling.md)"),
    num_runners: Optional[int] = typer.Option(None, help="Ray env runners (actors)"),
    envs_per_runner: Optional[int] = typer.Option(None, help="envs stepped by each runner"),
    ray_address: Optional[str] = typer.Option(None, help="existing Ray cluster (default: "
                                              "start a local one)"),
    logger: Optional[str] = typer.Option(None, help="logging backends besides JSONL: "
                                         "tensorboard, wandb, tensorboard,wandb or none"),
    seeds: Optional[str] = typer.Option(None, help="several seeds in one process, updated as "
                                        "one batched update: 0-3 or 0,2,5 (each a run in "
                                        "RUN_DIR/seed-S)"),
):
    """Train an agent. Extra arguments are config overrides: section.key=value.

    Data-parallel learners: `torchrun --nproc-per-node G -m lucid train ...`."""
    from .notes import preset_note
    from .runner import EnvError
    from .stops import DiskFullError, NonFiniteError
    from .train import Trainer
    overrides = list(ctx.args)
    if "=" in env:  # no ENV given, the first override landed in its place
        overrides.insert(0, env)
        env = DEFAULT_ENV
    _refuse_key_without_value(env)
    # These flags are run.* config keys; like --steps and --size they lose to an explicit
    # section.key=value override, so they go first.
    overrides[:0] = [f"run.{key}={val}" for key, val in (
        ("runners", runners), ("num_runners", num_runners), ("envs_per_runner", envs_per_runner),
        ("ray_address", ray_address), ("logger", logger)) if val is not None]
    if seeds is not None or (resume and _is_multiseed(resume)):
        return _train_seeds(env, preset, size, steps, seed, seeds, run_dir, device, resume,
                            overrides)
    try:
        if resume:
            ignored = _not_applied_on_resume(env, overrides, preset=preset, size=size, seed=seed,
                                             run_dir=run_dir)
            if ignored:
                raise ConfigError(
                    f"--resume continues with {Path(resume) / 'config.yaml'}, so "
                    f"{', '.join(ignored)} would not be applied; --resume takes --steps, "
                    f"--device and these: {', '.join(RESUME_SETTABLE[2:])}. Edit non-model "
                    "keys in that file, or start a new run directory")
            run = {"steps": steps or 0, **({"device": device} if device else {})}
            cfg = make_config("default", overrides, run=run)
            settings = tuple(o.split("=")[0] for o in overrides)
            trainer = Trainer(cfg, resume, resume=True, settings=settings)
        else:
            cfg = _build(env, preset, size, steps, seed, run_dir, device, overrides)
            trainer = Trainer(cfg)
    except (ConfigError, ValueError, FileNotFoundError, TypeError, ImportError,
            EnvError) as exc:  # EnvError: an env that kept raising in its first reset
        _fail(exc)
    typer.echo(f"run directory: {trainer.run_dir}  (preset {trainer.cfg.preset}, "
               f"size {trainer.cfg.model.size}, {trainer.cfg.run.steps} env steps)")
    note = None if resume or preset else preset_note(trainer.cfg, trainer.device, "--preset {}")
    if note:
        typer.echo(f"note: {note}")
    dims = trainer.cfg.model.dims()
    if not resume and trainer.obs_spec.vectors and \
            (dims["vector_layers"], dims["vector_units"]) != (dims["dense_layers"],
                                                              dims["dense_units"]):
        typer.echo(f"note: the MLPs of the vector observations are {dims['vector_layers']} × "
                   f"{dims['vector_units']} (model.vector_layers, model.vector_units; the "
                   f"authors' code runs 5 × 1024 at every size, docs/algorithm.md); "
                   f"model.vector_layers=null model.vector_units=null gives size "
                   f"{trainer.cfg.model.size}'s {dims['dense_layers']} × {dims['dense_units']}")
    if resume and trainer.counters["env_steps"] >= trainer.cfg.run.steps:
        trainer.close()
        typer.echo(f"note: the run has its {trainer.cfg.run.steps} env steps already; "
                   f"train further with --resume {resume} --steps N (N > "
                   f"{trainer.counters['env_steps']})")
        return
    try:
        try:
            trainer.run(end_videos=trainer.cfg.run.videos)
        except (EnvError, NonFiniteError, DiskFullError) as exc:  # each leaves a checkpoint
            _fail(exc)
        if trainer.signalled is not None:  # Ctrl-C or SIGTERM: saved; say so, exit 128 + N
            _interrupted(trainer)
            raise typer.Exit(128 + trainer.signalled)
        if trainer.cfg.run.videos and trainer.ranks.is_main:  # data-parallel: rank 0 only
            from .report import finish_run
            typer.echo("writing curves.png and report.html ...")
            made = finish_run(trainer)  # (the run's end made the videos)
            if "report" in made:
                typer.echo(f"report: {made['report']}")
    finally:
        trainer.close()
    if trainer.stop_reason is not None and trainer.signalled is None:
        typer.echo(f"stopped at {trainer.counters['env_steps']:,} of {trainer.cfg.run.steps:,} "
                   f"env steps: {trainer.stop_reason}")
    typer.echo(f"done: {json.dumps(trainer.counters)}")


def _is_multiseed(run_dir: str) -> bool:
    from .seeds import seed_dirs
    return not (Path(run_dir) / "config.yaml").exists() and bool(seed_dirs(run_dir))


def _train_seeds(env, preset, size, steps, seed, seeds, run_dir, device, resume,
                 overrides) -> None:
    """`lucid train ENV --seeds 0-3` and the resume of such a run: every seed in one process,
    the updates batched (lucid.multiseed)."""
    from .multiseed import SeedsTrainer
    from .report import finish_run, write_report
    from .runner import EnvError
    from .seeds import parse_seeds
    from .stops import DiskFullError, NonFiniteError
    try:
        if resume:
            ignored = _not_applied_on_resume(env, overrides, preset=preset, size=size, seed=seed,
                                             run_dir=run_dir) + (["--seeds"] if seeds else [])
            if ignored:
                raise ConfigError(f"--resume continues each seed with its config.yaml, so "
                                  f"{', '.join(ignored)} would not be applied")
            run = {"steps": steps or 0, **({"device": device} if device else {})}
            cfg = make_config("default", overrides, run=run)
            st = SeedsTrainer.resume(cfg, resume, tuple(o.split("=")[0] for o in overrides))
        else:
            if seed is not None:
                raise ConfigError("give --seed or --seeds, not both")
            cfg = _build(env, preset, size, steps, None, run_dir, device, overrides)
            st = SeedsTrainer.start(cfg, parse_seeds(seeds))
    except (ConfigError, ValueError, FileNotFoundError, TypeError, ImportError,
            EnvError) as exc:
        _fail(exc)
    first = st.trainers[0]
    typer.echo(f"run directory: {st.run_dir}  (seeds {', '.join(map(str, st.seeds))}, each in "
               f"seed-S/; preset {first.cfg.preset}, size {first.cfg.model.size}, "
               f"{first.cfg.run.steps} env steps each)")
    try:
        try:
            st.run()
        except (EnvError, NonFiniteError, DiskFullError) as exc:
            _fail(exc)
        if first.cfg.run.videos:  # curves and report per seed, and the seeds' page
            typer.echo("writing curves.png and report.html ...", err=st.signalled is not None)
            for t in st.trainers:
                finish_run(t, videos=False)
            try:
                typer.echo(f"report: {write_report(st.run_dir)}",
                           err=st.signalled is not None)
            except Exception as exc:  # noqa: BLE001 - a courtesy: the runs are saved
                typer.secho(f"could not write the seeds' report: {exc}", fg="yellow", err=True)
        if st.signalled is not None:
            typer.echo(f"interrupted with a checkpoint of every seed; continue with lucid "
                       f"train --resume {st.run_dir}", err=True)
            raise typer.Exit(128 + st.signalled)
    finally:
        st.close()
    typer.echo(f"done: {json.dumps({t.cfg.run.seed: t.counters for t in st.trainers})}")


def _load_run(run_dir: str, file_ok: bool = False):
    """An existing run loaded to act (newest checkpoint and its replay), without env runners;
    with `file_ok`, also of an agent file that `Dreamer.save` wrote (no replay)."""
    from .acting import load_to_act
    if file_ok and Path(run_dir).is_file():
        from .api import Dreamer
        try:
            return Dreamer.load(run_dir).trainer
        except (ConfigError, ValueError, TypeError, ImportError) as exc:
            _fail(exc)
    try:
        run = load_to_act(run_dir)
    except (ConfigError, ValueError, FileNotFoundError, TypeError, ImportError) as exc:
        _fail(exc)
    typer.echo(run.loaded, err=True)  # (stdout is the command's output: eval's JSON)
    return run


@app.command("eval")
def eval_cmd(run_dir: str = typer.Argument(..., help="a run directory, or an agent file "
                                                     "from Dreamer.save"),
             episodes: int = typer.Option(10, help="episodes to run"),
             sampled: bool = typer.Option(False, help="sample the actor's actions (as the "
                                                      "authors' evaluation does), not its mode"),
             video: bool = typer.Option(False, help="also save a video of every episode to "
                                                    "RUN_DIR/videos/"),
             video_format: str = typer.Option("mp4", "--format", help="mp4 or gif"),
             seed: Optional[int] = typer.Option(None, help="the evaluation envs' first seed "
                                                "(default: run.seed + 10000)")):
    """Evaluate the newest checkpoint of RUN_DIR (greedy policy unless --sampled).

    Prints one line of JSON on stdout (for `| jq`); what else it says goes to stderr."""
    from .warn import show_plainly
    show_plainly(lambda text: typer.secho(text, fg="yellow", err=True),
                 lambda text: typer.echo(text, err=True))
    if episodes < 1:
        _fail(f"--episodes must be >= 1, got {episodes}")
    if seed is not None and seed < 0:  # the envs' seeds: numpy's, which are >= 0
        _fail(f"--seed must be >= 0, got {seed}")
    if video:
        return _eval_video(run_dir, episodes, sampled, video_format, seed)
    trainer = _load_run(run_dir, file_ok=True)
    try:
        eps = trainer.evaluate(episodes, explore=sampled, seed=seed)
    except Exception as exc:  # noqa: BLE001 - the env's (a NaN, a crash): one line
        _evaluation_failed(exc)
    if not eps:
        _fail("no evaluation episode ended (see the warning above): give the env a time "
              "limit, e.g. edit env.max_episode_steps in the run's config.yaml")
    rets = [e.ret for e in eps]
    typer.echo(json.dumps({"episodes": len(rets), "mean_return": sum(rets) / len(rets),
                           "returns": rets, "lengths": [e.length for e in eps]}))


@app.command("config")
def config_cmd(args: List[str] = typer.Argument(None, help="[ENV] section.key=value ...",
                                                metavar="[ENV] [OVERRIDES]..."),
               preset: Optional[str] = typer.Option(None, help="default: the env's, as "
                                                    "lucid train picks it"),
               size: Optional[str] = typer.Option(None, help="model size")):
    """Print the config that `lucid train` would run with, given the same arguments.

    ENV, --preset, --size and section.key=value overrides are taken as `lucid train` takes
    them; the output is the YAML a run saves as its config.yaml."""
    args = list(args or [])
    env = args.pop(0) if args and "=" not in args[0] else DEFAULT_ENV
    _refuse_key_without_value(env)  # else printed as the config of an env of that name
    try:
        cfg = _build(env, preset, size, None, None, None, None, args)
        if not preset:  # why this preset, as a YAML comment (the output stays a config.yaml)
            from .device import resolve_device
            from .notes import preset_note
            if note := preset_note(cfg, resolve_device(cfg.run.device), "--preset {}"):
                typer.echo(f"# note: {note}")
        typer.echo(to_yaml(cfg))
    except (ConfigError, ValueError, TypeError, ImportError) as exc:
        _fail(exc)


@app.command("check")
def check_cmd(env: str = typer.Argument(..., help="an env as `lucid train` takes it"),
              overrides: List[str] = typer.Argument(None, help="section.key=value, e.g. "
                                                    "env.kwargs.size=8"),
              steps: int = typer.Option(500, help="random steps to take")):
    """Check that lucid can train on ENV, before a run.

    Shows how lucid sees the observations and actions, then takes random steps through the
    checks training makes, and tells whether videos work."""
    from .envcheck import check
    if steps < 1:
        _fail(f"--steps must be >= 1, got {steps}")
    try:
        cfg = _build(env, None, None, None, None, None, None, list(overrides or []))
        check(cfg, steps, typer.echo)
    except (ConfigError, ValueError, TypeError, KeyError, ImportError) as exc:
        _fail(exc)
    typer.echo(f"ok: lucid can train on {env}")


# --------------------------------------------------------------------------- visualizing


def _unused(paths: list[Path]) -> list[Path]:
    """`paths`, or where one of them exists (an earlier eval or dream of the same checkpoint),
    the same names with -2, -3, ... before the suffix: a video is never overwritten."""
    for k in itertools.count(1):
        names = paths if k == 1 else [p.with_name(f"{p.stem}-{k}{p.suffix}") for p in paths]
        if not any(p.exists() for p in names):
            return names


def _evaluation_failed(exc: Exception) -> NoReturn:
    """An evaluation that the env stopped (a NaN it gave, an exception of its own), in one
    line: the error and where in the user's code it was raised."""
    where = raised_at(exc)
    _fail(f"the evaluation failed: {type(exc).__name__}: {exc}"
          + (f" (raised at {where})" if where else ""))


def _eval_video(run_dir: str, episodes: int, sampled: bool, video_format: str,
                seed: int | None):
    """`lucid eval --video`: the episodes are run in a rendering env, one video each (in
    RUN_DIR/videos/, or beside an agent file)."""
    from .runner import EVAL_MAX_STEPS
    from .video import record_episodes
    if video_format not in ("mp4", "gif"):
        _fail(f"--format must be mp4 or gif, got {video_format!r}")
    trainer = _load_run(run_dir, file_ok=True)
    cfg = trainer.cfg
    steps = trainer.counters["env_steps"]
    where = Path(run_dir).parent if Path(run_dir).is_file() else Path(run_dir)
    paths = [str(p) for p in _unused([where / "videos" / f"eval-{steps:09d}-ep{i}."
                                      f"{video_format}" for i in range(episodes)])]
    try:
        recs = record_episodes(trainer.agent, cfg.env.id, episodes, cfg.env.max_episode_steps,
                               env_kwargs=dict(cfg.env.kwargs),
                               explore=sampled, paths=paths,
                               seed=eval_seed(cfg.run.seed) if seed is None else seed,
                               max_steps=EVAL_MAX_STEPS)
    except (TypeError, NotImplementedError) as exc:  # an env without render_mode or pictures
        _fail(f"this env cannot be drawn for a video ({type(exc).__name__}: {exc}); "
              f"lucid eval without --video gives the returns")
    except Exception as exc:  # noqa: BLE001 - the env's; an unwritable file is main()'s
        if isinstance(exc, OSError) and unwritable(exc):
            raise
        _evaluation_failed(exc)
    if any(r.length >= EVAL_MAX_STEPS for r in recs):
        typer.echo(f"warning: an episode did not end within {EVAL_MAX_STEPS:,} steps and was "
                   f"cut there (its return is partial); give env.max_episode_steps", err=True)
    rets = [r.ret for r in recs]
    typer.echo(json.dumps({"episodes": len(rets), "mean_return": sum(rets) / len(rets),
                           "returns": rets, "lengths": [r.length for r in recs],
                           "videos": paths}))


@app.command("dream")
def dream_cmd(run_dir: str = typer.Argument(..., help="a run directory: its newest "
                                                    "checkpoint and its replay"),
              horizon: int = typer.Option(45, help="dreamed steps after the context"),
              context: int = typer.Option(5, help="real steps the model observes first"),
              rows: int = typer.Option(3, help="replayed windows shown one below another"),
              out: Optional[str] = typer.Option(None, help="video file (.mp4 or .gif); default "
                                                           "RUN_DIR/videos/dream-<steps>.mp4, "
                                                           "-2, -3, ... if taken"),
              fps: float = typer.Option(10.0, help="frames per second of the video"),
              seed: int = typer.Option(0, help="which replayed windows are picked")):
    """Open-loop dream video from real starting states: truth | prediction | error.

    The model observes --context replayed steps, then predicts --horizon steps with the
    recorded actions only. Saved to RUN_DIR/videos/ unless --out is given. Vector envs whose
    states cannot be drawn get a PNG plot of truth and prediction per dimension instead."""
    from .video import dream, dream_frames, plot_open_loop, write_video
    if out and Path(out).suffix.lower() not in (".mp4", ".gif", ".png"):
        _fail(f"--out must end in .mp4 or .gif (or .png: a plot), got {out!r}")
    if min(horizon, rows, context) < 1 or fps <= 0:
        _fail(f"--horizon, --rows and --context must be >= 1 and --fps > 0 (got "
              f"{horizon}, {rows}, {context}, {fps})")
    if seed < 0:
        _fail(f"--seed must be >= 0, got {seed}")
    trainer = _load_run(run_dir)
    plot = out is not None and Path(out).suffix.lower() == ".png"
    try:
        result = dream(trainer, horizon=horizon, context=context, rows=rows, seed=seed)
        frames = None if plot else dream_frames(trainer, result)
    except (ValueError, TypeError) as exc:
        _fail(exc)
    if plot and not result.vectors:
        _fail("a .png plot draws vector observations, and this run has images only; "
              "use --out NAME.mp4")
    steps = trainer.counters["env_steps"]
    default = Path(run_dir) / "videos" / f"dream-{steps:09d}"
    if frames is None:  # a plot: asked for, or the env cannot draw its states
        if out and not plot:
            _fail(f"the states of {trainer.cfg.env.id} cannot be drawn as video frames (only "
                  f"images and classic-control states can); use --out NAME.png for a plot")
        path = Path(out) if out else _unused([default.with_suffix(".png")])[0]
        path = plot_open_loop(result, path)
        typer.echo(json.dumps({"plot": str(path), "context": context, "horizon": horizon}))
        return
    path = Path(out) if out else _unused([default.with_suffix(".mp4")])[0]
    write_video(path, frames, fps=fps)
    typer.echo(json.dumps({"video": str(path), "frames": len(frames), "context": context,
                           "horizon": horizon}))


@app.command("plot")
def plot_cmd(run_dirs: List[str] = typer.Argument(..., help="run directories; runs of one "
                                                            "config are averaged over seeds"),
             out: str = typer.Option("curves.png", help="PNG file to write"),
             x: str = typer.Option("env_steps", help="env_steps or wall_time"),
             y: str = typer.Option("return", help="return or length of episodes, or a "
                                   "metrics.jsonl key, e.g. world_model/loss"),
             band: str = typer.Option("minmax", help="spread over seeds: minmax or std"),
             label: Optional[List[str]] = typer.Option(None, help="a curve's name, one per "
                                                       "config in the order of its first run "
                                                       "(default: the config keys that differ)")):
    """Learning curves of one or more runs: mean and spread over the seeds of each config.

    Episode returns by default, or with --y any logged metric."""
    from .plot import plot_runs
    if Path(out).is_dir():
        _fail(f"--out {out} is a directory; give a file name, e.g. {Path(out) / 'curves.png'}")
    try:
        path = plot_runs(run_dirs, out, x=x, y=y, band=band, labels=label or None)
    except (ValueError, FileNotFoundError) as exc:
        _fail(exc)
    typer.echo(str(path))


@app.command("report")
def report_cmd(run_dir: str = typer.Argument(..., help="a run directory"),
               out: Optional[str] = typer.Option(None, help="HTML file; default "
                                                 "RUN_DIR/report.html")):
    """One self-contained HTML page: config, learning curve, videos and final numbers."""
    from .report import write_report
    try:
        path = write_report(run_dir, out)
    except (FileNotFoundError, ValueError) as exc:
        _fail(exc)
    typer.echo(str(path))


@app.command("export")
def export_cmd(run_dir: str = typer.Argument(..., help="a run directory, or an agent file "
                                                       "from Dreamer.save"),
               out: str = typer.Option("policy.onnx", help="the ONNX file to write (its "
                                       "description goes beside it, .json)"),
               export_format: str = typer.Option("onnx", "--format", help="onnx"),
               sampled: bool = typer.Option(False, help="sample the actor's actions from a "
                                            "`noise` input, not its mode")):
    """Export the policy step of RUN_DIR's newest checkpoint as one ONNX graph.

    Raw observations and the recurrent state in, env actions and the next state out; greedy
    unless --sampled (docs/deploy.md; examples/run_exported.py runs it with onnxruntime and
    numpy only)."""
    if export_format != "onnx":
        _fail(f"--format must be onnx, got {export_format!r}")
    if Path(out).suffix.lower() != ".onnx":
        _fail(f"--out must end in .onnx, got {out!r}")
    import importlib.util
    if importlib.util.find_spec("onnxscript") is None:  # torch.onnx's exporter needs it
        _fail("lucid export needs the packages onnx and onnxscript: pip install "
              "'lucid-rl[export]' (from a checkout: pip install -e '.[export]')")
    from .export import export_onnx
    run = _load_run(run_dir, file_ok=True)
    path = export_onnx(run.agent, run.obs_spec, run.act_spec, out,
                       meta={"env": run.cfg.env.id, "preset": run.cfg.preset,
                             "env_steps": run.counters["env_steps"]}, sampled=sampled)
    typer.echo(json.dumps({"onnx": str(path), "description": str(path.with_suffix(".json"))}))


@app.command("repro", context_settings={"allow_extra_args": True,
                                        "ignore_unknown_options": False})
def repro_cmd(
    ctx: typer.Context,
    env: Optional[str] = typer.Argument(None, help="the task to train, e.g. dmc:walker-walk, "
                                        "atari100k:Pong (leave out to compare --runs only)"),
    seeds: str = typer.Option("0,1", help="seeds to train: 0,1,2 or 0-3"),
    steps: Optional[int] = typer.Option(None, help="env steps per seed (agent steps summed "
                                        "over envs; the authors' frames are these times the "
                                        "action repeat)"),
    preset: Optional[str] = typer.Option(None, help="default: the env's suite preset"),
    out: str = typer.Option("repro", help="folder for the seeds' runs and the comparison"),
    parallel: Optional[int] = typer.Option(None, help="seeds trained at once (default: all)"),
    batched: bool = typer.Option(False, help="all seeds in one process, their updates "
                                 "batched (lucid train --seeds); default: a process each"),
    runs: Optional[List[str]] = typer.Option(None, "--runs", help="existing run directories "
                                             "to compare too (repeat the option)"),
    reference_year: str = typer.Option("2023", "--reference", help="the authors' curves: 2023 "
                                       "(the paper's agent, lucid's recipe) or 2024"),
    at: Optional[str] = typer.Option(None, help="env steps to compare at, e.g. 20k,40k "
                                     "(default: those both reach)"),
):
    """Train seeds side by side, then compare them with the authors' published curves.

    A table at matched env steps, a plot and JSON in --out. Extra arguments are config overrides for every seed (section.key=value). With --runs
    and no ENV, only compares existing runs (made elsewhere or over several sessions). See
    docs/reproduction.md."""
    from .reference import NoReference, parse_steps, table
    from .repro import repro
    from .seeds import parse_seeds
    overrides = list(ctx.args)
    try:
        result = repro(env, parse_seeds(seeds), steps, out, preset, overrides, parallel,
                       runs or (), reference_year, parse_steps(at) if at else None,
                       echo=typer.echo, batched=batched)
    except (NoReference, ValueError, FileNotFoundError) as exc:
        _fail(exc)
    typer.echo(table(result))
    typer.echo(f"written: {', '.join(result['files'].values())}")


# typer prints a docstring's line breaks as they stand (an 80-column terminal then breaks each
# source line again): give it each paragraph as one line. The first is the command's summary
# in `lucid --help`; the rest, after a blank line, show in the command's own --help.
for _cmd in app.registered_commands:
    _cmd.help = "\n\n".join(" ".join(paragraph.split())
                             for paragraph in inspect.cleandoc(_cmd.callback.__doc__).split("\n\n"))


# Writes refused by the file system: a read-only disk, missing permission, a file where a
# directory has to be (or the reverse).
_UNWRITABLE = {errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
               errno.EPERM: "permission denied",
               errno.ENOTDIR: "a part of that path is a file, not a directory",
               errno.EEXIST: "a file is in the way of a directory",
               errno.EISDIR: "a directory is in the way of a file"}


def unwritable(exc: OSError) -> str | None:
    """The one-line error for a write the file system refused (None for other errors)."""
    from .checkpoint import disk_full
    where = str(exc.filename or "a file").removesuffix(".tmp")  # (atomic writes' temporary)
    if disk_full(exc):
        return (f"no space left on the disk ({where}); free some space and run the command "
                f"again")
    if exc.errno not in _UNWRITABLE:
        return None
    return (f"cannot write {where}: {_UNWRITABLE[exc.errno]}; give a path that can be written "
            f"(--out, --run-dir; a run directory can be copied elsewhere and resumed there), "
            f"or make that one writable. Nothing else was changed")


def main():
    try:
        app()
    except OSError as exc:  # any command's file written where the file system refuses it
        message = unwritable(exc)
        if message is None:
            raise
        typer.secho(f"error: {message}", fg="red", err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    sys.exit(main())
