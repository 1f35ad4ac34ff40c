"""`lucid` command line: train, eval, config. A thin layer over lucid.train."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .config import PRESETS, SIZES, ConfigError, make_config, to_yaml

app = typer.Typer(add_completion=False, no_args_is_help=False,
                  help="DreamerV3 world-model agents. `lucid train` learns CartPole-v1 on a CPU.")

DEFAULT_ENV = "CartPole-v1"
DEFAULT_CPU_PRESET = "cpu-control"


def _build(env: str, preset: Optional[str], size: Optional[str], steps: Optional[int],
           seed: Optional[int], run_dir: Optional[str], device: Optional[str],
           overrides: List[str]):
    preset = preset or (DEFAULT_CPU_PRESET if env == DEFAULT_ENV else "default")
    sections: dict = {"env": {"id": env}, "run": {}, "model": {}}
    if size:
        if size not in SIZES:
            raise ConfigError(f"unknown --size {size!r}; choose one of {', '.join(SIZES)}")
        sections["model"]["size"] = size
    for key, val in (("steps", steps), ("seed", seed), ("run_dir", run_dir), ("device", device)):
        if val is not None:
            sections["run"][key] = val
    return make_config(preset, overrides, **sections)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def train(
    ctx: typer.Context,
    env: str = typer.Argument(DEFAULT_ENV, help="gymnasium id or module.path:EnvClass"),
    preset: Optional[str] = typer.Option(None, help=f"one of: {', '.join(PRESETS)}"),
    size: Optional[str] = typer.Option(None, help=f"model size: {', '.join(SIZES)}"),
    steps: Optional[int] = typer.Option(None, help="environment steps to train for"),
    seed: Optional[int] = typer.Option(None),
    run_dir: Optional[str] = typer.Option(None, help="where config, logs and checkpoints go"),
    device: Optional[str] = typer.Option(None, help="auto, cpu or cuda"),
    resume: Optional[str] = typer.Option(None, help="continue the run in this directory"),
):
    """Train an agent. Extra arguments are config overrides: section.key=value."""
    from .train import Trainer
    overrides = list(ctx.args)
    if "=" in env:  # no ENV given, the first override landed in its place
        overrides.insert(0, env)
        env = DEFAULT_ENV
    try:
        if resume:
            cfg = make_config("default", overrides, run={"steps": steps or 0})
            trainer = Trainer(cfg, resume, resume=True)
        else:
            cfg = _build(env, preset, size, steps, seed, run_dir, device, overrides)
            trainer = Trainer(cfg)
    except (ConfigError, ValueError, FileNotFoundError, TypeError) as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2)
    typer.echo(f"run directory: {trainer.run_dir}  (preset {trainer.cfg.preset}, "
               f"size {trainer.cfg.model.size}, {trainer.cfg.run.steps} env steps)")
    try:
        trainer.run()
    finally:
        trainer.close()
    typer.echo(f"done: {trainer.counters}")


@app.command("eval")
def eval_cmd(run_dir: str, episodes: int = typer.Option(10), sampled: bool = False):
    """Evaluate the newest checkpoint of RUN_DIR (greedy policy unless --sampled)."""
    from .train import Trainer
    try:
        trainer = Trainer(make_config("default", run={"steps": 0}), run_dir, resume=True)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2)
    trainer.collector.close()
    eps = trainer.evaluate(episodes, explore=sampled)
    rets = [e.ret for e in eps]
    typer.echo(json.dumps({"episodes": len(rets), "mean_return": sum(rets) / len(rets),
                           "returns": rets}))


@app.command("config")
def config_cmd(preset: str = typer.Option("default"), overrides: List[str] = typer.Argument(None)):
    """Print the resolved config of a preset with overrides."""
    try:
        typer.echo(to_yaml(make_config(preset, overrides or [])))
    except ConfigError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2)


def main():
    app()


if __name__ == "__main__":
    sys.exit(main())
