"""Logging backends: metrics.jsonl / episodes.jsonl hold the documented keys, TensorBoard event
files are readable and hold the scalars, W&B writes an offline run without network, and the
progress display is quiet when stdout is not a terminal.

One tiny real run (nano model, 60 env steps, 20 updates, one evaluation) is resumed once to 80
steps; the tests read what the two runs wrote."""

import contextlib
import importlib.util
import io
import json
import re
import time
import sys
from pathlib import Path

import numpy as np
import pytest

from lucid.config import ConfigError, logger_backends, make_config
from lucid.logger import Logger, import_wandb
from lucid.train import Trainer

from conftest import offline_wandb_vars

DOCS = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
GROUPS = ("train", "world_model", "actor", "critic", "episode", "eval", "replay", "perf",
          "runners", "dist", "crafter")

HAS_WANDB = importlib.util.find_spec("wandb") is not None


def _documented(section: str) -> dict[str, str]:
    """{key: when} from the table under `## <section>` in docs/architecture.md."""
    text = DOCS.read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", body, re.M)
    assert rows, f"no key table under '## {section}' in {DOCS}"
    return {k: when.strip() for k, when in rows}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("logging")
    run_dir = tmp / "run"
    loggers = "tensorboard,wandb" if HAS_WANDB else "tensorboard"
    cfg = make_config("default",
                      env={"id": "CartPole-v1", "num_envs": 2}, model={"size": "nano"},
                      train={"batch_size": 4, "batch_length": 16, "horizon": 5, "prefill": 20,
                             "train_ratio": 32, "replay_capacity": 10_000},
                      run={"steps": 60, "log_every": 0.0, "progress": True,
                           "run_dir": str(run_dir), "eval_every": 40, "eval_episodes": 2,
                           "logger": loggers, "histogram_every": 1, "videos": False})
    out = io.StringIO()  # not a TTY, like a CI log
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        for k, v in offline_wandb_vars(tmp).items():
            mp.setenv(k, v)
        first = Trainer(cfg)
        first.run()
        first.close()
        again = Trainer(make_config("default", run={"steps": 80}), run_dir, resume=True)
        again.run()
        again.close()
    return {"dir": run_dir, "stdout": out.getvalue(), "counters": again.counters}


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metrics_rows_hold_the_documented_keys(run):
    rows = _rows(run["dir"] / "metrics.jsonl")
    assert rows[-1]["env_steps"] == run["counters"]["env_steps"] >= 80
    documented = _documented("Metrics")
    always = {k for k, when in documented.items() if when == "every row"}
    after_update = {k for k, when in documented.items() if when == "rows with updates"}
    assert {"env_steps", "updates", "perf/env_steps_per_s", "replay/steps"} <= always
    assert {"world_model/loss", "actor/loss", "critic/loss"} <= after_update
    for row in rows:
        assert always <= set(row), always - set(row)
    trained = [r for r in rows if "world_model/loss" in r]
    assert trained, "no row after an update"
    for row in trained:
        assert after_update <= set(row), after_update - set(row)
    assert any("episode/return_recent" in r for r in rows)
    # every logged key is documented, and every metric is in one of the groups
    logged = set().union(*rows)
    undocumented = {k for k in logged if k not in documented}
    assert not undocumented, f"keys missing from docs/architecture.md: {sorted(undocumented)}"
    for key in logged:
        assert "/" not in key or key.split("/")[0] in GROUPS, key


def test_episode_rows_hold_the_documented_keys(run):
    rows = _rows(run["dir"] / "episodes.jsonl")
    documented = _documented("Episodes")
    always = {k for k, when in documented.items() if when == "every row"}
    train = [r for r in rows if not r["eval"]]
    evals = [r for r in rows if r["eval"]]
    assert train and evals
    for row in rows:
        assert always <= set(row) <= set(documented), set(row) ^ always
    assert {r["policy"] for r in evals} == {"greedy", "sampled"}
    # run.eval_every=40 over 80 steps (a resume at 60): 2 evaluations of 2 episodes each
    assert sorted((r["env_steps"], r["policy"]) for r in evals) == [
        (s, p) for s in (40, 80) for p in ("greedy", "sampled") for _ in range(2)]


def test_tensorboard_events_are_readable_and_hold_the_scalars(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run["dir"] / "tb"),
                           size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    documented = _documented("Metrics")
    tb_only = {k for k, when in documented.items() if when == "TensorBoard, W&B"}
    rows = _rows(run["dir"] / "metrics.jsonl")
    logged = {k for r in rows for k in r if "/" in k}
    assert logged | tb_only <= set(tags["scalars"]), (logged | tb_only) - set(tags["scalars"])
    # the values are the JSONL ones, at x = env steps, from both the first and resumed run
    loss = acc.Scalars("world_model/loss")
    jsonl = [(r["env_steps"], r["world_model/loss"]) for r in rows if "world_model/loss" in r]
    assert [e.step for e in loss] == [s for s, _ in jsonl]
    assert [e.value for e in loss] == pytest.approx([v for _, v in jsonl], rel=1e-6)
    assert max(e.step for e in loss) >= 80
    train_eps = [r for r in _rows(run["dir"] / "episodes.jsonl") if not r["eval"]]
    assert len(acc.Scalars("episode/return")) == len(train_eps)
    evals = [r for r in _rows(run["dir"] / "episodes.jsonl") if r["eval"]]
    for tag, policy in (("eval/return", "greedy"), ("eval/sampled_return", "sampled")):
        eps = [r for r in evals if r["policy"] == policy]
        steps = sorted({r["env_steps"] for r in eps})
        assert [e.step for e in acc.Scalars(tag)] == steps  # one point per evaluation
        means = [np.mean([r["return"] for r in eps if r["env_steps"] == s]) for s in steps]
        assert [e.value for e in acc.Scalars(tag)] == pytest.approx(means, rel=1e-6)
    assert {"episode/returns", "episode/lengths"} <= set(tags["histograms"])
    assert "config/text_summary" in tags["tensors"]


@pytest.mark.skipif(not HAS_WANDB, reason="wandb not installed (pip install 'lucid-rl[wandb]')")
def test_wandb_offline_run_writes_its_files(run):
    wdir = run["dir"] / "wandb"
    run_id = (wdir / "run_id").read_text().strip()
    runs = sorted(wdir.glob("offline-run-*"))
    assert len(runs) == 2, runs  # the first run and its resumption: one W&B run id
    for r in runs:
        # offline-run-<time>-<id>; W&B adds "-1" when both sessions start in the same second
        assert re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{run_id}(-\d+)?", r.name), r.name
        _finished_wandb_records(r / f"run-{run_id}.wandb")  # written after finish() returns
        data = (r / f"run-{run_id}.wandb").read_bytes()
        assert len(data) > 0
        for key in (b"world_model/loss", b"actor/loss", b"critic/loss", b"env_steps"):
            assert key in data, key
    first = (runs[0] / f"run-{run_id}.wandb").read_bytes()
    for key in (b"episode/return", b"eval/return", b"episode/returns"):  # episodes, histogram
        assert key in first, key


def _wandb_records(path: Path) -> list:
    """The records of an offline W&B run file (run-<id>.wandb): a 7-byte header (":W&B", magic,
    version), then LevelDB's log format: 32 KiB blocks of chunks, each with a 7-byte header
    (checksum, length, type: 1 whole record, 2/3/4 its first/middle/last part), that hold
    the protobuf Records wandb's own core writes."""
    import struct

    from wandb.proto import wandb_internal_pb2
    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", data[:7]
    pos, parts, records = 7, [], []
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or kind == 0:  # a block's padding
            pos += left
            continue
        parts.append(data[pos + 7:pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            records.append(record)
            parts = []
    return records


def _finished_wandb_records(path: Path, timeout: float = 60.0) -> list:
    """The run file's records once they end with the run's exit record. wandb.finish() returns
    when wandb's service process holds the records, which writes them to the file moments
    later: on a loaded machine the file has been seen to hold its 7-byte header alone when
    finish() returned, and all its records 3 s later."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            records = _wandb_records(path)
        except Exception:  # noqa: BLE001 - a record half written: read again
            if time.monotonic() > deadline:
                raise
            records = []
        if records and records[-1].WhichOneof("record_type") == "exit" \
                or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


@pytest.mark.skipif(not HAS_WANDB, reason="wandb not installed (pip install 'lucid-rl[wandb]')")
@pytest.mark.parametrize("project", [None, "my-project"])
def test_wandb_records_the_project_and_plots_every_metric_against_env_steps(tmp_path, project,
                                                                            offline_wandb):
    """Read back from the offline run file: the run's project (run.wandb_project, else
    "lucid") and config; env_steps declared the x axis of every metric ("*"); each logged row
    carries its env steps."""
    cfg = make_config("default", run={"logger": "wandb", **({"wandb_project": project}
                                                             if project else {})})
    log = Logger(tmp_path / "run", progress=False, config=cfg)
    log.metrics({"env_steps": 7, "updates": 2, "world_model/loss": 1.5})
    log.episode(_ep(11, 3.0))
    log.close()
    (path,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    records = _finished_wandb_records(path)
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert runs and {r.project for r in runs} == {project or "lucid"}
    config = {u.key: json.loads(u.value_json) for u in runs[0].config.update}
    assert config["preset"] == "default" and config["run"]["logger"] == "wandb"
    metrics = [r.metric for r in records if r.WhichOneof("record_type") == "metric"]
    assert any(m.name == "env_steps" for m in metrics)
    assert any(m.glob_name == "*" and m.step_metric == "env_steps" for m in metrics)
    rows = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]
    loss = [r for r in rows if "world_model/loss" in r]
    assert [(r["env_steps"], r["world_model/loss"]) for r in loss] == [(7, 1.5)]
    returns = [r for r in rows if "episode/return" in r]
    assert [(r["env_steps"], r["episode/return"]) for r in returns] == [(11, 3.0)]


@pytest.mark.skipif(not HAS_WANDB, reason="wandb not installed (pip install 'lucid-rl[wandb]')")
def test_videos_go_to_wandb_under_their_tensorboard_tags(tmp_path, offline_wandb):
    import imageio.v3 as iio
    from lucid import video
    run_dir = tmp_path / "run"
    mp4 = video.write_video(run_dir / "videos" / "eval-000000010.mp4",
                            np.full((4, 16, 16, 3), 90, np.uint8), fps=4)
    png = run_dir / "videos" / "dream-000000010.png"
    iio.imwrite(png, np.full((8, 8, 3), 200, np.uint8))
    log = Logger(run_dir, tensorboard=False, progress=False, backends="wandb")
    log.videos({"eval": mp4, "dream": png, "report": run_dir / "report.html"}, 10)
    log.close()
    media = next((run_dir / "wandb").glob("offline-run-*")) / "files" / "media"
    sent = sorted(p.relative_to(media).parent.as_posix() for p in media.rglob("*.*"))
    assert sent == ["images/world_model", "videos/eval"]  # the report is not a video
    assert next((media / "videos" / "eval").glob("video_*.mp4")).read_bytes() == mp4.read_bytes()
    assert np.array_equal(iio.imread(next((media / "images" / "world_model").glob("*.png"))),
                          iio.imread(png))


def test_progress_is_quiet_when_stdout_is_not_a_tty(run):
    out = run["stdout"]
    assert "\x1b[" not in out and "\r" not in out  # no bar, no terminal control codes
    progress = [line for line in out.splitlines() if "] steps " in line]
    # one plain line at the first metric row of each of the two runs (then one a minute),
    # with the run's total, and "-" before the first return
    assert 1 <= len(progress) <= 4, out
    assert all(re.search(r"\] steps [\d,]+/[\d,]+  upd ", line) for line in progress), progress
    assert not any("None" in line for line in progress), progress


def test_progress_bar_only_on_a_terminal(tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", Terminal())
    log = Logger(tmp_path / "tty", progress=True, backends="none", total_steps=10)
    try:
        assert log.bar is not None and not log.plain
    finally:
        log.close()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    log = Logger(tmp_path / "pipe", progress=True, backends="none", total_steps=10)
    log.metrics({"env_steps": 5, "updates": 0})
    log.metrics({"env_steps": 6, "updates": 0})
    log.close()
    assert log.bar is None
    assert sys.stdout.getvalue().count("\n") == 1  # at most one line a minute


def test_logger_none_writes_jsonl_only(tmp_path):
    log = Logger(tmp_path, progress=False, backends="none")
    log.metrics({"env_steps": 1, "updates": 0, "perf/env_steps_per_s": 1.0})
    log.episode({"env_steps": 1, "return": 1.0, "length": 1, "wall_time": 0.0, "eval": False})
    log.close()
    assert log.tb is None and log.wandb is None
    assert not (tmp_path / "tb").exists() and not (tmp_path / "wandb").exists()
    assert _rows(tmp_path / "metrics.jsonl")[0]["env_steps"] == 1
    assert _rows(tmp_path / "episodes.jsonl")[0]["return"] == 1.0


def test_run_logger_accepts_names_lists_and_none():
    assert logger_backends("tensorboard") == ["tensorboard"]
    assert logger_backends("tensorboard, wandb") == ["tensorboard", "wandb"]
    assert logger_backends(["wandb", "tensorboard"]) == ["wandb", "tensorboard"]
    assert logger_backends("none") == [] and logger_backends(None) == []
    assert make_config("default").run.logger == "tensorboard"
    assert make_config("default", ["run.logger=none"]).run.logger == "none"
    assert make_config("default", ["run.logger=[tensorboard]"]).run.logger == ["tensorboard"]
    with pytest.raises(ConfigError, match="tensorbord.*did you mean 'tensorboard'"):
        make_config("default", ["run.logger=tensorbord"])
    with pytest.raises(ConfigError, match="run.wandb_mode"):
        make_config("default", ["run.wandb_mode=sometimes"])


def test_tensorboard_false_turns_it_off_whatever_the_backends_say(tmp_path):
    for flag, backends in ((True, ["tensorboard"]), (False, [])):
        log = Logger(tmp_path / str(flag), tensorboard=flag, progress=False,
                     backends="tensorboard")
        log.metrics({"env_steps": 1, "updates": 1, "world_model/loss": 1.0})
        log.close()
        assert log.backends == backends
        assert (tmp_path / str(flag) / "tb").exists() == flag
        assert (tmp_path / str(flag) / "metrics.jsonl").exists()


def test_missing_wandb_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ConfigError, match=re.escape("pip install 'lucid-rl[wandb]'")):
        make_config("default", ["run.logger=tensorboard,wandb"])
    with pytest.raises(ImportError, match=re.escape("pip install 'lucid-rl[wandb]'")):
        import_wandb()
    make_config("default", ["run.logger=tensorboard"])  # fine without wandb


def test_a_backend_that_fails_to_open_leaves_no_files_or_writer_thread_open(tmp_path,
                                                                            monkeypatch):
    """wandb missing after TensorBoard opened: the error reaches the caller, and the JSONL files
    and TensorBoard's event file and writer thread it had opened are closed again."""
    import os
    import threading

    def open_in_run():
        fds = Path("/proc/self/fd")
        return sorted(t for t in (os.path.realpath(f) for f in fds.iterdir())
                      if t.startswith(str(tmp_path)))

    threads = set(threading.enumerate())
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    # err's traceback keeps the half-built Logger alive: garbage collection closes nothing
    with pytest.raises(ImportError, match="wandb") as err:
        Logger(tmp_path, progress=False, backends="tensorboard,wandb")
    assert "lucid-rl[wandb]" in str(err.value)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))  # it had opened TensorBoard
    assert open_in_run() == []
    assert [t for t in threading.enumerate() if t not in threads and t.is_alive()] == []


def test_a_session_logs_its_config_at_its_first_step_and_histograms_at_its_end(tmp_path):
    """A resumed session's config is the one TensorBoard shows last (at its first step, not
    at 0 again), and the episodes since the last histogram are written when it closes."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lucid.config import make_config
    from lucid.logger import Logger
    cfg = make_config("default", run={"histogram_every": 100, "logger": "tensorboard"})
    log = Logger(tmp_path, progress=False, total_steps=200, start_steps=50, config=cfg)
    for step, ret in ((60, 1.0), (70, 3.0)):
        log.episode({"env_steps": step, "return": ret, "length": 5, "wall_time": 1.0,
                     "eval": False})
    log.metrics({"env_steps": 80, "updates": 3, "episodes": 2, "wall_time": 2.0})
    log.close()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0, "histograms": 0})
    acc.Reload()
    assert [e.step for e in acc.Tensors("config/text_summary")] == [50]
    (hist,) = acc.Histograms("episode/returns")
    assert hist.step == 80 and hist.histogram_value.num == 2


def _tb(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def _next_writer_numbered(last_digit, scratch):
    """Open throwaway writers until the process's next event file ends in `last_digit`."""
    from torch.utils.tensorboard import SummaryWriter
    for i in range(10):
        SummaryWriter(str(scratch / str(i))).close()
        (name,) = (f.name for f in (scratch / str(i)).iterdir())
        if (int(name.split(".")[-1]) + 1) % 10 == last_digit:
            return
    raise AssertionError("event file names no longer end in the writer's number")


def _ep(step, ret, length=5, **kw):
    return {"env_steps": step, "return": ret, "length": length, "wall_time": 0.0,
            "eval": False, **kw}


def test_histograms_hold_the_episodes_since_the_previous_one_every_n_rows(tmp_path):
    """run.histogram_every=2: a histogram at every 2nd metric row of the training episodes
    since the previous one, and the rest at close; 10 rows without a config."""
    cfg = make_config("default", run={"histogram_every": 2, "logger": "tensorboard"})
    log = Logger(tmp_path / "two", progress=False, config=cfg)
    for step, ret in ((2, 1.0), (4, 2.0), (6, 4.0)):
        log.episode(_ep(step - 1, ret))
        log.metrics({"env_steps": step, "updates": 0})
    log.close()
    hists = _tb(tmp_path / "two" / "tb").Histograms("episode/returns")
    assert [(h.step, h.histogram_value.num, h.histogram_value.sum) for h in hists] == [
        (4, 2, 3.0), (6, 1, 4.0)]
    log = Logger(tmp_path / "default", progress=False, backends="tensorboard")
    for step in range(1, 11):
        log.episode(_ep(step, float(step)))
        log.metrics({"env_steps": step, "updates": 0})
    log.close()
    hists = _tb(tmp_path / "default" / "tb").Histograms("episode/returns")
    assert [(h.step, h.histogram_value.num) for h in hists] == [(10, 10)]


def test_an_evaluation_is_one_point_of_its_episodes_means_per_policy(tmp_path):
    log = Logger(tmp_path, progress=False, backends="tensorboard")
    for policy, ret, length in (("greedy", 1.0, 3), ("greedy", 3.0, 5), ("sampled", 10.0, 7)):
        log.episode(_ep(10, ret, length, eval=True, policy=policy))
    log.metrics({"env_steps": 12, "updates": 1, "world_model/loss": 0.5,
                 "episode/return_recent": None, "replay/note": "text",  # not scalars
                 "replay/full": True, "wall_time": None})
    log.close()
    acc = _tb(tmp_path / "tb")
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
           for tag in ("eval/return", "eval/length", "eval/sampled_return",
                       "eval/sampled_length", "world_model/loss")}
    assert got == {"eval/return": [(10, 2.0)], "eval/length": [(10, 4.0)],
                   "eval/sampled_return": [(10, 10.0)], "eval/sampled_length": [(10, 7.0)],
                   "world_model/loss": [(12, 0.5)]}
    assert not {"episode/return_recent", "replay/note", "replay/full",
                "perf/wall_time"} & set(acc.Tags()["scalars"])


def test_a_resume_hides_the_tensorboard_points_and_rows_a_killed_run_wrote_past_it(tmp_path):
    """A run killed at 30 env steps after its checkpoint at 10: the resumed session's points
    at 20 and 30 replace the killed run's, in TensorBoard as in the JSONL files. Both
    sessions open their event files in one second with writer numbers 9 and 10, whose names
    sort the resumed session's file first unless the logger waits for the next second."""
    _next_writer_numbered(9, tmp_path / "scratch")
    log = Logger(tmp_path, progress=False, backends="tensorboard")
    for step in (10, 20, 30):
        log.metrics({"env_steps": step, "updates": 0, "world_model/loss": float(step)})
        log.episode(_ep(step, float(step)))
    log.close()
    log = Logger(tmp_path, progress=False, backends="tensorboard", start_steps=10,
                 purge_after=10)
    for step in (20, 30):
        log.metrics({"env_steps": step, "updates": 0, "world_model/loss": -float(step)})
        log.episode(_ep(step, -float(step)))
    log.close()
    loss = [(e.step, e.value) for e in _tb(tmp_path / "tb").Scalars("world_model/loss")]
    assert loss == [(10, 10.0), (20, -20.0), (30, -30.0)]
    for name, key in (("metrics.jsonl", "world_model/loss"), ("episodes.jsonl", "return")):
        assert [(r["env_steps"], r[key]) for r in _rows(tmp_path / name)] == loss


def test_a_plain_progress_line_shows_the_counters_and_the_recent_return(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    log = Logger(tmp_path / "on", progress=True, backends="none", total_steps=1000)
    log.metrics({"env_steps": 500, "updates": 7, "perf/env_steps_per_s": 12.4,
                 "perf/updates_per_s": 0.26, "episode/return_recent": 3.14159})
    log.close()
    off = Logger(tmp_path / "off", progress=False, backends="none", total_steps=1000)
    off.metrics({"env_steps": 500, "updates": 7})
    off.close()
    (line,) = sys.stdout.getvalue().splitlines()  # the logger without progress says nothing
    assert line.endswith("] steps 500/1,000  upd 7  12 sps  0.3 ups  return 3.1"), line


def test_the_progress_bar_follows_the_env_steps_and_is_off_without_progress(tmp_path,
                                                                              monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", Terminal())
    log = Logger(tmp_path / "on", progress=True, backends="none", total_steps=100,
                 start_steps=20)
    try:
        assert log.bar.tasks[0].completed == 20
        log.metrics({"env_steps": 60, "updates": 3})
        assert log.bar.tasks[0].completed == 60 and log.bar.tasks[0].total == 100
    finally:
        log.close()
    off = Logger(tmp_path / "off", progress=False, backends="none", total_steps=100)
    off.close()
    assert off.bar is None and not off.plain


def test_rows_reach_their_files_as_they_are_logged(tmp_path):
    """A running (or killed) run's JSONL files hold every row logged so far."""
    log = Logger(tmp_path, progress=False, backends="none")
    try:
        log.metrics({"env_steps": 4, "updates": 1})
        log.episode(_ep(3, 2.0))
        assert _rows(tmp_path / "metrics.jsonl") == [{"env_steps": 4, "updates": 1}]
        assert _rows(tmp_path / "episodes.jsonl") == [_ep(3, 2.0)]
    finally:
        log.close()


@pytest.mark.skipif(not HAS_WANDB, reason="wandb not installed (pip install 'lucid-rl[wandb]')")
def test_wandb_mode_from_the_environment_wins_over_run_wandb_mode(tmp_path, offline_wandb):
    """WANDB_MODE=offline keeps a run.wandb_mode=online run offline (no account needed)."""
    cfg = make_config("default", run={"logger": "wandb", "wandb_mode": "online"})
    log = Logger(tmp_path / "run", progress=False, config=cfg)
    log.metrics({"env_steps": 1, "updates": 0, "world_model/loss": 1.0})
    log.close()
    run_id = (tmp_path / "run" / "wandb" / "run_id").read_text().strip()
    (offline,) = (tmp_path / "run" / "wandb").glob(f"offline-run-*-{run_id}")
    assert (offline / f"run-{run_id}.wandb").stat().st_size > 0


def test_progress_says_when_updates_become_far_slower_than_the_runs_best(tmp_path,
                                                                         monkeypatch):
    """From the third row with updates: a rate under a third of the best so far gets a hint,
    with the machine's load where runnable work waits for a core (another process)."""
    import lucid.logger
    log = Logger(tmp_path / "run", tensorboard=False, progress=False)
    row = lambda ups: {"env_steps": 1, "updates": 1, "perf/updates_per_s": ups}  # noqa: E731
    monkeypatch.setattr(lucid.logger, "machine_load", lambda: None)
    infos = [log.progress_info(row(u)) for u in (30.0, 8.0, 8.5, 7.9, 2.5)]
    assert not any("slow" in i for i in infos[:4]), infos  # the first row's rate is not a best
    assert infos[4].endswith("slow: updates at 29% of this run's best"), infos[4]
    monkeypatch.setattr(lucid.logger, "machine_load", lambda: (3.1, 2))
    assert log.progress_info(row(1.0)).endswith(
        "slow: updates at 12% of this run's best; the machine is busy (load 3.1 on 2 cores: "
        "other processes take its cores; run.threads=1 shares them best)")
    assert "slow" not in log.progress_info(row(3.0))  # within a third of the best again
    log.close()
