import os

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

from envs_for_tests import CountEnv
from lucid import Dreamer
from lucid.checkpoint import (atomic_torch_save, list_checkpoints, load_checkpoint, load_latest,
                              save_checkpoint)
from lucid.train import Trainer
from lucid.config import ConfigError, make_config


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch /tmp/lucid_pwned_marker",))


def test_malicious_checkpoint_runs_nothing(tmp_path):
    marker = "/tmp/lucid_pwned_marker"
    if os.path.exists(marker):
        os.remove(marker)
    path = tmp_path / "ckpt-000000001.pt"
    torch.save({"format_version": 1, "payload": _Exploit()}, path)
    with pytest.raises(ValueError, match=r"refused to load.*could run code\): .*system"):
        load_checkpoint(path)
    assert not os.path.exists(marker)
    text = tmp_path / "train.py"  # a file given by mistake is no threat, only not a checkpoint
    text.write_text("import os\nprint(1)\n")
    with pytest.raises(ValueError, match=r"train.py is a text file, not a lucid checkpoint: "
                                         r"give a file that Dreamer.save wrote"):
        load_checkpoint(text)
    readme = tmp_path / "README.md"  # text beyond ASCII (a README with 32×32 in it)
    readme.write_text("# lucid\n\nan RSSM with 32×32 categorical latents " * 20)
    with pytest.raises(ValueError, match=r"README.md is a text file, not a lucid checkpoint"):
        load_checkpoint(readme)
    with pytest.raises(FileNotFoundError, match=r"cannot write .*x.pt: the directory .*missing "
                                                r"does not exist"):
        atomic_torch_save({}, tmp_path / "missing" / "x.pt")


def test_a_refused_newest_checkpoint_stops_the_load_instead_of_falling_back(tmp_path):
    """A checkpoint that holds code is not a corrupt file to step over: loading the run
    stops there, and both files stay as they were."""
    older = save_checkpoint(tmp_path, {"counters": {"updates": 1}})
    hostile = older.with_name("ckpt-000000002.pt")
    torch.save({"format_version": 1, "payload": _Exploit()}, hostile)
    with pytest.raises(ValueError, match="refused to load .*ckpt-000000002.pt"):
        load_latest(tmp_path, set_aside=True)
    assert list_checkpoints(tmp_path) == [older, hostile]


def test_other_files_saved_by_torch_are_not_lucid_checkpoints(tmp_path):
    for name, obj in (("weights.pt", {"layer.weight": torch.zeros(2)}),
                      ("future.pt", {"format_version": 999, "agent": {}}), ("list.pt", [1, 2])):
        torch.save(obj, tmp_path / name)
        with pytest.raises(ValueError, match=f"{name} is not a lucid checkpoint of format"):
            load_checkpoint(tmp_path / name)


def test_saving_removes_the_temporary_files_of_a_killed_save(tmp_path):
    stale = tmp_path / "checkpoints" / "ckpt-000000007.pt.tmp"
    stale.parent.mkdir()
    stale.write_bytes(b"half a checkpoint")
    path = save_checkpoint(tmp_path, {"counters": {"updates": 8}})
    assert not stale.exists() and load_checkpoint(path)["counters"] == {"updates": 8}


def _small_cfg(tmp_path, steps=50):
    return make_config(
        "default", env={"id": "CartPole-v1"}, model={"size": "nano"},
        train={"batch_size": 2, "batch_length": 8, "horizon": 3, "prefill": 20,
               "train_ratio": 16},
        run={"steps": steps, "progress": False, "run_dir": str(tmp_path)})


def test_truncated_newest_checkpoint_falls_back_to_previous(tmp_path):
    tr = Trainer(_small_cfg(tmp_path, 40))
    tr.run()
    first = tr.save()
    tr.counters["updates"] += 1  # a newer checkpoint name
    newest = tr.save()
    assert list_checkpoints(tmp_path)[-1] == newest
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 3])
    with pytest.warns(UserWarning, match="unreadable"):
        payload, path = load_latest(tmp_path)
    assert path == first
    assert payload["counters"]["updates"] == tr.counters["updates"] - 1
    newest.write_bytes(bytes(len(data)))  # zero-filled (a crash of the filesystem)
    with pytest.warns(UserWarning, match="not a readable checkpoint"):
        assert load_latest(tmp_path)[1] == first
    tr.close()


def test_dreamer_load_takes_a_run_directory_and_never_writes_into_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the loaded agent's own directory goes to ./runs/
    tr = Trainer(_small_cfg(tmp_path / "run", 40))
    tr.run()
    tr.close()
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    agent = Dreamer.load(tmp_path / "run", run_dir=None)  # its newest checkpoint
    assert agent.trainer.counters["env_steps"] == 40
    assert agent.trainer.run_dir != tmp_path / "run"  # further learning goes elsewhere
    for p, q in zip(tr.agent.wm.parameters(), agent.agent.wm.parameters()):
        assert torch.equal(p, q)
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before
    with pytest.raises(FileNotFoundError, match="neither a checkpoint file nor a run"):
        Dreamer.load(tmp_path)
    import gymnasium as gym
    with pytest.raises(TypeError, match=r"an instance \(CartPoleEnv\(\)\)"):
        Dreamer(gym.make("CartPole-v1").unwrapped.__class__)
    with pytest.raises(ValueError, match="section__key=value"):
        Dreamer("CartPole-v1", train=4)
    with pytest.raises(ValueError, match="whole number of env steps"):
        agent.learn(1.5)


def test_dreamer_api_learn_predict_save_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default directory would appear in ./runs/
    kw = dict(size="nano", train={"batch_size": 2, "batch_length": 8, "horizon": 3,
                                  "prefill": 20, "train_ratio": 16})
    agent = Dreamer("CartPole-v1", run_dir=tmp_path / "run", **kw)
    # made to act with until the first learn(): no directory, no files, no lock
    assert agent.run_dir is None and sorted(tmp_path.iterdir()) == []
    other = Dreamer("CartPole-v1", run_dir=tmp_path / "run", **kw)  # nothing claimed yet
    assert len(other.evaluate(1)) == 1 and sorted(tmp_path.iterdir()) == []
    fresh_weights = [p.detach().clone() for p in agent.agent.wm.parameters()]
    agent.learn(40)
    assert agent.trainer.run_dir == tmp_path / "run" and list_checkpoints(tmp_path / "run")
    assert not (tmp_path / "runs").exists()
    changed = [not torch.equal(p, q) for p, q in zip(fresh_weights, agent.agent.wm.parameters())]
    assert any(changed)  # learn() trained the weights predict() now uses
    # the directory of a live run (this process's agent holds it) is not taken
    with pytest.raises(ConfigError, match="run is in use by a Trainer or Dreamer of this "
                                          "process: close.*Nothing was written"):
        other.learn(10)  # the directory is the first one's now
    assert agent.trainer.counters["env_steps"] == 40
    agent.learn(2e1)  # a whole float, as in learn(1e5)
    assert agent.trainer.counters["env_steps"] == 60
    # config.yaml holds where learn() went, as `lucid train --steps` would (a CLI resume
    # without --steps stops there)
    assert agent.run_dir == tmp_path / "run"
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["run"]["steps"] == 60
    obs = np.array([0.01, -0.02, 0.03, 0.0], np.float32)
    action, state = agent.predict(obs, deterministic=True)
    assert int(action) in (0, 1)
    actions, _ = agent.predict(np.stack([obs, obs, obs]), deterministic=True)
    assert actions.shape == (3,)
    # episode_start resets the marked rows only: row 0 as from state=None, row 1 carries on
    pair = np.stack([obs, -obs])
    _, s1 = agent.predict(pair, deterministic=True)
    _, s2 = agent.predict(pair, s1, deterministic=True, episode_start=np.array([True, False]))
    _, fresh = agent.predict(pair, deterministic=True)
    _, carried = agent.predict(pair, s1, deterministic=True)
    assert torch.equal(s2.h[0], fresh.h[0]) and torch.equal(s2.h[1], carried.h[1])
    assert not torch.allclose(fresh.h[1], carried.h[1])  # the reset makes a difference
    _, all_new = agent.predict(pair, s1, deterministic=True, episode_start=True)
    assert torch.equal(all_new.h, fresh.h)
    with pytest.raises(ValueError, match="state for 2 env.*3 observation"):
        agent.predict(np.stack([obs, obs, obs]), s1)
    with pytest.raises(TypeError, match="state a previous predict returned"):
        agent.predict(obs, state=(s1.h, s1.z))
    with pytest.raises(ValueError, match="a bool or 2 bools"):
        agent.predict(pair, s1, episode_start=[1, 0, 1])
    agent.save(tmp_path / "a.pt")
    with pytest.raises(IsADirectoryError, match="give a file name"):
        agent.save(tmp_path)
    agent.save(tmp_path / "new" / "dir" / "a.pt")  # its directory is made
    again = Dreamer.load(tmp_path / "new" / "dir" / "a.pt", run_dir=tmp_path / "run2")
    a2, _ = again.predict(obs, deterministic=True)
    assert int(a2) == int(action)
    for p, q in zip(agent.agent.wm.parameters(), again.agent.wm.parameters()):
        assert torch.equal(p, q)
    assert not (tmp_path / "run2").exists()  # loaded to act with: no directory until learn()
    again.learn(10)
    assert again.trainer.counters["env_steps"] == 70 and list_checkpoints(tmp_path / "run2")
    again.close()
    # learn() after close(): the run goes on from its checkpoint, with its lock again
    again.learn(10)
    assert again.trainer.counters["env_steps"] == 80 and again.trainer.collector is not None
    with pytest.raises(Exception, match="in use by another Trainer"):  # held once more
        Dreamer.load(tmp_path / "run2", resume=True)
    again.close()
    agent.close()
    # saved from a GPU run with its CUDA graph, loaded on a machine without one: on this CPU
    payload = torch.load(tmp_path / "a.pt", weights_only=True)
    assert "cuda_graph: null" in payload["config"]  # chosen by the device: none on a CPU
    payload["config"] = payload["config"].replace("device: auto", "device: cuda").replace(
        "cuda_graph: null", "cuda_graph: true")
    torch.save(payload, tmp_path / "gpu.pt")
    if not torch.cuda.is_available():
        on_cpu = Dreamer.load(tmp_path / "gpu.pt", run_dir=tmp_path / "run3")
        assert on_cpu.agent.device.type == "cpu" and not on_cpu.cfg.train.cuda_graph
        assert int(on_cpu.predict(obs, deterministic=True)[0]) == int(action)
        on_cpu.learn(5)  # and learns on here, without the graph
        assert on_cpu.trainer.counters["env_steps"] == 65
        on_cpu.close()
    assert Dreamer.load(tmp_path / "gpu.pt", run_dir=tmp_path / "run4",
                        device="cpu").agent.device.type == "cpu"


class _ClosingEnv(gym.Env):
    """An env that cannot be used after close(), as envs holding a simulator or a socket."""
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.closed, self.t = False, 0

    def reset(self, *, seed=None, options=None):
        assert not self.closed, "reset after close"
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        assert not self.closed, "step after close"
        self.t += 1
        return np.full(3, 0.1 * int(action), np.float32), 1.0, False, self.t >= 10, {}

    def close(self):
        self.closed = True


def test_an_env_instance_is_copied_and_never_closed_under_the_caller(tmp_path):
    """Every env made from an instance is a fresh copy of it as given: the start-up check
    closes its copy, and training and evaluation still get usable ones."""
    env = _ClosingEnv()
    with Dreamer(env, size="nano", run_dir=tmp_path / "run",
                 train={"batch_size": 2, "batch_length": 8, "horizon": 3, "prefill": 20,
                        "train_ratio": 8}) as agent:
        agent.learn(30)
        assert agent.trainer.counters["env_steps"] == 30
        assert agent.trainer.counters["env_restarts"] == 0
        assert agent.evaluate(1) == [10.0]
        assert agent.evaluate(2, return_lengths=True) == ([10.0, 10.0], [10, 10])
    assert not env.closed and env.t == 0  # the caller's object was never used


def test_dreamer_api_takes_an_env_instance_and_a_callback(tmp_path):
    import gymnasium as gym
    env = gym.make("CartPole-v1", max_episode_steps=30)
    seen = []

    def callback(info):
        seen.append(info)
        return np.bool_(len(seen) < 3)  # stop after the third episode (any falsy value)

    agent = Dreamer(env, size="nano", run_dir=tmp_path / "run",
                    train={"batch_size": 2, "batch_length": 8, "horizon": 3, "prefill": 20,
                           "train_ratio": 16})
    # no preset named: on a machine without a CUDA device, the CPU recipe for vectors
    assert agent.cfg.preset == ("default" if torch.cuda.is_available() else "cpu-control")
    assert agent.cfg.env.num_envs == 1
    agent.learn(10_000, callback=callback)
    assert len(seen) == 3 and all(1 <= s["length"] <= 30 for s in seen)
    assert agent.trainer.counters["episodes"] == 3
    assert agent.trainer.counters["env_steps"] == seen[-1]["env_steps"] < 10_000  # stopped
    rets = agent.evaluate(2)  # evaluation runs in a copy of the instance
    assert len(rets) == 2 and all(1 <= r <= 30 for r in rets)
    agent.learn(20, callback=lambda info: None)  # a stopped run can learn again; None goes on
    assert agent.trainer.counters["env_steps"] >= seen[-1]["env_steps"] + 20
    # messages and default directories call the instance by its class
    from lucid.rundir import default_run_dir
    assert default_run_dir(agent.cfg).name.startswith("CartPoleEnv-")
    assert agent.trainer.resume_hint() == (f"Dreamer.load({str(tmp_path / 'run')!r}, "
                                          f"resume=True, env=CartPoleEnv(...))")
    with pytest.raises(ConfigError, match=r"continue it with Dreamer\.load\(.*resume=True, "
                                          r"env=CartPoleEnv\(\.\.\.\)\)"):
        Trainer(make_config("cpu-control", run={"run_dir": str(tmp_path / "run")}))
    agent.save(tmp_path / "a.pt")  # the checkpoint holds the env's name, not the instance
    with pytest.raises(ValueError, match=r"trained on an env instance.*env=CartPoleEnv\(\.\.\.\)"):
        Dreamer.load(tmp_path / "a.pt", run_dir=tmp_path / "r2")
    again = Dreamer.load(tmp_path / "a.pt", run_dir=tmp_path / "r3",
                         env=gym.make("CartPole-v1", max_episode_steps=30))
    for p, q in zip(agent.agent.wm.parameters(), again.agent.wm.parameters()):
        assert torch.equal(p, q)
    assert len(again.evaluate(1)) == 1  # in the instance passed
    with pytest.raises(ValueError, match="episodes >= 1"):
        again.evaluate(0)
    again.close()
    # the run itself continues from Python, with its replay and counters
    counters, steps = dict(agent.trainer.counters), agent.trainer.replay.count
    with pytest.raises(ConfigError, match="in use by another Trainer or Dreamer of this process"):
        Dreamer.load(tmp_path / "run", resume=True, env=gym.make("CartPole-v1"))
    agent.close()
    with Dreamer.load(tmp_path / "run", resume=True,
                      env=gym.make("CartPole-v1", max_episode_steps=30)) as cont:
        assert cont.trainer.counters == counters and cont.trainer.replay.count == steps
        assert cont.trainer.run_dir == tmp_path / "run"
        cont.learn(20)
        assert cont.trainer.counters["env_steps"] == counters["env_steps"] + 20
    again = Dreamer.load(tmp_path / "run", resume=True, env=gym.make("CartPole-v1"))
    assert again.trainer.counters["env_steps"] == counters["env_steps"] + 20  # it was saved
    again.close()


def test_dreamer_names_the_cpu_presets_when_the_envs_preset_is_the_papers(recwarn):
    """As `lucid train` notes it: a preset picked by the env's domain that is one of the
    paper's settings is slow on a CPU; a preset the user chose, a CPU preset, or a train ratio
    the user chose, is not noted."""
    with pytest.warns(UserWarning, match=r"preset dmc-proprio is the paper's setting \(train "
                                         r"ratio 512\).*preset='cpu-control'.*"
                                         r"preset='cpu-pixels'") as rec:
        Dreamer("dmc:cartpole-balance", size="nano", run__device="cpu")
    (said,) = [w for w in rec if "paper's setting" in str(w.message)]
    assert said.filename == __file__  # the user's line
    recwarn.clear()
    Dreamer("dmc:cartpole-balance", preset="dmc-proprio", size="nano", run__device="cpu")
    Dreamer("dmc:cartpole-balance", size="nano", run__device="cpu",
            train__train_ratio=32)  # chosen
    assert not [w for w in recwarn if "paper's setting" in str(w.message)]
    # outside the paper's suites a CPU gets lucid's CPU recipe, and is told what it changes
    with pytest.warns(UserWarning, match=r"no preset given and no CUDA device: preset "
                                         r"cpu-control.*preset='default' runs the 2023"):
        assert Dreamer("Pendulum-v1", size="nano", run__device="cpu").cfg.preset \
            == "cpu-control"
    recwarn.clear()
    Dreamer("Pendulum-v1", preset="cpu-control", size="nano", run__device="cpu")
    assert not [w for w in recwarn if "preset" in str(w.message)]


def test_an_env_instance_trains_on_one_copy_unless_more_are_asked_for(tmp_path):
    env = gym.make("CartPole-v1")
    assert Dreamer(env, size="nano", run__device="cpu").cfg.env.num_envs == 1
    with Dreamer(env, size="nano", run__device="cpu", run_dir=tmp_path / "run",
                 env__num_envs=3, train__prefill=12) as agent:
        assert agent.cfg.env.num_envs == 3
        agent.learn(12)
        assert agent.trainer.collector.n == 3
    # kwargs cannot reach a copy of an instance; videos of one made without rgb_array say how
    with pytest.raises(TypeError, match=r"env.kwargs \['sutton_barto_reward'\] cannot apply"):
        Dreamer(env, size="nano", env__kwargs={"sutton_barto_reward": True})
    from lucid.envs import make_env
    with pytest.raises(TypeError, match="made with render_mode=None: make it with "
                                        "render_mode='rgb_array'"):
        make_env(Dreamer(env, size="nano").cfg.env.id, render_mode="rgb_array")


def test_an_env_instance_reaches_env_processes_started_without_fork():
    """AsyncVectorEnv under forkserver (Python 3.14's default on Linux; spawn on macOS and
    Windows): the child cannot look the instance up in this process, so it travels with
    the env constructor."""
    from lucid.envs import env_fn
    agent = Dreamer(gym.make("CartPole-v1"), size="nano", preset="cpu-control")
    envs = gym.vector.AsyncVectorEnv([env_fn(agent.cfg.env.id, 50)] * 2, context="forkserver")
    try:
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 4) and envs.step(np.array([0, 1]))[0].shape == (2, 4)
    finally:
        envs.close()


class _Success(gym.Env):
    """3-step episodes whose last step's info says whether it succeeded (odd episodes)."""
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.n = 0, getattr(self, "n", -1) + 1
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        info = {"success": self.n % 2 == 1, "at": {"t": self.t}} if self.t == 3 else {}
        return np.zeros(2, np.float32), 0.0, self.t == 3, False, info


def test_the_callback_gets_each_episodes_last_info():
    """info of the step that ended the episode, that env's own entries of the vector env's
    batched info (two envs; masks say which env an entry belongs to)."""
    from lucid.envs import env_info
    batched = {"success": np.array([False, True]), "_success": np.array([False, True]),
               "at": {"t": np.array([0, 3]), "_t": np.array([False, True])},
               "_at": np.array([False, True])}
    assert env_info(batched, 1) == {"success": True, "at": {"t": 3}}
    assert env_info(batched, 0) == {}
    seen = []
    with Dreamer(_Success(), size="nano", preset="cpu-control", env__num_envs=2,
                 train__prefill=10**6) as agent:
        agent.learn(24, callback=lambda info: seen.append(info["info"]))
    # 12 steps per env: 3 episodes of 3 steps, each followed by its reset step
    assert len(seen) == 6 and all(i["at"] == {"t": 3} for i in seen)
    assert sorted(i["success"] for i in seen) == [False] * 4 + [True] * 2


def test_ctrl_c_during_learn_saves_then_reaches_the_program(tmp_path):
    """SIGINT in learn(): a checkpoint at the step it stopped, then the program's own
    handling of Ctrl-C (KeyboardInterrupt), not a quiet return."""
    import signal
    # The program's handling is Python's default (KeyboardInterrupt): a suite started in the
    # background of a non-interactive shell inherits SIGINT ignored instead.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_in_learn(tmp_path)
    finally:
        signal.signal(signal.SIGINT, before)


def _ctrl_c_in_learn(tmp_path):
    import os
    import signal
    agent = Dreamer("CartPole-v1", size="nano", preset="cpu-control", run__device="cpu",
                    run_dir=tmp_path / "run", train__prefill=10**6)
    sent = []

    def interrupt(info):
        if not sent:
            sent.append(info["env_steps"])
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        agent.learn(10**6, callback=interrupt)
    steps = agent.trainer.counters["env_steps"]
    assert sent and steps < 10**6 and agent.trainer.signalled == signal.SIGINT
    agent.close()
    again = Dreamer.load(tmp_path / "run", resume=True)
    assert again.trainer.counters["env_steps"] == steps  # the checkpoint is at the stop
    again.close()


def _nano(env, **kw):
    return Dreamer(env, size="nano", preset="cpu-control", run__device="cpu", **kw)


def test_saving_over_a_path_that_is_not_a_regular_file_is_refused(tmp_path):
    """Files are written to a temporary file renamed over the path: over a pipe, a device or
    a socket, that replaced the special file itself (as root, save('/dev/null') or `lucid
    report --out /dev/stdout` replaced the device node with a regular file)."""
    import stat
    from typer.testing import CliRunner
    from lucid.cli import app
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    agent = _nano(CountEnv(2))
    with pytest.raises(ValueError, match="is not a regular file"):
        agent.save(pipe)
    link = tmp_path / "link.pt"
    link.symlink_to(pipe)  # a link to one too
    with pytest.raises(ValueError, match="is not a regular file"):
        agent.save(link)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "episodes.jsonl").write_text("")
    page = tmp_path / "page.html"
    os.mkfifo(page)
    r = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--out", str(page)])
    assert r.exit_code == 2 and "is not a regular file" in r.output, r.output
    assert stat.S_ISFIFO(os.stat(pipe).st_mode) and stat.S_ISFIFO(os.stat(page).st_mode)
    assert link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.pt", "page.html", "pipe", "run"]


def test_save_and_load_take_a_path_that_starts_with_a_tilde(tmp_path, monkeypatch):
    """save("~/agent.pt") wrote ./~/agent.pt: Python expands no ~ by itself."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    _nano(CountEnv(2)).save("~/agent.pt")
    assert (tmp_path / "home" / "agent.pt").is_file() and not (tmp_path / "~").exists()
    assert Dreamer.load("~/agent.pt", env=CountEnv(2)).cfg.model.size == "nano"


def test_each_env_instance_stays_as_it_was_given():
    """Every env made for an agent is a copy of its instance as it was when given: a later
    change to the caller's object does not reach it, and two instances of one class are two
    envs (each agent evaluates in its own)."""
    one, two = CountEnv(2), CountEnv(3)  # episodes return 1 + 2 and 1 + 2 + 3
    first, second = _nano(one), _nano(two)
    one.length = 50  # after Dreamer(one): not the env the agent was given
    assert first.evaluate(1) == [3.0] and second.evaluate(1) == [6.0]


def test_dreamer_refuses_envs_and_arguments_it_cannot_use_before_anything_runs(tmp_path):
    """Mistakes in what Dreamer, learn(), predict() and load(resume=True) are given are
    named at once, before a run directory is made or a step is taken."""
    import threading
    live = CountEnv(2)
    live.lock = threading.Lock()  # a live handle: the instance cannot be copied
    with pytest.raises(TypeError, match=r"cannot copy the env instance \(TypeError: .*pass it by "
                                        r"name"):
        _nano(live)
    venv = gym.vector.SyncVectorEnv([lambda: CountEnv(2)])
    with pytest.raises(TypeError, match="got a vector env; pass one env"):
        _nano(venv)
    venv.close()
    with pytest.raises(TypeError, match="must be a gymnasium.Env or an env name, got int"):
        _nano(3)
    agent = _nano(CountEnv(2), run_dir=tmp_path / "run")
    for bad in (-1, True, 1.5, "10"):
        with pytest.raises(ValueError, match="whole number of env steps >= 0"):
            agent.learn(bad)
    with pytest.raises(TypeError, match=r"learn\(callback=...\) takes a function"):
        agent.learn(10, callback=5)  # was a TypeError at the first episode's end, mid-run
    assert agent.run_dir is None and not (tmp_path / "run").exists()
    obs = np.zeros(2, np.float32)
    with pytest.raises(TypeError, match=r"pair \(observation, info\).*obs, info = env.reset"):
        agent.predict((obs, {}))
    with pytest.raises(ValueError, match="a bool or 1 bools, got 1"):
        agent.predict(obs, episode_start=1)  # an int, not a bool
    with pytest.raises(ValueError, match="a batch of 0 observations"):  # numpy's words once
        agent.predict(np.zeros((0, 2), np.float32))
    other = Dreamer(CountEnv(2), size="micro", preset="cpu-control", run__device="cpu")
    with pytest.raises(ValueError, match=r"a state of another model .*\(16,\), \(4, 4\), "
                                         r"\(2,\); this agent's are \(32,\), \(8, 8\)"):
        other.predict(obs, agent.predict(obs)[1])  # was torch's "size of tensor a (16) must ..."
    with pytest.raises(FileNotFoundError, match="resume=True\\) continues a run directory"):
        Dreamer.load(tmp_path / "agent.pt", resume=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ValueError, match="learns on in .* itself; leave out run_dir"):
        Dreamer.load(tmp_path / "elsewhere", run_dir=tmp_path / "other", resume=True)


def test_dreamer_overrides_merge_per_section_and_an_env_name_keeps_its_presets_envs():
    """Keys given as section__key and as a dict per section both apply; an instance trains
    on one copy, an env name on its preset's number of envs; the progress bar is off unless
    asked for."""
    agent = Dreamer("Pendulum-v1", preset="dmc-vision", size="nano", run__device="cpu",
                    train__prefill=7, train={"batch_size": 3})
    assert agent.cfg.env.num_envs == 4  # dmc-vision's, not an instance's single copy
    assert (agent.cfg.train.prefill, agent.cfg.train.batch_size) == (7, 3)
    assert agent.cfg.run.progress is False
    assert _nano("CartPole-v1", run__progress=True).cfg.run.progress is True


def test_predict_and_evaluate_act_greedily_or_by_sampling_as_asked():
    """deterministic=True reaches the policy as explore=False (predict's default samples,
    evaluate's default is greedy), for every step of an evaluation; one observation gives
    one action, not a batch of one."""
    agent = _nano(CountEnv(2))  # episodes return 1 + 2
    real, seen = agent.agent.policy, []

    def policy(obs, state, explore, is_first):
        seen.append(explore)
        return real(obs, state, explore, is_first)

    agent.agent.policy = policy
    obs = np.zeros(2, np.float32)
    action, _ = agent.predict(obs)
    assert np.ndim(action) == 0 and int(action) in (0, 1)
    agent.predict(obs, deterministic=True)
    assert seen == [True, False]
    seen.clear()
    assert agent.evaluate(2) == [3.0, 3.0]
    greedy, seen[:] = seen[:], []
    assert agent.evaluate(1, deterministic=False) == [3.0]
    assert greedy and not any(greedy) and seen and all(seen)


def test_an_agent_made_or_loaded_to_act_with_learns_from_its_weights_in_a_new_directory(
        tmp_path, monkeypatch):
    """An agent loaded from a run directory (then closed: it held nothing) starts its own
    run at learn(): with the loaded weights and counters, in a directory other than the
    run it came from, whose files stay as they were."""
    monkeypatch.chdir(tmp_path)  # the new run's default directory goes to ./runs/
    tr = Trainer(_small_cfg(tmp_path / "run", 40))
    tr.run()
    tr.close()
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    agent = Dreamer.load(tmp_path / "run")
    agent.close()
    agent.learn(0)  # starts the run, takes no step: the weights are the loaded ones
    assert agent.trainer.counters["env_steps"] == 40 and agent.trainer.collector is not None
    assert agent.run_dir.resolve().parent == (tmp_path / "runs").resolve()
    for p, q in zip(tr.agent.wm.parameters(), agent.agent.wm.parameters()):
        assert torch.equal(p, q)
    agent.close()
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before


class _PairObsEnv(CountEnv):
    """CountEnv whose observation is a pair: a Tuple of a Box and a Dict."""

    def __init__(self):
        super().__init__(2)
        self.observation_space = gym.spaces.Tuple((
            gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            gym.spaces.Dict({"b": gym.spaces.Box(-1.0, 1.0, (1,), np.float32)})))

    def _obs(self):
        return np.zeros(2, np.float32), {"b": np.zeros(1, np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        _, *rest = super().step(action)
        return (self._obs(), *rest)


def test_an_observation_that_is_a_pair_of_a_value_and_a_dict_is_not_taken_for_reset_output():
    """predict() refuses (observation, info) from env.reset(), but an env whose observation
    space is a Tuple of two, the second a Dict, gives such pairs as its observations."""
    agent = _nano(_PairObsEnv())
    action, _ = agent.predict(_PairObsEnv()._obs())
    assert int(action) in (0, 1)


def test_load_takes_config_overrides_for_what_it_learns_next(tmp_path):
    """Dreamer.load(path, section__key=value): the saved config with those changes (the
    weights as saved); a bad key or value is refused as Dreamer's are; a resume takes the
    keys a command-line resume may change and names the others."""
    with _nano(CountEnv(3), run_dir=tmp_path / "run", train__prefill=10**6) as agent:
        agent.learn(4)
    loaded = Dreamer.load(tmp_path / "run", env=CountEnv(3), train__actor_lr=1e-4,
                          run={"eval_episodes": 2})
    assert loaded.cfg.train.actor_lr == 1e-4 and loaded.cfg.run.eval_episodes == 2
    assert loaded.cfg.train.prefill == 10**6 and loaded.cfg.model.size == "nano"  # as saved
    for p, q in zip(agent.agent.actor.parameters(), loaded.agent.actor.parameters()):
        assert torch.equal(p, q)
    assert loaded.agent.opt_actor.param_groups[0]["lr"] == 1e-4
    with pytest.raises(ConfigError, match=r"unknown config key 'train.actor_rl'.*actor_lr"):
        Dreamer.load(tmp_path / "run", env=CountEnv(3), train__actor_rl=1e-4)
    with pytest.raises(ConfigError, match=r"Dreamer\.load\(\.\.\., lr=0\.1\): give config keys"):
        Dreamer.load(tmp_path / "run", env=CountEnv(3), lr=0.1)
    with Dreamer.load(tmp_path / "run", resume=True, env=CountEnv(3),
                      run__eval_episodes=3) as again:
        assert again.cfg.run.eval_episodes == 3
    assert "eval_episodes: 3" not in (tmp_path / "run" / "config.yaml").read_text()  # no learn()
    with pytest.raises(ConfigError, match=r"train\.actor_lr cannot be changed on resume"):
        Dreamer.load(tmp_path / "run", resume=True, env=CountEnv(3), train__actor_lr=1e-4)


def test_learn_trains_the_dreamers_own_agent_object(tmp_path):
    """Dreamer.agent is what learn() trains, not a copy made at the first learn(): a hook
    registered before it sees the updates, and the object holds the trained weights; a
    network swapped into it before learn() is refused as it is in a subclass (the optimizer
    holds the old one), not as a checkpoint that does not fit, and makes no directory."""
    small = {"train__prefill": 8, "train__batch_size": 2, "train__batch_length": 4,
             "train__train_ratio": 8}
    agent = _nano(CountEnv(3), run_dir=tmp_path / "run", **small)
    obj, calls = agent.agent, []
    obj.actor.head.register_forward_hook(lambda *_: calls.append(1))
    before = [p.detach().clone() for p in obj.actor.parameters()]
    agent.learn(12)
    assert agent.agent is obj and agent.trainer.agent is obj
    assert agent.trainer.counters["updates"] == 4 and calls
    assert all(not torch.equal(a, b) for a, b in zip(before, obj.actor.parameters()))
    agent.close()
    swapped = _nano(CountEnv(3), run_dir=tmp_path / "swapped", **small)
    swapped.agent.actor.head = torch.nn.Linear(swapped.agent.wm.feat_dim, 2)
    with pytest.raises(ConfigError, match=r"actor's parameters are not the ones its optimizer"
                                          r".*build_actor"):
        swapped.learn(12)
    assert not (tmp_path / "swapped").exists()


def test_a_resume_goes_on_in_the_runs_own_env_or_names_an_instance_runs_env(tmp_path):
    """Dreamer.load(run, resume=True, env=...): a run on a named env is refused another name
    or an instance (the rule a config.yaml edit meets), with its config.yaml as it was, and
    accepts its own name; a run on an instance accepts a name that makes the same env, and is
    then resumable by name (the command line's `Trainer(..., resume=True)`), as it is when
    its config.yaml is given that name by hand."""
    named = tmp_path / "named"
    with _nano("envs_for_tests:CountEnv", run_dir=named, train__prefill=10**6) as agent:
        agent.learn(4)
    yaml_before = (named / "config.yaml").read_text()
    for env, what in (("envs_for_tests:EchoEnv", "'envs_for_tests:EchoEnv'"),
                      (CountEnv(), r"an env instance \(CountEnv\)")):
        with pytest.raises(ConfigError, match=r"trained on 'envs_for_tests:CountEnv', which a "
                                              rf"resume makes again by name.*given {what}"):
            Dreamer.load(named, resume=True, env=env)
        assert (named / "config.yaml").read_text() == yaml_before
    with Dreamer.load(named, resume=True, env="envs_for_tests:CountEnv") as again:
        again.learn(2)
        assert again.trainer.counters["env_steps"] == 6

    def by_name(run):  # what `lucid train --resume RUN` builds
        return Trainer(make_config("default", run={"steps": 0}), run, resume=True)

    for how in ("env=", "config.yaml"):
        run = tmp_path / how
        with _nano(CountEnv(2), run_dir=run, train__prefill=10**6) as agent:
            agent.learn(4)
        if how == "env=":
            with Dreamer.load(run, resume=True, env="envs_for_tests:CountEnv") as again:
                assert again.cfg.env.id == "envs_for_tests:CountEnv"
                again.learn(3)  # episodes of 3 steps now, the named env's default
                assert again.evaluate(1) == [6.0]
        else:
            text = (run / "config.yaml").read_text()
            saved = yaml.safe_load(text)["env"]["id"]
            (run / "config.yaml").write_text(text.replace(saved, "envs_for_tests:CountEnv"))
        tr = by_name(run)
        assert tr.cfg.env.id == "envs_for_tests:CountEnv"
        assert tr.counters["env_steps"] == (7 if how == "env=" else 4)
        tr.close()


def test_a_run_on_an_env_instance_resumes_in_the_instance_passed(tmp_path):
    """Dreamer.load(run, resume=True, env=...) goes on in the env given then, not in the one
    the run was started with."""
    with _nano(CountEnv(2), run_dir=tmp_path / "run", train__prefill=10**6) as agent:
        agent.learn(4)
    # episodes of 4 steps return 1 + 2 + 3 + 4 where the first instance's returned 3
    with Dreamer.load(tmp_path / "run", resume=True, env=CountEnv(4)) as again:
        assert again.trainer.counters["env_steps"] == 4
        assert again.evaluate(1) == [10.0]


def test_one_config_per_run_and_saved_files_keep_the_devices_choice_open(tmp_path):
    """An agent made to act and a resumed run each hold one config, their agent's (the
    settings left to the device chosen); what Dreamer saves keeps those settings null, so
    a GPU that loads it chooses its own."""
    from lucid.config import from_yaml
    with Dreamer("CartPole-v1", size="nano", run__device="cpu", run_dir=tmp_path / "run",
                 train__prefill=16) as agent:
        acting = agent.trainer  # before learn(): a run loaded to act
        assert acting.cfg is acting.agent.config and acting.cfg.train.onehot_gather is True
        assert agent.cfg.train.onehot_gather is None
        agent.learn(20)
    again = Dreamer.load(tmp_path / "run", resume=True)
    try:
        assert again.trainer.cfg is again.trainer.agent.config
        assert again.trainer.cfg.train.onehot_gather is True  # chosen for this CPU
        assert again.cfg.train.onehot_gather is None  # as config.yaml has it
        again.save(tmp_path / "a.pt")
        saved = from_yaml(torch.load(tmp_path / "a.pt", weights_only=False)["config"])
        assert saved.train.onehot_gather is None and saved.train.prefetch is None
    finally:
        again.close()
