"""benchmarks/ end to end at tiny shapes: ab.py (worker processes, rounds, ratios, JSON, and a
variant that imports lucid from another checkout, `--tree`), profile_step.py and
train_step.py."""

import json
import shutil
import sys
from pathlib import Path

from procs import run_grouped

ROOT = Path(__file__).resolve().parents[1]


def test_ab_times_two_checkouts_against_each_other(tmp_path):
    tree = tmp_path / "other"
    shutil.copytree(ROOT / "lucid", tree / "lucid")
    out = tmp_path / "ab.json"
    run = run_grouped(
        [sys.executable, str(ROOT / "benchmarks" / "ab.py"), "--size", "nano", "--batch", "2",
         "--length", "4", "--threads", "1", "--warmup", "1", "--rounds", "3",
         "--variant", "here=", "--variant", f"there=--tree {tree} --set train.pad_bins=false",
         "--json", str(out)], timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert f"lucid from {tree / 'lucid'}" in run.stdout
    assert f"lucid from {ROOT / 'lucid'}" in run.stdout
    rows = json.loads(out.read_text())["results"]
    assert [r["variant"] for r in rows] == ["here", "there"]
    for r in rows:
        assert len(r["ms"]) == 3 and all(ms > 0 for ms in r["ms"])
    assert rows[0]["ratio_to_first_median"] == 1.0
    assert rows[1]["ratio_to_first_median"] > 0


def test_ab_refuses_a_tree_without_lucid(tmp_path):
    run = run_grouped(
        [sys.executable, str(ROOT / "benchmarks" / "ab.py"), "--variant", "a=",
         "--variant", f"b=--tree {tmp_path}"], timeout=60)
    assert run.returncode == 2
    assert "holds no lucid/__init__.py" in run.stderr and "git worktree add" in run.stderr


def test_profile_step_lists_the_updates_operators_by_time(tmp_path):
    """benchmarks/profile_step.py at nano: the operators of a profiled update, the slowest
    first, with shares of the profiled total and call counts per update."""
    out = tmp_path / "prof.json"
    run = run_grouped(
        [sys.executable, str(ROOT / "benchmarks" / "profile_step.py"), "--size", "nano",
         "--batch", "2", "--length", "4", "--threads", "1", "--warmup", "1", "--iters", "2",
         "--top", "40", "--json", str(out)], timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    prof = json.loads(out.read_text())
    ops = prof["ops"]
    assert prof["time"] == "cpu" and len(ops) == 40 and prof["total_ms_per_update"] > 0
    times = [o["ms_per_update"] for o in ops]
    assert times == sorted(times, reverse=True) and times[-1] >= 0
    assert 0 < sum(o["share"] for o in ops) <= 1 + 1e-9
    names = {o["name"]: o for o in ops}
    assert "Optimizer.step#Adam.step" in names  # three optimizers, one step each per update
    assert names["Optimizer.step#Adam.step"]["calls_per_update"] == 3
    assert any(n in names for n in ("aten::mm", "aten::addmm", "aten::linear"))
    assert "ms/update" in run.stdout


def test_train_step_times_each_configuration(tmp_path):
    """benchmarks/train_step.py at nano, vector and image inputs: one row per configuration
    with its times, FLOPs (torch's counter), memory and the config it ran (here the horizon
    set through --set), and the matmul peak measured in the same run."""
    out = tmp_path / "ts.json"
    run = run_grouped(
        [sys.executable, str(ROOT / "benchmarks" / "train_step.py"), "--size", "nano",
         "--obs", "vector", "image", "--action", "discrete", "--batch", "2", "--length", "4",
         "--iters", "2", "--warmup", "1", "--peak-n", "64", "--set", "train.horizon=3",
         "--json", str(out)], timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    res = json.loads(out.read_text())
    rows = res["results"]
    assert [(r["obs"], r["mode"]) for r in rows] == [("vector", "eager"), ("image", "eager")]
    for r in rows:
        assert "error" not in r, r
        assert 0 < r["ms_min"] <= r["ms_median"] <= r["ms_max"] and r["iters"] == 2
        assert r["flops_per_update"] > 0 and r["peak_mem_mb"] > 0 and r["horizon"] == 3
    assert rows[1]["flops_per_update"] > rows[0]["flops_per_update"]  # + the image CNNs
    assert res["matmul_peak"]["gflops_median"] > 0 and res["matmul_peak"]["n"] == 64


def test_explore_counts_coverage_and_its_plot_draws_it(tmp_path):
    """benchmarks/explore.py (random actions: no agent to train) writes coverage that only
    grows and fits the room; explore_plot.py draws those results."""
    out, png = tmp_path / "random.json", tmp_path / "exploration.png"
    run = run_grouped(
        [sys.executable, str(ROOT / "benchmarks" / "explore.py"), "--methods", "random",
         "--seeds", "0,1", "--steps", "6000", "--size", "7", "--max-steps", "20",
         "--out", str(out)], timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["seed"] for r in rows] == [0, 1]
    for r in rows:
        cells = [c for _, c in sorted((int(k), v) for k, v in r["cells_at"].items())]
        assert cells == sorted(cells) and len(cells) == 3  # at 0, 2,500 and 5,000 steps
        assert cells[-1] <= r["cells"] <= 49
    run = run_grouped([sys.executable, str(ROOT / "benchmarks" / "explore_plot.py"), str(out),
                       "--out", str(png)], timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
