"""`lucid train ENV --seeds 0-1` (lucid/multiseed.py): several seeds in one process, each an
ordinary run in RUN_DIR/seed-S, updated as one batched update; resumed, plotted and reported
as a whole. That the batched update equals K single ones is tests/test_batched.py's; that
two seeds learn is tests/test_learning.py's."""

from __future__ import annotations

import json

import numpy as np
import torch
import yaml
from typer.testing import CliRunner

from lucid.acting import load_to_act
from lucid.cli import app
from lucid.plot import expand_seeds, group_runs, load_run
from lucid.seeds import seed_dirs

runner = CliRunner()
QUICK = ["train.prefill=300", "run.logger=none", "run.log_every=1", "run.progress=false"]


def _rows(path):
    return [json.loads(line) for line in open(path)]


def test_seeds_train_resume_plot_and_report(tmp_path):
    d = tmp_path / "seeds"
    r = runner.invoke(app, ["train", "CartPole-v1", "--seeds", "0-1", "--steps", "900",
                            "--run-dir", str(d), *QUICK])
    assert r.exit_code == 0, r.output
    dirs = seed_dirs(d)
    assert [p.name for p in dirs] == ["seed-0", "seed-1"]
    done = json.loads(r.output.split("done: ", 1)[1])
    assert done["0"]["env_steps"] == done["1"]["env_steps"] == 900
    assert done["0"]["updates"] == done["1"]["updates"] > 0
    for seed, p in enumerate(dirs):
        assert yaml.safe_load((p / "config.yaml").read_text())["run"]["seed"] == seed
        episodes, metrics = _rows(p / "episodes.jsonl"), _rows(p / "metrics.jsonl")
        assert episodes and metrics
        assert all(row["seed"] == seed for row in episodes + metrics)
    # each seed is an ordinary run: it loads to act on its own, and the seeds learned apart
    acting = [load_to_act(str(p)) for p in dirs]
    w = [dict(a.agent.actor.named_parameters())["head.out.weight"] for a in acting]
    assert not torch.equal(w[0], w[1])
    for a in acting:
        a.close()
    # one curve of two seeds; a report with the seeds' table
    assert expand_seeds([d]) == dirs
    assert list(group_runs([load_run(p) for p in dirs])) == ["CartPole-v1 (2 seeds)"]
    out = tmp_path / "curves.png"
    r = runner.invoke(app, ["plot", str(d), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 0
    page = (d / "report.html").read_text()
    assert 'id="seeds"' in page and "seed-0" in page and "seed-1" in page
    # where one run is needed, the directory of several is named as such
    r = runner.invoke(app, ["eval", str(d), "--episodes", "1"])
    assert r.exit_code != 0 and "2 seeds" in r.output and str(dirs[0]) in r.output
    # the whole run resumes: every seed from its checkpoint, on to the new budget
    r = runner.invoke(app, ["train", "--resume", str(d), "--steps", "1200"])
    assert r.exit_code == 0, r.output
    again = json.loads(r.output.split("done: ", 1)[1])
    for s in ("0", "1"):
        assert again[s]["env_steps"] == 1200
        assert again[s]["updates"] > done[s]["updates"]


def test_seeds_are_refused_where_they_cannot_work(tmp_path):
    r = runner.invoke(app, ["train", "CartPole-v1", "--seeds", "0-1", "--seed", "3",
                            "--run-dir", str(tmp_path / "a")])
    assert r.exit_code != 0 and "--seed or --seeds" in r.output
    r = runner.invoke(app, ["train", "CartPole-v1", "--seeds", "0-1", "train.cuda_graph=true",
                            "--device", "cpu", "--run-dir", str(tmp_path / "b")])
    assert r.exit_code != 0 and "needs a CUDA device" in r.output
    r = runner.invoke(app, ["train", "CartPole-v1", "--seeds", "x-y",
                            "--run-dir", str(tmp_path / "c")])
    assert r.exit_code != 0 and "0,1,2 or 0-3" in r.output


def test_train_seeds_from_python(tmp_path):
    import lucid
    dirs = lucid.train_seeds("CartPole-v1", [3, 5], 600, run_dir=tmp_path / "py",
                             train__prefill=300, run__logger="none", run__videos=False)
    assert [d.name for d in dirs] == ["seed-3", "seed-5"]
    agent = lucid.Dreamer.load(dirs[1])
    action, _ = agent.predict(np.zeros(4, np.float32))
    assert action in (0, 1)
    assert agent.trainer.cfg.run.seed == 5
    agent.close()


def test_the_nature_recipes_seeds_train_with_their_replay_context_and_resume(tmp_path):
    """`--seeds` with `model.recipe=nature` (its loss batched: tests/test_batched.py), replay
    context on: each seed's updates write the latents they inferred into that seed's own
    replay (prefill steps, acted at random, have none until an update replays them), each
    seed loads as a single Nature agent, and the run resumes as a whole."""
    from lucid.nature_agent import NatureAgent
    from lucid.multiseed import SeedsTrainer
    from lucid.config import make_config

    cfg = make_config("nature", model={"size": "1m"}, env={"id": "CartPole-v1"},
                      train={"batch_size": 4, "batch_length": 8, "train_ratio": 16,
                             "prefill": 64, "prefill_random": True},
                      run={"steps": 160, "logger": "none", "progress": False,
                           "eval_every": 0, "videos": False})
    assert cfg.train.replay_context == 1
    st = SeedsTrainer.start(cfg, [0, 1], tmp_path / "nature")
    try:
        assert st.batched.vmap  # B * T = 32: batched on a CPU too
        st.run()
        for t in st.trainers:
            assert isinstance(t.agent, NatureAgent) and t.counters["updates"] > 0
            ring = t.replay.data["latent/z"][0]
            assert (ring[64:160] > 0).all()  # acted by the policy
            assert (ring[:64] > 0).all(-1).mean() > 0.5  # random prefill, written back
        h0, h1 = (t.replay.data["latent/h"][0, 100] for t in st.trainers)
        assert not np.array_equal(h0, h1)  # each seed's own latents
        updates = [t.counters["updates"] for t in st.trainers]
    finally:
        st.close()
    acting = load_to_act(str(tmp_path / "nature" / "seed-1"))
    assert isinstance(acting.agent, NatureAgent)
    acting.close()
    r = runner.invoke(app, ["train", "--resume", str(tmp_path / "nature"), "--steps", "240"])
    assert r.exit_code == 0, r.output
    again = json.loads(r.output.split("done: ", 1)[1])
    assert all(again[s]["updates"] > u for s, u in zip(("0", "1"), updates))


def test_compiled_seeds_batch_in_one_compiled_update(tmp_path):
    """train.compile=true with --seeds at the CPU preset's batches: the batched update,
    compiled as a whole (it equals separate eager updates: tests/test_batched.py), and the
    seeds' config.yaml keeps train.compile. Within the prefill, so nothing is compiled
    here."""
    from lucid.config import make_config
    from lucid.multiseed import SeedsTrainer
    cfg = make_config("cpu-control", env={"id": "CartPole-v1"}, model={"size": "nano"},
                      train={"compile": True, "prefill": 100},
                      run={"steps": 40, "logger": "none", "progress": False,
                           "videos": False})
    tr = SeedsTrainer.start(cfg, [0, 1], tmp_path / "c")
    try:
        assert tr.batched.vmap and tr.batched.compiled
        assert all(t.agent.config.train.compile for t in tr.trainers)
        tr.run()
    finally:
        tr.close()
    for d in seed_dirs(tmp_path / "c"):
        assert yaml.safe_load((d / "config.yaml").read_text())["train"]["compile"] is True

