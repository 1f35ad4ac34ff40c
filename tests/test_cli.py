import json
import re
import sys

import torch
import yaml
from typer.testing import CliRunner

from lucid.cli import app

runner = CliRunner()


def test_unknown_config_key_is_refused_with_the_closest_key():
    r = runner.invoke(app, ["config", "train.batch_sise=4"])
    assert r.exit_code == 2
    assert "train.batch_sise" in r.output and "train.batch_size" in r.output
    r = runner.invoke(app, ["train", "--size", "XXL"])
    assert r.exit_code == 2 and "did you mean 'XL'" in r.output, r.output
    r = runner.invoke(app, ["config", "model.size=xs"])  # the case is all that is wrong
    assert r.exit_code == 2 and "did you mean 'XS'" in r.output, r.output


def test_a_paper_preset_on_a_cpu_comes_with_a_hint(tmp_path):
    r = runner.invoke(app, ["train", "dmc:cartpole-balance", "--size", "nano", "--steps",
                            "0", "--run-dir", str(tmp_path), "--device", "cpu",
                            "run.videos=false", "run.progress=false"])
    assert r.exit_code == 0, r.output
    assert "note: preset dmc-proprio is the paper's setting" in r.output \
        and "--preset cpu-control" in r.output
    done = json.loads(r.output.strip().splitlines()[-1].removeprefix("done: "))  # JSON, too
    assert done["env_steps"] == 0


def test_overrides_win_over_the_flags_they_name(tmp_path):
    """Precedence: preset < --size, --steps, --logger, ... < section.key=value."""
    r = runner.invoke(app, ["train", "CartPole-v1", "--size", "nano", "--steps", "0",
                            "--run-dir", str(tmp_path), "--device", "cpu", "--logger",
                            "tensorboard", "--num-runners", "3", "model.size=micro",
                            "run.logger=none", "run.num_runners=2", "run.progress=false"])
    assert r.exit_code == 0, r.output
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert (saved["model"]["size"], saved["run"]["logger"], saved["run"]["num_runners"]) == (
        "micro", "none", 2)


def test_version_and_short_help():
    import lucid
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.startswith(f"lucid {lucid.__version__} (torch ")
    r = runner.invoke(app, ["train", "-h"])
    assert r.exit_code == 0 and "--resume" in r.output


def test_help_gives_each_paragraph_of_a_commands_docstring_on_one_line():
    """`lucid --help` lists each command with its docstring's one-line summary (its first
    paragraph: typer would keep the line breaks of a longer one there), and each command's
    own --help gives every paragraph as one line for the terminal to wrap, not broken again
    where the source lines end. Rendered 400 columns wide, each fits on one line."""
    wide = dict(env={"COLUMNS": "400"}, terminal_width=400)
    listing = runner.invoke(app, ["--help"], **wide)
    assert listing.exit_code == 0, listing.output
    for cmd in app.registered_commands:
        name = cmd.name or cmd.callback.__name__
        summary, *body = [" ".join(p.split()) for p in cmd.callback.__doc__.split("\n\n")]
        assert "\n" not in cmd.callback.__doc__.split("\n\n")[0], (name, "a one-line summary")
        lines = listing.output.splitlines()
        assert any(f" {name}  " in line and summary in line for line in lines), listing.output
        own = runner.invoke(app, [name, "--help"], **wide)
        assert own.exit_code == 0, own.output
        for paragraph in [summary] + body:
            assert any(paragraph in line for line in own.output.splitlines()), (name, own.output)


def test_every_argument_and_option_of_every_command_says_what_it_is():
    import typer.main
    group = typer.main.get_command(app)
    missing = [f"{name} {param.name}" for name, cmd in group.commands.items()
               for param in cmd.params
               if param.name != "help" and not (getattr(param, "help", None) or "").strip()]
    assert not missing, missing


def test_config_prints_what_train_would_run_with():
    r = runner.invoke(app, ["config"])  # lucid train's default: CartPole-v1 on cpu-control
    assert r.exit_code == 0 and "preset: cpu-control" in r.output and "id: CartPole-v1" in r.output
    r = runner.invoke(app, ["config", "atari:Pong", "--size", "nano", "train.batch_size=3"])
    assert r.exit_code == 0, r.output
    assert "preset: atari" in r.output and "id: atari:Pong" in r.output
    assert "size: nano" in r.output and "batch_size: 3" in r.output
    r = runner.invoke(app, ["config", "--preset", "paper-cartpole"])
    assert r.exit_code == 0 and "train_ratio: 1024" in r.output


def test_unknown_env_is_refused_with_a_suggestion(tmp_path):
    r = runner.invoke(app, ["train", "CartPol-v1", "--run-dir", str(tmp_path)])
    assert r.exit_code == 2
    assert "CartPole-v1" in r.output


def test_a_signal_while_the_end_is_written_says_the_run_is_complete(tmp_path):
    """SIGTERM once all env steps are done (at the end-of-run videos): the run is complete,
    so the message names what was not written and the commands that write it, not a resume
    that has nothing left to do; exit status 128 + 15."""
    r = runner.invoke(app, ["train", "envs_for_tests:SignalOnRenderEnv", "--size", "nano",
                            "--steps", "30", "--run-dir", str(tmp_path), "train.prefill=1000",
                            "run.progress=false"])
    assert r.exit_code == 128 + 15, r.output
    assert (f"interrupted after the run's 30 env steps, with a checkpoint: the run is "
            f"complete; its curves and report are in {tmp_path} (`lucid report {tmp_path}` "
            f"makes the page again later)") in r.output
    assert "--resume" not in r.output
    assert (tmp_path / "report.html").exists() and (tmp_path / "curves.png").exists()


def test_a_signal_in_the_middle_of_training_leaves_curves_and_a_report(tmp_path):
    """SIGTERM (or Ctrl-C) while training: checkpoint, curves.png and report.html as at a
    normal end (not the videos), a message naming `lucid report` and the resume; 128 + 15."""
    r = runner.invoke(app, ["train", "envs_for_tests:SignalAtStepEnv", "--size", "nano",
                            "--steps", "10000", "--run-dir", str(tmp_path), "train.prefill=20",
                            "train.batch_size=2", "train.batch_length=8", "train.horizon=3",
                            "run.progress=false", "run.log_every=0"])
    assert r.exit_code == 128 + 15, r.output
    assert re.search(r"interrupted at \d+ of 10000 env steps, with a checkpoint; its curves "
                     rf"and report are in {re.escape(str(tmp_path))} \(`lucid report "
                     rf"{re.escape(str(tmp_path))}` makes the page again later\); continue "
                     rf"with `lucid train --resume {re.escape(str(tmp_path))}`", r.output), \
        r.output
    assert (tmp_path / "curves.png").stat().st_size > 0
    page = (tmp_path / "report.html").read_text()
    assert "<img" in page and not list((tmp_path / "videos").glob("*.mp4"))


def test_train_then_eval_then_resume(tmp_path, offline_wandb):
    args = ["train", "CartPole-v1", "--size", "nano", "--steps", "40", "--run-dir", str(tmp_path),
            "train.prefill=20", "train.batch_size=2", "train.batch_length=8",
            "train.horizon=3", "train.train_ratio=16", "run.progress=false",
            "--logger", "tensorboard,wandb"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    # the end-of-run videos went to W&B too, in the run's one W&B session
    wandb_runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 1, wandb_runs
    sent = [p.name for r in wandb_runs for p in (r / "files" / "media").rglob("*.*")]
    assert any(n.startswith("video_") for n in sent) and \
        any(n.startswith("open_loop_") for n in sent), sent
    # CartPole's preset on a CPU is a CPU one: what it changes is said, not that it is slow
    assert "the paper's setting" not in r.output
    assert "note: no preset given and no CUDA device: preset cpu-control, lucid's recipe for " \
           "a CPU: the paper's algorithm with a nano model, train ratio 16, learning rates " \
           "0.0003/0.0003/0.0003" in r.output
    cfg = (tmp_path / "config.yaml").read_text()
    assert "batch_length: 8" in cfg and "size: nano" in cfg
    # a run trained on a GPU evaluates on a machine without one: on this CPU, with a note
    (tmp_path / "config.yaml").write_text(cfg.replace("device: auto", "device: cuda"))
    r = runner.invoke(app, ["eval", str(tmp_path), "--episodes", "2"])
    assert r.exit_code == 0, r.output
    assert torch.cuda.is_available() or "run.device=cuda, which this machine lacks" in r.stderr
    out = json.loads(r.stdout)  # stdout is the JSON alone (`| jq`); notes and "loaded" on stderr
    assert out["episodes"] == 2 and len(out["returns"]) == 2
    assert "loaded " in r.stderr and "env steps" in r.stderr
    assert "device: cuda" in (tmp_path / "config.yaml").read_text()  # eval changes no file
    # an agent file from Dreamer.save evaluates too; a seed gives the same episodes again
    from lucid import Dreamer
    with Dreamer.load(tmp_path, device="cpu") as agent:
        agent.save(tmp_path.parent / "agent.pt")
    outs = [runner.invoke(app, ["eval", str(tmp_path.parent / "agent.pt"), "--episodes", "2",
                                "--seed", "5"]) for _ in range(2)]
    assert all(o.exit_code == 0 for o in outs), outs[0].output
    first, second = (json.loads(o.output.strip().splitlines()[-1]) for o in outs)
    assert first["episodes"] == 2 and first["returns"] == second["returns"]
    # a second run in the same directory is refused, and the first one's files stay
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "already holds a run" in r.output and "--resume" in r.output
    # options the saved config would override are refused, not dropped, and nothing changes
    before = (tmp_path / "config.yaml").read_text()
    r = runner.invoke(app, ["train", "--resume", str(tmp_path), "--steps", "60",
                            "train.train_ratio=64", "--seed", "3"])
    assert r.exit_code == 2, r.output
    assert "train.train_ratio=64" in r.output and "--seed" in r.output
    assert (tmp_path / "config.yaml").read_text() == before
    # run.* keys of how a session runs are taken (written to config.yaml with --steps)
    r = runner.invoke(app, ["train", "--resume", str(tmp_path), "--steps", "60",
                            "--device", "cpu", "run.eval_episodes=7", "run.time_limit=30"])
    assert r.exit_code == 0, r.output
    last = json.loads((tmp_path / "metrics.jsonl").read_text().strip().splitlines()[-1])
    assert last["env_steps"] == 60
    saved = (tmp_path / "config.yaml").read_text()
    assert "device: cpu" in saved and "eval_episodes: 7" in saved and "time_limit: 30" in saved
    # a resume that fails (here: a checkpoint of another model) writes nothing
    ckpts = sorted((tmp_path / "checkpoints").glob("*.pt"))
    state = torch.load(ckpts[-1], weights_only=True)
    module, params = next(iter(state["agent"]["modules"].items()))
    first = next(iter(params))
    params[first] = torch.zeros(3, 3)
    torch.save(state, tmp_path / "other.pt")
    (tmp_path / "other.pt").replace(tmp_path / "checkpoints" / "ckpt-999999999999.pt")
    r = runner.invoke(app, ["train", "--resume", str(tmp_path), "--steps", "3000"])
    assert r.exit_code == 2 and first in r.output, r.output
    assert (tmp_path / "config.yaml").read_text() == saved  # steps: 60 still
    (tmp_path / "checkpoints" / "ckpt-999999999999.pt").unlink()
    # a run that has its steps already says so and trains nothing; a --steps below them
    # changes no file
    r = runner.invoke(app, ["train", "--resume", str(tmp_path)])
    assert r.exit_code == 0 and "has its 60 env steps already" in r.output, r.output
    r = runner.invoke(app, ["train", "--resume", str(tmp_path), "--steps", "30"])
    assert r.exit_code == 0 and "has its 30 env steps already" in r.output, r.output
    assert (tmp_path / "config.yaml").read_text() == saved
    assert json.loads((tmp_path / "metrics.jsonl").read_text().strip().splitlines()[-1]) == last
    # a run directory inside a file is one line, not a traceback
    (tmp_path.parent / "afile").write_text("")
    r = runner.invoke(app, ["train", "--run-dir", str(tmp_path.parent / "afile" / "sub")])
    assert r.exit_code == 2 and "cannot make the run directory" in r.output, r.output


def test_paper_cartpole_preset_runs_at_its_size_and_train_ratio(tmp_path):
    """The paper-faithful CartPole setting (XS, B=16, T=64, train ratio 1024: one update per
    env step) trains through the CLI; only the random prefill is shortened."""
    args = ["train", "CartPole-v1", "--preset", "paper-cartpole", "--steps", "68",
            "--run-dir", str(tmp_path), "train.prefill=64", "run.progress=false",
            "run.logger=none", "run.videos=false"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "note: preset" not in r.output and "no preset given" not in r.output  # named
    cfg = (tmp_path / "config.yaml").read_text()
    assert "size: XS" in cfg and "train_ratio: 1024" in cfg and "batch_length: 64" in cfg
    last = json.loads((tmp_path / "metrics.jsonl").read_text().strip().splitlines()[-1])
    assert last["env_steps"] == 68
    assert last["updates"] == 68 - 64  # 1024 replayed steps per env step = B * T per update
    assert all(v == v for v in last.values() if isinstance(v, float))  # no NaN in the metrics


def test_a_cuda_device_this_machine_lacks_is_a_one_line_error(tmp_path, monkeypatch):
    """`--device cuda` with a CPU build of torch (or cuda:N past the last GPU) exits with
    status 2 and names the fix, without a traceback."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU build of torch
    r = runner.invoke(app, ["train", "CartPole-v1", "--device", "cuda",
                            "--run-dir", str(tmp_path / "a")])
    assert r.exit_code == 2, r.output
    assert "torch sees no CUDA device" in r.output and "--device cpu" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # one GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    r = runner.invoke(app, ["train", "CartPole-v1", "--device", "cuda:3",
                            "--run-dir", str(tmp_path / "b")])
    assert r.exit_code == 2, r.output
    assert "run.device=cuda:3" in r.output and "cuda:0 to cuda:0" in r.output


def test_a_resumed_run_takes_the_device_asked_for_else_its_own_where_this_machine_has_it(
        monkeypatch, said):
    from lucid.device import resumed_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resumed_device("cpu", "auto") == "cpu"
    assert resumed_device("auto", "auto") == "auto"
    assert resumed_device("cuda", "cpu") == "cpu"
    assert said() == ""
    assert resumed_device("cuda", "auto") == "auto"  # trained on a GPU, continued on this CPU
    assert "run.device=cuda, which this machine lacks; continuing on cpu" in said()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resumed_device("cuda:1", "auto") == "cuda:1"
    assert resumed_device("cuda:2", "auto") == "auto"  # past the last of the 2 GPUs
    assert resumed_device("cpu", "auto") == "cpu"  # a CPU run stays on the CPU unless asked
    assert resumed_device("cpu", "cuda") == "cuda"


def test_bad_command_line_values_are_one_line_errors(tmp_path):
    """Refused before anything is loaded or written; exit status 2, no traceback."""
    cases = [
        (["eval", str(tmp_path), "--episodes", "0"], "--episodes must be >= 1"),
        (["dream", str(tmp_path), "--out", "d.avi"], "--out must end in .mp4 or .gif"),
        (["dream", str(tmp_path), "--rows", "0"], "--horizon, --rows and --context must be >= 1"),
        (["eval", str(tmp_path), "--seed", "-1"], "--seed must be >= 0"),  # was a traceback
        (["dream", str(tmp_path), "--seed", "-1"], "--seed must be >= 0"),
        (["config", "train=5"], "sets the whole train section"),  # was an AttributeError
        # it overwrote any file: a run's own logs (report RUN --out RUN/episodes.jsonl)
        (["report", str(tmp_path), "--out", str(tmp_path / "episodes.jsonl")],
         "the report's file must end in .html"),
        (["plot", str(tmp_path), "--out", str(tmp_path)], "is a directory"),
        (["train", "model.size"], "write model.size=VALUE"),
        (["config", "train.batch_size"], "write train.batch_size=VALUE"),  # not an env's name
        (["eval", str(tmp_path / "nothing")], "not a lucid run"),
        (["train", "--resume", str(tmp_path)], "not a lucid run"),  # and no .lock left there
        (["report", str(tmp_path)], "not a lucid run directory"),
        (["check", "CartPole-v1", "--steps", "0"], "--steps must be >= 1, got 0"),
        (["eval", str(tmp_path), "--video", "--format", "avi"],
         "--format must be mp4 or gif, got 'avi'"),
        (["dream", str(tmp_path), "--fps", "0"], "(got 45, 3, 5, 0.0)"),
        (["dream", str(tmp_path), "--context", "0"], "(got 45, 3, 0, 10.0)"),
        (["dream", str(tmp_path), "--out", "d.MP4"], "not a lucid run"),  # .MP4 is a suffix
        (["plot", str(tmp_path), "--out", str(tmp_path / "c.png")],
         "has no episodes.jsonl; is it a lucid run directory?"),
    ]
    for args, message in cases:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output, (args, r.output)
        assert r.exception is None or isinstance(r.exception, SystemExit), args
    assert not any(tmp_path.iterdir())


EVAL_FAILS_ENV = '''
import gymnasium as gym
import numpy as np


class EvalFails(gym.Env):
    """Fine in training; in envs seeded >= 10000 (evaluation's) a NaN observation or an
    exception at the third step."""
    observation_space = gym.spaces.Box(-10, 10, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, crash=False, render_mode=None):
        self.crash, self.bad, self.t = crash, False, 0
        self.render_mode = render_mode

    def render(self):
        return np.zeros((16, 16, 3), np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.bad = self.bad if seed is None else seed >= 10000
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.bad and self.t == 3:
            if self.crash:
                raise RuntimeError("crashed")
            return np.full(2, np.nan, np.float32), 0.0, False, False, {}
        return np.zeros(2, np.float32), 1.0, self.t >= 10, False, {}
'''


def test_an_env_that_keeps_raising_at_the_start_is_a_one_line_error(tmp_path, monkeypatch):
    """An env whose every reset raises stops the start after env.max_restarts rebuilds:
    that EnvError was a traceback; nothing is written either way."""
    (tmp_path / "eval_fails.py").write_text(EVAL_FAILS_ENV + '''

class ResetFails(EvalFails):
    def reset(self, *, seed=None, options=None):
        raise RuntimeError("no reset")
''')
    monkeypatch.setattr(sys, "path", list(sys.path))
    r = runner.invoke(app, ["train", f"{tmp_path}/eval_fails.py:ResetFails", "--size", "nano",
                            "--run-dir", str(tmp_path / "run"), "env.max_restarts=0"])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert "error: the environment raised in reset more than env.max_restarts=0 times; last " \
           "error: RuntimeError: no reset" in r.output
    assert not (tmp_path / "run").exists()


def test_an_env_that_fails_in_lucid_eval_is_a_one_line_error(tmp_path, monkeypatch):
    """lucid eval (and eval --video) printed the traceback of the env's NaN (which training
    names in one line) or of its exception."""
    (tmp_path / "eval_fails.py").write_text(EVAL_FAILS_ENV)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the file's directory joins it
    run = tmp_path / "run"
    r = runner.invoke(app, ["train", f"{tmp_path}/eval_fails.py:EvalFails", "--preset",
                            "default", "--size", "nano", "--steps", "60", "--run-dir", str(run),
                            "train.batch_size=2", "train.batch_length=8", "train.horizon=3",
                            "train.prefill=50", "train.train_ratio=8", "run.logger=none",
                            "run.videos=false", "run.progress=false"])
    assert r.exit_code == 0, r.output
    for video in ([], ["--video"]):  # --video was a traceback still
        r = runner.invoke(app, ["eval", str(run), "--episodes", "1", *video])
        assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
        assert "error: the evaluation failed: ValueError: the observation contains NaN" \
            in r.output
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("kwargs: {}", "kwargs: {crash: true}"))
    for video in ([], ["--video"]):
        r = runner.invoke(app, ["eval", str(run), "--episodes", "1", *video])
        assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
        assert "the evaluation failed: RuntimeError: crashed (raised at " in r.output
        assert "eval_fails.py:" in r.output


def test_lucids_warnings_are_once_per_message_at_the_users_line_and_plain_in_the_cli():
    import warnings
    from lucid import LucidWarning
    from lucid.warn import show_plainly, warn
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.filterwarnings("once", category=LucidWarning)  # lucid's default
        for _ in range(3):
            warn("the same thing")
        warn("another thing")
    assert [(str(w.message), w.category, w.filename) for w in caught] == [
        ("the same thing", LucidWarning, __file__), ("another thing", LucidWarning, __file__)]
    lines = []
    with warnings.catch_warnings():  # restores showwarning after
        warnings.simplefilter("always")
        show_plainly(lines.append)
        warn("a lucid warning")
        warnings.warn("someone else's", UserWarning)  # shown as Python shows it
    assert lines == ["warning: a lucid warning"]


ENV_FILE = '''
import gymnasium as gym
import numpy as np

from lucid_test_helper import LENGTH  # a module next to this file


class Bandit(gym.Env):
    observation_space = gym.spaces.Box(0, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), float(action), False, self.t >= LENGTH, {}
'''


def test_an_env_in_a_python_file_trains_and_evaluates_from_any_directory(tmp_path, monkeypatch):
    """`lucid train path/to/file.py:Env`: the file's siblings import (its directory joins
    the import path), the run keeps the file's absolute path, so `lucid eval` works from
    another directory; the run directory is named after the file, not the whole path."""
    proj, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    proj.mkdir(), elsewhere.mkdir()
    (proj / "my_bandit.py").write_text(ENV_FILE)
    (proj / "lucid_test_helper.py").write_text("LENGTH = 5\n")
    monkeypatch.setattr(sys, "path", list(sys.path))  # the file's directory joins it
    monkeypatch.chdir(tmp_path)
    try:
        _train_and_evaluate_a_file_env(tmp_path, proj, elsewhere, monkeypatch)
    finally:
        for name in [m for m in sys.modules
                     if m == "lucid_test_helper" or m.startswith("_lucid_env_my_bandit")]:
            del sys.modules[name]


def _train_and_evaluate_a_file_env(tmp_path, proj, elsewhere, monkeypatch):
    r = runner.invoke(app, ["train", "proj/my_bandit.py:Bandit", "--size", "nano", "--steps",
                            "40", "--device", "cpu", "train.prefill=16", "train.batch_size=2",
                            "train.batch_length=8", "train.train_ratio=8", "run.videos=false",
                            "run.progress=false"])
    assert r.exit_code == 0, r.output
    [run_dir] = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("my_bandit.py-Bandit-")
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["env"]["id"] == f"{proj / 'my_bandit.py'}:Bandit"
    monkeypatch.chdir(elsewhere)
    r = runner.invoke(app, ["eval", str(run_dir), "--episodes", "2"])
    assert r.exit_code == 0, r.output
    result = json.loads(r.output.strip().splitlines()[-1])
    assert result["episodes"] == 2 and all(0 <= x <= 5 for x in result["returns"])
    # The project moves: the error says where to give the new path, and the run resumes
    moved = tmp_path / "moved"
    proj.rename(moved)
    r = runner.invoke(app, ["eval", str(run_dir), "--episodes", "1"])
    assert r.exit_code != 0 and "if it moved" in r.output and "config.yaml" in r.output
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace(str(proj), str(moved)))
    r = runner.invoke(app, ["train", "--resume", str(run_dir), "--steps", "48"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1].removeprefix("done: "))["env_steps"] == 48
    r = runner.invoke(app, ["train", "proj/no_such.py:Bandit", "--size", "nano", "--steps", "0",
                            "--device", "cpu"])
    assert r.exit_code != 0 and "there is no file" in r.output
    assert str(elsewhere / "proj" / "no_such.py") in r.output


NAN_ENV = '''
import gymnasium as gym
import numpy as np


class LaterNaN(gym.Env):
    """Fine at reset and the first steps but step 3 (beyond the bounds); a NaN observation at
    step 7, or an exception at step `crash` (5-step episodes)."""
    total = 0
    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Dict({"turn": gym.spaces.Discrete(2),
                                    "speed": gym.spaces.Box(0, 4, (2,), np.float32)})

    def __init__(self, crash=0):
        self.crash = crash + 0  # a TypeError for crash=None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action)
        self.t, self.total = self.t + 1, self.total + 1
        if self.total == self.crash:
            raise RuntimeError("crashed")
        obs = np.full(3, np.nan if self.total == 7 else 5.0 if self.total == 3 else 0.5,
                      np.float32)  # 5: beyond the Box's bounds, which a run takes
        return obs, 1.0, False, self.t % 5 == 0, {}
'''


def test_check_describes_the_env_and_finds_what_a_run_would_fail_on(tmp_path, monkeypatch):
    """`lucid check`: observations and actions as lucid maps them (a mixed Dict action: the
    one-hots first), random steps sent as the actor's are, episodes counted, videos; a NaN
    observation at step 7 is named with its step, before any run."""
    r = runner.invoke(app, ["check", "examples.custom_env:MyEnv", "--steps", "30",
                            "env.max_episode_steps=10"])
    assert r.exit_code == 0, r.output
    for line in ("image: image 64x64x3 (uint8 pixels) -> the CNN encoder",
                 "position: float64 (4,) -> 4 floats, symlog -> the MLP encoder",
                 "action: 2 categoricals over 3, 3 classes (model dims 0..5)",
                 "the actor outputs 6 model dims and learns by REINFORCE",
                 "random actions, 30 steps: 3 episodes ended",
                 "videos: yes (frames from the image observations)",
                 "ok: lucid can train on examples.custom_env:MyEnv"):
        assert line in r.output, (line, r.output)
    assert "beyond its Box's bounds" not in r.output
    (tmp_path / "later_nan.py").write_text(NAN_ENV)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the file's directory joins it
    r = runner.invoke(app, ["check", f"{tmp_path}/later_nan.py:LaterNaN", "--steps", "6"])
    assert r.exit_code == 0, r.output
    assert "speed: Normal over 2 dims in [-1, 1], rescaled to [0, 4] (model dims 2..3)" \
        in r.output and "turn: categorical over 2 classes (model dims 0..1)" in r.output
    assert "random actions, 6 steps: 1 episode ended, rewards in [1, 1]" in r.output
    assert "note: the observation of random step 3 lies beyond its Box's bounds" in r.output
    assert "videos: no (" in r.output and "render_mode" in r.output
    r = runner.invoke(app, ["check", f"{tmp_path}/later_nan.py:LaterNaN"])
    assert r.exit_code == 2  # as for every refused input
    assert "later_nan.py:LaterNaN at random step 7 (step()): ValueError" in r.output
    assert "NaN" in r.output
    r = runner.invoke(app, ["check", f"{tmp_path}/later_nan.py:LaterNaN", "env.kwargs.crash=4"])
    assert r.exit_code == 2 and "at random step 4 (step()): RuntimeError: crashed" in r.output
    # a bug in the env's constructor is named with where it is
    r = runner.invoke(app, ["check", f"{tmp_path}/later_nan.py:LaterNaN",
                            "env.kwargs.crash=null"])
    assert r.exit_code == 2, r.output
    assert "raised at " in r.output and "later_nan.py:" in r.output and "in __init__" in r.output


def test_check_notes_values_beyond_a_box_not_another_dtype():
    import gymnasium as gym
    import numpy as np

    from lucid.envcheck import _beyond
    box = gym.spaces.Box(-1, 1, (3,), np.float32)
    assert not _beyond(box, np.zeros(3))  # float64 values within a float32 Box
    assert _beyond(gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": box}),
                   {"a": 1, "b": np.array([0.0, 1.5, 0.0])})


def test_check_reports_the_rollout_it_took_and_the_frames_videos_get():
    """`lucid check` on an env of Discrete and MultiDiscrete observations and an action Box
    of per-dim bounds: what each becomes, the rewards and mean return of the random episodes,
    the first step beyond a Box's bounds (below them), the frames' size; a NaN observation
    after a reset, a NaN reward and frames that are not H x W (x C) are named."""
    r = runner.invoke(app, ["check", "envs_for_tests:DescribedEnv", "--steps", "8"])
    assert r.exit_code == 0, r.output
    for line in ("d: Discrete -> one-hots of 3 (3 inputs) -> the MLP encoder",
                 "m: MultiDiscrete -> one-hots of 2, 3 (5 inputs) -> the MLP encoder",
                 "action: Normal over 5 dims in [-1, 1], rescaled to [0, 1], [0, 2], [0, 3], "
                 "[0, 4], ... (5 dims) (model dims 0..4)",
                 "random actions, 8 steps: 2 episodes ended, rewards in [1, 8], mean return 15",
                 "note: the observation of random step 3 lies beyond its Box's bounds",
                 "videos: yes (8x8 frames)"):
        assert line in r.output, (line, r.output)
    r = runner.invoke(app, ["check", "envs_for_tests:DescribedEnv", "env.kwargs.bad_reset=true"])
    assert r.exit_code == 2 and "at random step 4 (reset()): ValueError" in r.output, r.output
    r = runner.invoke(app, ["check", "envs_for_tests:DescribedEnv", "env.kwargs.nan_reward=2"])
    assert r.exit_code == 2, r.output
    assert "at random step 2 (step()): ValueError: the reward is nan" in r.output
    r = runner.invoke(app, ["check", "envs_for_tests:DescribedEnv", "--steps", "2",
                            "env.kwargs.channels=5"])
    assert r.exit_code == 0, r.output
    assert "videos: no (render() returned (8, 8, 5), not an H x W (x C) frame" in r.output


def test_check_notes_episodes_that_never_end_and_its_episodes_follow_the_seed():
    """An env whose episodes do not end in the steps taken gets a note; the rollout resets
    from run.seed, so an env drawing its return at reset returns what that seed gives."""
    from envs_for_tests import SeededReturnEnv
    r = runner.invoke(app, ["check", "envs_for_tests:CountEnv", "--steps", "5",
                            "env.kwargs.terminate=false"])
    assert r.exit_code == 0, r.output
    assert "random actions, 5 steps: 0 episodes ended" in r.output
    assert "note: no episode ended in 5 random steps" in r.output
    env = SeededReturnEnv()
    env.reset(seed=5)  # the return its first episode pays
    r = runner.invoke(app, ["check", "envs_for_tests:SeededReturnEnv", "--steps", "2",
                            "run.seed=5"])
    assert r.exit_code == 0, r.output
    assert f"1 episode ended, rewards in [0, {env.ret:g}], mean return {env.ret:g}" in r.output


def test_check_closes_every_env_it_makes_also_when_the_rollout_fails():
    """`lucid check` makes an env for the preset's choice (on a CPU: are there images?), one
    for the spaces, one for the rollout and one for a frame: each is closed when it is done
    with it, whether the rollout ends or an env step raises (a simulator left open keeps its
    process)."""
    from envs_for_tests import ClosedEnv
    out = {}
    for case, args, code, made in (("ends", [], 0, 4), ("fails", ["env.kwargs.fail_at=3"], 2, 3)):
        ClosedEnv.made.clear()
        r = runner.invoke(app, ["check", "envs_for_tests:ClosedEnv", "--steps", "6", *args])
        assert r.exit_code == code, r.output
        assert len(ClosedEnv.made) == made and all(e.closed for e in ClosedEnv.made), r.output
        out[case] = r.output
    assert "videos: yes (4x4 frames)" in out["ends"]
    assert "at random step 3 (step()): RuntimeError: ClosedEnv" in out["fails"]


def test_checks_random_actions_follow_run_seed():
    """The random actions come from run.seed: a check repeats itself, and another seed takes
    other actions (EchoEnv pays 10 x each action, so the returns tell)."""
    def rollout(seed):
        r = runner.invoke(app, ["check", "envs_for_tests:EchoEnv", "--steps", "40",
                                f"run.seed={seed}"])
        assert r.exit_code == 0, r.output
        return [line for line in r.output.splitlines() if line.startswith("random actions")]

    assert rollout(0) == rollout(0) != rollout(1)


def test_train_flags_and_an_override_in_the_envs_place_reach_the_saved_config(tmp_path):
    """--seed, --envs-per-runner and --ray-address are saved as their run.* keys; an override
    where ENV goes leaves the env at CartPole-v1 and is the first override, so a later one of
    the same key wins."""
    r = runner.invoke(app, ["train", "model.size=nano", "--steps", "0", "--seed", "7",
                            "--envs-per-runner", "3", "--ray-address", "auto", "--run-dir",
                            str(tmp_path), "--device", "cpu", "run.progress=false",
                            "run.videos=false", "model.size=micro"])
    assert r.exit_code == 0, r.output
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert (saved["env"]["id"], saved["model"]["size"]) == ("CartPole-v1", "micro")
    assert (saved["run"]["seed"], saved["run"]["envs_per_runner"],
            saved["run"]["ray_address"]) == (7, 3, "auto")


def test_train_refusals_name_the_file_the_key_and_what_a_resume_would_not_apply(tmp_path,
                                                                              monkeypatch):
    """--size is named as such; a file named like a config section (run.py) is an env file,
    not a key; an override in
    ENV's place gets the closest key; `--resume` with an env, flags (--seed 0 too) or keys
    its saved config would override names each of them and the keys it takes."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["train", "run.py:Env"])
    assert r.exit_code == 2 and f"there is no file {tmp_path / 'run.py'}" in r.output, r.output
    r = runner.invoke(app, ["train", "--size", "xxl"])
    assert r.exit_code == 2 and "unknown --size 'xxl'; choose one of " in r.output, r.output
    r = runner.invoke(app, ["train", "train.batch_sise=4"])
    assert r.exit_code == 2 and "did you mean 'train.batch_size'" in r.output, r.output
    import gymnasium as gym
    gym.register("LucidTestNeedsAModule-v1", entry_point="no_such_pkg_for_lucid.envs:Env")
    try:  # an env whose package is missing
        r = runner.invoke(app, ["train", "LucidTestNeedsAModule-v1", "--size", "nano",
                                "--run-dir", str(tmp_path / "m")])
    finally:
        del gym.registry["LucidTestNeedsAModule-v1"]
    assert r.exit_code == 2 and "needs the package 'no_such_pkg_for_lucid'" in r.output, r.output
    r = runner.invoke(app, ["train", "Pendulum-v1", "--resume", str(tmp_path / "run"),
                            "--seed", "0", "--run-dir", str(tmp_path / "x"),
                            "train.train_ratio=4", "run.eval_episodes=3"])
    assert r.exit_code == 2, r.output
    assert ("so the env 'Pendulum-v1', --seed, --run-dir, train.train_ratio=4 would not be "
            "applied; --resume takes --steps, --device and these: run.log_every, ") in r.output


def test_a_preset_given_by_name_gets_no_note_on_presets(tmp_path):
    """The notes on the preset (the paper's setting is slow on a CPU; what lucid's CPU
    recipe changes) are for the preset lucid picked, not for one the command line names."""
    for env, preset in (("examples.custom_env:MyEnv", "default"), ("CartPole-v1", "cpu-control")):
        r = runner.invoke(app, ["train", env, "--preset", preset, "--size", "nano", "--steps",
                                "0", "--run-dir", str(tmp_path / preset), "--device", "cpu",
                                "run.videos=false", "run.progress=false"])
        assert r.exit_code == 0, r.output
        assert "note: preset" not in r.output and "no preset given" not in r.output, r.output


def test_video_names_never_overwrite_a_file(tmp_path):
    """Names of one eval's videos: as asked, or all with the first -2, -3, ... that none of
    them has taken."""
    from lucid.cli import _unused
    a, b = tmp_path / "a.mp4", tmp_path / "b.gif"
    assert _unused([a, b]) == [a, b]
    a.write_bytes(b"")
    assert _unused([a, b]) == [tmp_path / "a-2.mp4", tmp_path / "b-2.gif"]
    (tmp_path / "b-2.gif").write_bytes(b"")
    assert _unused([a, b]) == [tmp_path / "a-3.mp4", tmp_path / "b-3.gif"]
