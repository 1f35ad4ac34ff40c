"""`lucid repro` and lucid.reference: the authors' curves read and converted to env steps,
lucid's runs scored the same way, the comparison table, plot, JSON and report section, and
the command end to end on a CPU at a tiny budget.

The step conversion is checked against numbers published independently of lucid's code
(shared/reference/DREAMERV3.md, from the authors' curves): DMC proprio at 100k frames,
walker-walk 475, cartpole-swingup 528, cheetah-run 283, cup-catch 730, which lucid must find
at 50k env steps (action repeat 2); Atari100k Pong ends near 19 (2023) and near -5 (2024)
at 400k frames = 100k env steps (repeat 4)."""

import gzip
import json
import math

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from lucid import reference as ref_mod
from lucid.checkpoint import list_checkpoints
from lucid.cli import app
from lucid.config import make_config, to_yaml
from lucid.reference import (NoReference, compare, frames_per_step, parse_steps, reference,
                             table, task_names, verdict, window_mean)
from lucid.repro import batched_command, seed_command
from lucid.seeds import parse_seeds

runner = CliRunner()


def _raw(year, file, task):
    """The authors' runs of a task, read straight from the gzip file."""
    with gzip.open(ref_mod.SCORES / year / f"{file}-dreamerv3.json.gz", "rt") as f:
        return sorted((r for r in json.load(f) if r["task"] == task), key=lambda r: r["seed"])


def test_frames_per_step_is_the_suites_action_repeat():
    assert frames_per_step("dmc:walker-walk") == 2
    assert frames_per_step("dmc-vision:cartpole-swingup") == 2
    assert frames_per_step("atari100k:Pong") == 4 and frames_per_step("atari:Pong") == 4
    assert frames_per_step("dmc:walker-walk", {"repeat": 1}) == 1  # the run's own repeat
    assert frames_per_step("atari100k:Pong", {"repeat": 2}) == 2
    assert frames_per_step("CartPole-v1") == 1


@pytest.mark.parametrize("task,at_100k_frames", [("walker-walk", 475), ("cartpole-swingup", 528),
                                                 ("cheetah-run", 283), ("cup-catch", 730)])
def test_dmc_proprio_curves_sit_at_half_their_frames(task, at_100k_frames):
    r = reference(f"dmc:{task}")
    assert r.frames_per_step == 2 and len(r.curves) == 5
    assert r.at(50_000).mean() == pytest.approx(at_100k_frames, abs=1)
    # 100k env steps would be 200k frames, far above the published 100k-frames score
    assert r.at(100_000).mean() > at_100k_frames + 40


def test_each_seed_at_a_step_is_its_point_at_repeat_times_the_step():
    """At a step on the curves' grid, every seed's score is its own point at
    frames = repeat * step, read from the file without lucid's code."""
    raw = _raw("2023", "dmc_proprio", "dmc_walker_walk")
    r = reference("dmc:walker-walk")
    for step in (5_000, 20_000, 120_000):
        expect = [run["ys"][run["xs"].index(2 * step)] for run in raw]
        np.testing.assert_allclose(r.at(step), expect)
    raw = _raw("2023", "atari100k", "atari_pong")
    r = reference("atari100k:Pong")
    np.testing.assert_allclose(r.at(100_000), [run["ys"][run["xs"].index(400_000)] for run in raw])


def test_atari100k_pong_2023_and_2024_end_where_the_readme_says():
    assert reference("atari100k:Pong").at(100_000).mean() == pytest.approx(18.5, abs=1.0)
    late = reference("atari100k:Pong", year="2024").at(100_000)
    assert np.nanmean(late) == pytest.approx(-5, abs=2)


def test_task_names_and_missing_curves():
    assert task_names("dmc:cup-catch") == ("dmc", ["dmc_ball_in_cup_catch", "dmc_cup_catch"])
    assert reference("dmc:cup-catch").task == "dmc_cup_catch"  # the 2023 name
    assert reference("dmc:cup-catch", year="2024").task == "dmc_ball_in_cup_catch"
    assert task_names("atari100k:MsPacman")[1] == ["atari_ms_pacman"]
    assert task_names("atari:ALE/UpNDown-v5")[1] == ["atari_up_n_down"]
    assert task_names("atari:space_invaders")[1] == ["atari_space_invaders"]
    assert reference("atari100k:MsPacman").task == "atari_ms_pacman"
    with pytest.raises(NoReference, match="not for 'CartPole-v1'"):
        reference("CartPole-v1")
    with pytest.raises(NoReference, match="dmc_walker_walk"):  # the error lists what there is
        reference("dmc:walker-sprint")
    with pytest.raises(ValueError, match="2023 and 2024"):
        reference("dmc:walker-walk", year="2025")


def test_window_mean_by_hand():
    steps, rets = [100, 400, 900, 1000, 1600], [1.0, 2.0, 3.0, 5.0, 7.0]
    assert window_mean(steps, rets, 1000, 500) == 4.0  # 900 and 1000 in (500, 1000]
    assert window_mean(steps, rets, 1500, 500) == 5.0  # (1000, 1500] empty: last within 1000
    assert window_mean(steps, rets, 400, 100) == 2.0  # the end of the window counts
    assert math.isnan(window_mean(steps, rets, 3000, 500))  # nothing within 2 windows
    assert math.isnan(window_mean([], [], 10, 5))


def test_verdict_against_the_authors_range():
    authors = {"mean": 5.0, "min": 2.0, "max": 8.0}
    assert verdict({"mean": 1.9}, authors) == "below"
    assert verdict({"mean": 2.0}, authors) == "inside"
    assert verdict({"mean": 8.0}, authors) == "inside"
    assert verdict({"mean": 8.1}, authors) == "above"
    assert verdict({"mean": None}, authors) == "no data"


def test_parse_steps_and_seeds():
    assert parse_steps("20k,40000, 1.5M") == [20_000, 40_000, 1_500_000]
    with pytest.raises(ValueError, match="not a number of env steps"):
        parse_steps("20q")
    assert parse_seeds("0-2,5") == [0, 1, 2, 5] and parse_seeds("3") == [3]
    with pytest.raises(ValueError, match="0,1,2 or 0-3"):
        parse_seeds("a-b")


def _fake_run(path, env, seed, episodes, preset="dmc-proprio"):
    path.mkdir()
    cfg = make_config(preset, env={"id": env}, run={"seed": seed})
    (path / "config.yaml").write_text(to_yaml(cfg))
    with open(path / "episodes.jsonl", "w") as f:
        for s, ret in episodes:
            f.write(json.dumps({"env_steps": s, "return": ret, "length": 500}) + "\n")
        f.write(json.dumps({"env_steps": 9_999, "return": 1e6, "eval": True}) + "\n")


def test_compare_scores_runs_like_the_authors_and_writes_table_plot_json(tmp_path):
    """Two fake seeds of walker-walk with episodes every 500 steps: at 10k env steps each
    scores the mean of its episodes in (5k, 10k]; evaluation episodes do not count."""
    eps = [[(s, s / 100 + 10 * k) for s in range(500, 30_001, 500)] for k in range(2)]
    for k in range(2):
        _fake_run(tmp_path / f"s{k}", "dmc:walker-walk", k, eps[k])
    result = compare([tmp_path / "s0", tmp_path / "s1"])
    assert result["reference"]["frames_per_step"] == 2
    assert result["reference"]["window_env_steps"] == 5_000
    assert [r["env_steps"] for r in result["rows"]] == [10_000, 20_000, 25_000]
    row = result["rows"][0]
    by_hand = [np.mean([s / 100 + 10 * k for s in range(5_500, 10_001, 500)]) for k in range(2)]
    assert row["lucid"]["mean"] == pytest.approx(np.mean(by_hand))
    assert (row["lucid"]["min"], row["lucid"]["max"]) == pytest.approx(tuple(by_hand))
    theirs = [run["ys"][run["xs"].index(20_000)]
              for run in _raw("2023", "dmc_proprio", "dmc_walker_walk")]
    assert row["authors"]["mean"] == pytest.approx(np.mean(theirs))
    assert row["authors"]["min"] == pytest.approx(min(theirs)) and row["frames"] == 20_000
    assert row["verdict"] == verdict(row["lucid"], row["authors"])
    md = table(result)
    assert "| 10,000 | 20,000 |" in md and row["verdict"] in md

    r = runner.invoke(app, ["repro", "--runs", str(tmp_path / "s0"), "--runs",
                            str(tmp_path / "s1"), "--out", str(tmp_path / "cmp"),
                            "--at", "15k,25k"])
    assert r.exit_code == 0, r.output
    saved = json.loads((tmp_path / "cmp" / "repro.json").read_text())
    assert [row["env_steps"] for row in saved["rows"]] == [15_000, 25_000]
    assert (tmp_path / "cmp" / "repro.png").stat().st_size > 10_000
    assert "| 15,000 | 30,000 |" in (tmp_path / "cmp" / "repro.md").read_text()

    # a run's report gains the comparison
    r = runner.invoke(app, ["report", str(tmp_path / "s0")])
    assert r.exit_code == 0, r.output
    page = (tmp_path / "s0" / "report.html").read_text()
    assert "Against the authors' curves" in page and 'id="against-authors"' in page
    assert "dmc_walker_walk" in page


def test_compare_refuses_runs_of_different_envs_and_envs_without_curves(tmp_path):
    _fake_run(tmp_path / "a", "dmc:walker-walk", 0, [(500, 1.0)])
    _fake_run(tmp_path / "b", "dmc:cheetah-run", 0, [(500, 1.0)])
    with pytest.raises(ValueError, match="share one env"):
        compare([tmp_path / "a", tmp_path / "b"])
    _fake_run(tmp_path / "c", "CartPole-v1", 0, [(500, 1.0)], preset="cpu-control")
    r = runner.invoke(app, ["repro", "--runs", str(tmp_path / "c")])
    assert r.exit_code == 2 and "not for 'CartPole-v1'" in r.output
    r = runner.invoke(app, ["repro", "CartPole-v1", "--steps", "100"])  # before any training
    assert r.exit_code == 2 and "not for 'CartPole-v1'" in r.output
    assert not (tmp_path / "repro").exists()
    # the report of a run without curves has no such section
    r = runner.invoke(app, ["report", str(tmp_path / "c")])
    assert r.exit_code == 0 and "Against the authors" not in (tmp_path / "c" / "report.html"
                                                             ).read_text()


def test_repro_trains_seeds_side_by_side_then_compares(tmp_path):
    """End to end at a tiny budget: two seeds of DMC walker-walk with the CPU preset (and a
    train ratio of 8 to be quick), each its own `lucid train` process, compared with the
    authors' first bin (5k env steps = 10k frames); a seed with a checkpoint is resumed."""
    out = tmp_path / "walker"
    r = runner.invoke(app, ["repro", "dmc:walker-walk", "--preset", "cpu-control", "--steps",
                            "5000", "--seeds", "0-1", "--out", str(out), "--at", "5k",
                            "train.train_ratio=8", "run.videos=false"])
    assert r.exit_code == 0, r.output
    assert "seed 0 done" in r.output and "seed 1 done" in r.output
    result = json.loads((out / "repro.json").read_text())
    assert sorted(result["seeds"]) == [0, 1] and len(result["runs"]) == 2
    row = result["rows"][0]
    assert row["env_steps"] == 5_000 and row["lucid"]["n"] == 2 and row["authors"]["n"] == 5
    assert row["verdict"] in ("inside", "above", "below")
    for seed in (0, 1):
        cfg = yaml.safe_load((out / f"seed-{seed}" / "config.yaml").read_text())
        assert cfg["run"]["seed"] == seed and cfg["train"]["train_ratio"] == 8
        assert cfg["run"]["threads"] >= 1
        assert list_checkpoints(out / f"seed-{seed}")
    # a seed that has a checkpoint is resumed (with the keys a resume may change), not redone
    cmd = seed_command("dmc:walker-walk", "cpu-control", 6000, 0, out / "seed-0",
                       ["train.train_ratio=8", "run.videos=false"])
    assert cmd[4:] == ["--resume", str(out / "seed-0"), "--steps", "6000", "run.videos=false"]


def test_a_batched_reproduction_is_one_train_command_of_all_seeds(tmp_path):
    """`lucid repro --batched`: one `lucid train --seeds` process; a second call resumes all
    seeds together, and refuses seeds that are not the run's."""
    out = tmp_path / "repro"
    cmd = batched_command("dmc:walker-walk", "cpu-control", 4000, [0, 2], out,
                          ["train.train_ratio=8"])
    assert cmd[3:] == ["train", "dmc:walker-walk", "--preset", "cpu-control", "--steps",
                       "4000", "--seeds", "0,2", "--run-dir", str(out), "train.train_ratio=8"]
    out.mkdir()
    for seed in (0, 2):  # as lucid train --seeds leaves them
        d = out / f"seed-{seed}"
        _fake_run(d, "dmc:walker-walk", seed, [(1000, 1.0)])
        (d / "checkpoints").mkdir()
        (d / "checkpoints" / "ckpt-000000010.pt").write_bytes(b"x")
    cmd = batched_command("dmc:walker-walk", "cpu-control", 8000, [0, 2], out,
                          ["train.train_ratio=8", "run.videos=false"])
    assert cmd[3:] == ["train", "--resume", str(out), "--steps", "8000", "run.videos=false"]
    with pytest.raises(ValueError, match="--seeds 0,2"):
        batched_command("dmc:walker-walk", "cpu-control", 8000, [0, 1], out)
