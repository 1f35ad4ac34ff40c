"""`lucid plot` names what a curve averages: seeds, or runs that share a seed."""

import json

from lucid.config import make_config, to_yaml
from lucid.plot import group_runs, load_run


def _run(path, seed):
    path.mkdir()
    cfg = make_config("cpu-control", run={"seed": seed})
    (path / "config.yaml").write_text(to_yaml(cfg))
    (path / "episodes.jsonl").write_text(json.dumps({"env_steps": 10, "return": 1.0}) + "\n")
    return load_run(path)


def test_a_group_counts_distinct_seeds_not_runs(tmp_path):
    same = [_run(tmp_path / f"a{i}", 0) for i in range(3)]
    assert list(group_runs(same)) == ["CartPole-v1 (3 runs, 1 seed)"]
    seeds = [_run(tmp_path / f"b{i}", i) for i in range(3)]
    assert list(group_runs(seeds)) == ["CartPole-v1 (3 seeds)"]
    assert list(group_runs(seeds[:1])) == ["CartPole-v1 (1 seed)"]
    mixed = [seeds[0], seeds[1], same[0]]  # seeds 0, 1, 0
    assert list(group_runs(mixed)) == ["CartPole-v1 (3 runs, 2 seeds)"]
