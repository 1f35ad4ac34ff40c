import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

from lucid.agent import Agent
from lucid.config import make_config
from lucid.specs import ActionSpec, ObsSpec


def test_dict_observation_routes_images_and_vectors_to_their_own_encoder_and_decoder():
    space = gym.spaces.Dict({
        "camera": gym.spaces.Box(0, 255, (32, 32, 3), np.uint8),
        "depth": gym.spaces.Box(0, 255, (32, 32, 1), np.uint8),
        "joints": gym.spaces.Box(-1, 1, (5,), np.float64),
        "goal": gym.spaces.Box(-1, 1, (2, 3), np.float32),
    })
    spec = ObsSpec.from_space(space)
    assert spec.image_shape == (4, 32, 32) and spec.vector_dim == 11
    cfg = make_config("default", model={"size": "nano"},
                      train={"batch_size": 2, "batch_length": 4, "horizon": 3})
    torch.manual_seed(0)
    agent = Agent(spec, ActionSpec.from_space(gym.spaces.MultiDiscrete([3, 2])), cfg)
    assert agent.wm.encoder.cnn is not None and agent.wm.encoder.mlp is not None
    raw = space.sample()
    obs = spec.convert({k: np.stack([v, v]) for k, v in raw.items()}, (2,))
    assert obs["camera"].dtype == np.uint8 and obs["joints"].dtype == np.float32
    B, T = 2, 4
    batch_obs = {k: torch.as_tensor(np.repeat(v[:, None], T, 1)) for k, v in obs.items()}
    recon = agent.wm.decoder(torch.zeros(B, T, agent.wm.feat_dim))
    assert recon["camera"].shape == (B, T, 3, 32, 32) and recon["depth"].shape == (B, T, 1, 32, 32)
    assert recon["joints"].shape == (B, T, 5) and recon["goal"].shape == (B, T, 6)
    action = torch.cat([torch.eye(3)[torch.zeros(B, T, dtype=torch.long)],
                        torch.eye(2)[torch.ones(B, T, dtype=torch.long)]], -1)
    batch = {"obs": batch_obs, "action": action, "reward": torch.ones(B, T),
             "is_first": torch.zeros(B, T, dtype=torch.bool),
             "is_terminal": torch.zeros(B, T, dtype=torch.bool)}
    metrics = agent.train(batch)
    assert all(np.isfinite(v) for v in metrics.values())
    act, state = agent.policy({k: v[:, 0] for k, v in batch_obs.items()})
    assert act.shape == (2, 5)
    assert torch.equal(act[:, :3].sum(-1), torch.ones(2)) and torch.equal(act[:, 3:].sum(-1), torch.ones(2))
    env_act = agent.act_spec.to_env(act.numpy())
    assert env_act.shape == (2, 2) and (env_act[:, 0] < 3).all() and (env_act[:, 1] < 2).all()


def test_nan_observation_is_refused_with_the_key_named():
    spec = ObsSpec.from_space(gym.spaces.Dict({"joints": gym.spaces.Box(-1, 1, (3,))}))
    bad = {"joints": np.array([[0.0, np.nan, 1.0]])}
    try:
        spec.convert(bad, (1,))
    except ValueError as exc:
        assert "joints" in str(exc) and "NaN" in str(exc)
    else:
        raise AssertionError("NaN observation was accepted")


def test_unsupported_space_is_named():
    try:
        ObsSpec.from_space(gym.spaces.Dict({"text": gym.spaces.Text(5)}))
    except TypeError as exc:
        assert "text" in str(exc) and "supports" in str(exc)
        assert "FilterObservation" in str(exc)  # MiniGrid's mission: train on the others
    else:
        raise AssertionError("Text space was accepted")


@pytest.mark.parametrize("space", [
    gym.spaces.Box(-1, 1, (0,), np.float32), gym.spaces.Box(-1, 1, (2, 0), np.float32),
    gym.spaces.MultiDiscrete(np.zeros(0, np.int64)),
])
def test_an_action_space_without_actions_is_refused(space):
    """Such a space used to be taken: the run went through its prefill, then failed at the
    actor's first action (IndexError, or a TypeError in numpy's words); as a leaf of a
    Dict beside other actions, the MultiDiscrete did so too."""
    with pytest.raises(TypeError, match="has no actions in it.*give the env at least one"):
        ActionSpec.from_space(space)
    with pytest.raises(TypeError, match=r"\(action 'a'\) has no actions in it.*drop it"):
        ActionSpec.from_space(gym.spaces.Dict({"a": space, "b": gym.spaces.Discrete(3)}))


def test_float_images_in_0_1_become_pixels_and_other_float_images_are_refused():
    spec = ObsSpec.from_space(gym.spaces.Box(0.0, 1.0, (16, 16, 3), np.float32))
    x = np.random.default_rng(0).random((2, 16, 16, 3), dtype=np.float32)
    got = spec.convert(x, (2,))["image"]
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, np.rint(x * 255).astype(np.uint8))
    pixels = ObsSpec.from_space(gym.spaces.Box(0.0, 255.0, (16, 16, 3), np.float32))
    np.testing.assert_array_equal(pixels.convert(x * 255, (2,))["image"], got)
    try:
        ObsSpec.from_space(gym.spaces.Box(-np.inf, np.inf, (16, 16, 3), np.float32))
    except TypeError as exc:
        assert "[-inf, inf]" in str(exc) and "FlattenObservation" in str(exc)
    else:
        raise AssertionError("an unbounded float image was accepted (it would be clipped)")


def test_float_images_outside_their_bounds_are_clipped_with_a_warning():
    """A Box(0, 1) image whose env gives 0..255 floats would train on white frames: said
    once, with the bounds to declare; values within rounding of the bounds are fine."""
    from lucid import LucidWarning
    spec = ObsSpec.from_space(gym.spaces.Box(0.0, 1.0, (16, 16, 3), np.float32))
    x = np.random.default_rng(1).random((16, 16, 3), dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec.convert(np.clip(x + 0.001, 0, 1.001))  # within rounding: silent
    with pytest.warns(LucidWarning, match=r"observation has values outside \[0, 1\], the "
                                          r"range lucid reads .*Box\(0, 255\)"):
        got = spec.convert(x * 255)["image"]
    np.testing.assert_array_equal(got, np.rint(np.clip(x * 255 * 255, 0, 255)))  # clipped


def test_discrete_spaces_with_a_start_keep_their_offsets():
    obs = ObsSpec.from_space(gym.spaces.Discrete(3, start=-1))
    np.testing.assert_array_equal(obs.convert(np.array([-1, 1]), (2,))["vector"],
                                  [[1, 0, 0], [0, 0, 1]])
    try:
        obs.convert(np.array([2]), (1,))
    except ValueError as exc:
        assert "outside its Discrete space" in str(exc)
    else:
        raise AssertionError("an observation outside Discrete(3, start=-1) was accepted")
    act = ActionSpec.from_space(gym.spaces.Discrete(3, start=5))
    np.testing.assert_array_equal(act.to_env(np.eye(3, dtype=np.float32)), [5, 6, 7])
    np.testing.assert_array_equal(act.from_env(np.array([7, 5])), [[0, 0, 1], [1, 0, 0]])
    multi = gym.spaces.MultiDiscrete([2, 3], start=[1, -1])
    act = ActionSpec.from_space(multi)
    samples = np.stack([multi.sample() for _ in range(20)])
    model = act.from_env(samples)
    assert model.shape == (20, 5) and np.all(model.sum(-1) == 2)
    back = act.to_env(model)
    np.testing.assert_array_equal(back, samples)
    assert all(multi.contains(a) for a in back)


def test_box_actions_stay_inside_half_open_and_degenerate_bounds():
    space = gym.spaces.Box(np.array([0.0, -1.0, 2.0]), np.array([np.inf, 3.0, 2.0]), dtype=np.float64)
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        act = ActionSpec.from_space(space)
    # said once, at the caller's line (here), not at lucid's internals
    assert [w.filename for w in caught if "infinite bounds at dims [0]" in str(w.message)] \
        == [__file__]
    env = act.to_env(np.array([[-0.5, 0.0, 0.7], [0.5, 1.0, -1.0]], np.float32))
    np.testing.assert_allclose(env, [[0.0, 1.0, 2.0], [0.5, 3.0, 2.0]])
    assert all(space.contains(a.astype(np.float64)) for a in env)
    model = act.from_env(np.array([[0.5, 1.0, 2.0]]))
    assert np.all(np.isfinite(model))  # low == high: 0, not 0/0
    np.testing.assert_allclose(model, [[0.5, 0.0, 0.0]])
    assert env.dtype == np.float64  # the space's dtype


def test_box_actions_take_the_spaces_dtype_and_integer_boxes_the_nearest_integer():
    """A float16 Box gets float16 actions, an integer Box the nearest integers within its
    bounds (by hand: -1 + (a + 1) / 2 * 4 for Box(-1, 3))."""
    model = np.array([[-1.0, 0.1], [0.3, 1.7], [-0.2, -0.9]], np.float32)
    ints = gym.spaces.Box(-1, 3, (2,), np.int8)
    env = ActionSpec.from_space(ints).to_env(model)
    assert env.dtype == np.int8 and all(ints.contains(a) for a in env)
    np.testing.assert_array_equal(env, [[-1, 1], [2, 3], [1, -1]])  # 1.2, 1.6, 0.6, -0.8
    halves = gym.spaces.Box(-1, 1, (2,), np.float16)
    env = ActionSpec.from_space(halves).to_env(model)
    assert env.dtype == np.float16 and all(halves.contains(a) for a in env)
    # int64 bounds past 2**53 round in float64 (2**63 - 1 to 2**63, which int64 cannot hold;
    # 2**62 + 1000 to 2**62 + 1024, outside the Box): the actions stay within the exact bounds
    top = np.iinfo(np.int64).max
    wide = gym.spaces.Box(np.array([-top - 1, 0]), np.array([top, 2**62 + 1000]), (2,), np.int64)
    env = ActionSpec.from_space(wide).to_env(np.array([[1.0, 1.0], [-1.0, 0.0]], np.float32))
    assert env.dtype == np.int64 and all(wide.contains(a) for a in env), env
    assert env[0, 0] > 2**62 and env[0, 1] == 2**62 + 1000 and env[1, 0] == -top - 1


def test_image_like_spaces_in_another_layout_are_refused_with_the_wrapper_to_use():
    cases = [((3, 64, 64), "channel-first image"), ((64, 64), "without a channel axis"),
             ((64, 64, 5), "5 channels"), ((4, 64, 64, 3), "4 stacked frames"),
             ((4, 84, 84), "drop the stacking")]
    for shape, message in cases:  # as vectors they would be 12,288-wide MLP inputs
        try:
            ObsSpec.from_space(gym.spaces.Box(0, 255, shape, np.uint8))
        except TypeError as exc:
            assert message in str(exc), str(exc)
        else:
            raise AssertionError(f"{shape} uint8 was taken as a vector")
    assert ObsSpec.from_space(gym.spaces.Box(0, 255, (7, 7, 3), np.uint8)).vectors == {"vector": 147}
    try:
        ObsSpec.from_space(gym.spaces.Dict({}))
    except TypeError as exc:
        assert "empty Dict" in str(exc)
    else:
        raise AssertionError("an empty Dict was accepted")
    with pytest.raises(TypeError, match="stacked frames"):  # floats too
        ObsSpec.from_space(gym.spaces.Box(0.0, 1.0, (4, 64, 64, 1), np.float32))


def test_observation_keys_may_share_names_with_step_fields():
    # the policy takes is_first as its own argument and the replay stores observations under
    # obs/<key>, so an env's "is_first" or "reward" observation is an observation like any other
    space = gym.spaces.Dict({"is_first": gym.spaces.Box(-1, 1, (2,)),
                             "reward": gym.spaces.Box(-1, 1, (3,))})
    spec = ObsSpec.from_space(space)
    assert spec.vectors == {"is_first": 2, "reward": 3}
    cfg = make_config("default", model={"size": "nano"})
    torch.manual_seed(0)
    agent = Agent(spec, ActionSpec.from_space(gym.spaces.Discrete(2)), cfg)
    obs = {"is_first": torch.zeros(4, 2), "reward": torch.zeros(4, 3)}
    _, state = agent.policy(obs)
    moved = dict(obs, is_first=torch.ones(4, 2))
    first = torch.tensor([True, False, False, False])
    torch.manual_seed(1)
    _, a = agent.policy(obs, state, is_first=first)
    torch.manual_seed(1)
    _, b = agent.policy(moved, state, is_first=first)
    assert not torch.equal(a.z, b.z)  # the observation "is_first" reached the posterior
    fresh = agent.policy(obs)[1]
    assert torch.equal(a.h[0], fresh.h[0]) and not torch.equal(a.h[1], fresh.h[1])


def test_one_observation_or_a_batch_is_told_by_the_spaces_own_shapes():
    mat = ObsSpec.from_space(gym.spaces.Box(0, 1, (2, 3)))
    assert mat.batch_of(np.zeros((2, 3))) is None  # one (2, 3) observation, not a batch of 2
    assert mat.batch_of(np.zeros((5, 2, 3))) == 5
    try:
        mat.batch_of(np.zeros(3))
    except ValueError as exc:  # named as one observation, without a made-up key
        assert str(exc).startswith("the observation has shape (3,): one observation has "
                                   "shape (2, 3)"), str(exc)
    else:
        raise AssertionError("a (3,) observation was taken for a (2, 3) space")
    assert mat.convert(np.ones((2, 3)), ())["vector"].shape == (6,)
    both = ObsSpec.from_space(gym.spaces.Dict({
        "image": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8),
        "vec": gym.spaces.Box(-1, 1, (2,)), "mode": gym.spaces.Discrete(3)}))
    batch = {"mode": np.zeros(4, np.int64), "vec": np.zeros((4, 2)),  # any key order
             "image": np.zeros((4, 16, 16, 3), np.uint8)}
    assert both.batch_of(batch) == 4
    assert both.batch_of({k: v[0] for k, v in batch.items()}) is None
    try:
        both.convert(dict(batch, vec=np.zeros((4, 3))), (4,))
    except ValueError as exc:
        assert "observation 'vec' has shape (4, 3), expected (4, 2)" in str(exc), str(exc)
    else:
        raise AssertionError("a (4, 3) batch was taken for (4, 2)")


def test_nested_dict_tuple_multidiscrete_and_multibinary_observations():
    """Every leaf of a Dict/Tuple observation is one key named by its path; (Multi)Discrete
    leaves are one-hots per entry, MultiBinary ones 0/1 vectors: checked against numpy, for
    one observation, for a hand-made batch and for a gymnasium vector env's batch."""
    from envs_for_tests import NestedEnv
    env = NestedEnv()
    spec = ObsSpec.from_space(env.observation_space)
    assert spec.keys() == ["0/inner/mode", "0/pos", "1", "2"]  # gymnasium sorts Dict keys
    assert spec.vectors == {"0/pos": 2, "0/inner/mode": 3, "1": 2 + 3 + 4 + 2, "2": 3}
    assert spec.structured and spec.shape("1") == (2, 2) and spec.shape("0/inner/mode") == ()
    obs, _ = env.reset(seed=0)

    def by_hand(o):
        pos, mode = o[0]["pos"], o[0]["inner"]["mode"]
        md = o[1].ravel()
        onehots = [np.eye(n)[v] for n, v in zip([2, 3, 4, 2], md)]
        return {"0/pos": pos, "0/inner/mode": np.eye(3)[mode - 1],
                "1": np.concatenate(onehots), "2": o[2].astype(np.float32)}

    one = spec.convert(obs)
    for k, v in by_hand(obs).items():
        np.testing.assert_array_equal(one[k], v)
        assert one[k].dtype == np.float32
    assert spec.batch_of(obs) is None
    venv = gym.vector.SyncVectorEnv([NestedEnv, NestedEnv])
    batch, _ = venv.reset(seed=[1, 2])
    assert spec.batch_of(batch) == 2
    got = spec.convert(batch, (2,))
    for i in range(2):
        single = (
            {"pos": batch[0]["pos"][i], "inner": {"mode": batch[0]["inner"]["mode"][i]}},
            batch[1][i], batch[2][i])
        for k, v in by_hand(single).items():
            np.testing.assert_array_equal(got[k][i], v)
    bad = (obs[0], np.array([[1, 3], [0, 1]]), obs[2])  # 3 is outside nvec 3
    try:
        spec.convert(bad)
    except ValueError as exc:
        assert "observation '1'" in str(exc) and "outside its MultiDiscrete space" in str(exc)
    else:
        raise AssertionError("a MultiDiscrete observation out of range was accepted")
    try:
        spec.convert(({"pos": obs[0]["pos"]}, obs[1], obs[2]))
    except KeyError as exc:
        assert "missing key '0/inner/mode'" in str(exc)
    else:
        raise AssertionError("an observation without a key was accepted")
    try:
        ObsSpec.from_space(gym.spaces.Dict({"a/b": gym.spaces.Discrete(2),
                                            "a": gym.spaces.Dict({"b": gym.spaces.Discrete(2)})}))
    except ValueError as exc:
        assert "both named 'a/b'" in str(exc)
    else:
        raise AssertionError("two leaves of one name were accepted")


def test_multibinary_actions_are_a_two_way_categorical_per_entry():
    space = gym.spaces.MultiBinary([2, 3])
    act = ActionSpec.from_space(space)
    assert act.discrete == [2] * 6 and act.dim == 12
    samples = np.stack([space.sample() for _ in range(30)])
    model = act.from_env(samples)
    assert model.shape == (30, 12) and np.all(model.reshape(30, 6, 2).sum(-1) == 1)
    np.testing.assert_array_equal(model.reshape(30, 6, 2)[..., 1], samples.reshape(30, 6))
    back = act.to_env(model)
    np.testing.assert_array_equal(back, samples)
    assert back.dtype == space.dtype and all(space.contains(a) for a in back)


def test_a_custom_env_with_nested_observations_and_multibinary_actions_trains_and_acts(tmp_path):
    from lucid import Dreamer
    from envs_for_tests import NestedEnv
    with Dreamer("envs_for_tests:NestedEnv", size="nano", run_dir=tmp_path / "run",
                 env__num_envs=2,
                 train={"batch_size": 2, "batch_length": 8, "horizon": 3, "prefill": 16,
                        "train_ratio": 16}) as agent:
        agent.learn(40)
        assert agent.trainer.counters["env_steps"] == 40 and agent.trainer.counters["updates"] > 0
        assert agent.trainer.replay.data["obs/1"].shape[-1] == 11
        env = NestedEnv()
        obs, _ = env.reset(seed=3)
        action, state = agent.predict(obs)
        assert env.action_space.contains(action)
        venv = gym.vector.SyncVectorEnv([NestedEnv] * 3)
        batch, _ = venv.reset(seed=0)
        actions, _ = agent.predict(batch, deterministic=True)
        assert actions.shape == (3, 3) and all(env.action_space.contains(a) for a in actions)
        assert len(agent.evaluate(1)) == 1


@pytest.mark.parametrize("kind", ["discrete", "box"])
def test_dict_and_tuple_action_spaces_map_leaf_by_leaf(kind):
    """The model's action is the leaves' model actions side by side, in the space's leaf order;
    a vector env's batch (a Dict/Tuple of batches) goes there and back unchanged."""
    from envs_for_tests import DICT_ACTIONS
    space = DICT_ACTIONS[kind]()
    act = ActionSpec.from_space(space)
    batch_space = gym.vector.utils.batch_space(space, 16)
    batch_space.seed(0)
    batch = batch_space.sample()
    model = act.from_env(batch)
    if kind == "discrete":  # leaves in order: arm (MultiDiscrete [2, 4]), grip (2 bits), move
        assert act.discrete == [2, 4, 2, 2, 3] and model.shape == (16, 13)
        np.testing.assert_array_equal(model[:, 0:2].argmax(-1), batch["arm"][0][:, 0])
        np.testing.assert_array_equal(model[:, 2:6].argmax(-1), batch["arm"][0][:, 1])
        np.testing.assert_array_equal(model[:, 7], batch["grip"][:, 0])
        np.testing.assert_array_equal(model[:, 10:13].argmax(-1) + 1, batch["move"])
    else:  # a Box(-2, 2, (2,)) then Box(0, 1, (1,)), each rescaled to [-1, 1]
        assert act.discrete is None and model.shape == (16, 3)
        np.testing.assert_allclose(model[:, :2], batch[0] / 2, atol=1e-6)
        np.testing.assert_allclose(model[:, 2], 2 * batch[1]["x"][:, 0] - 1, atol=1e-6)
    back = act.to_env(model)
    for path, _ in act.parts:
        np.testing.assert_allclose(act._get(back, path), act._get(batch, path), atol=1e-6)
    assert all(space.contains(act.item(back, i)) for i in range(16))


def test_an_action_space_mixing_discrete_and_box_puts_the_one_hots_first():
    """Leaves in order gear (Discrete(3, start=1)), steer (Box(-2, 2, (2,))), turbo
    (MultiBinary(1)): the model's action is [gear's one-hot, turbo's, steer rescaled]."""
    from envs_for_tests import DICT_ACTIONS
    space = DICT_ACTIONS["mixed"]()
    act = ActionSpec.from_space(space)
    assert act.discrete == [3, 2] and act.n_discrete == 5 and act.dim == 7
    assert not act.is_discrete and not act.is_continuous
    assert act.slices() == [slice(0, 3), slice(5, 7), slice(3, 5)]
    batch_space = gym.vector.utils.batch_space(space, 16)
    batch_space.seed(1)
    batch = batch_space.sample()
    model = act.from_env(batch)
    assert model.shape == (16, 7)
    np.testing.assert_array_equal(model[:, 0:3].argmax(-1) + 1, batch["gear"])
    np.testing.assert_array_equal(model[:, 0:3].sum(-1), 1)
    np.testing.assert_array_equal(model[:, 3:5].argmax(-1), batch["turbo"][:, 0])
    np.testing.assert_allclose(model[:, 5:7], batch["steer"] / 2, atol=1e-6)
    back = act.to_env(model)
    for path, _ in act.parts:
        np.testing.assert_allclose(act._get(back, path), act._get(batch, path), atol=1e-6)
    assert all(space.contains(act.item(back, i)) for i in range(16))
    # a Normal sample beyond [-1, 1] reaches the env clipped to the Box's bounds
    model[:, 5:7] = [3.0, -5.0]
    assert np.all(act.to_env(model)["steer"] == [2.0, -2.0])


@pytest.mark.parametrize("kind", ["discrete", "box", "mixed"])
def test_a_custom_env_with_dict_actions_trains_acts_and_evaluates(tmp_path, kind):
    from lucid import Dreamer
    from envs_for_tests import DictActionEnv
    with Dreamer("envs_for_tests:DictActionEnv", size="nano", run_dir=tmp_path / "run",
                 env__num_envs=2, env__kwargs={"kind": kind},
                 train={"batch_size": 2, "batch_length": 8, "horizon": 3, "prefill": 16,
                        "train_ratio": 16}) as agent:
        agent.learn(40)  # the env asserts that every action lies in its space
        assert agent.trainer.counters["updates"] > 0
        env = DictActionEnv(kind)
        obs, _ = env.reset(seed=3)
        action, _ = agent.predict(obs)
        assert env.action_space.contains(action)
        venv = gym.vector.SyncVectorEnv([lambda: DictActionEnv(kind)] * 3)
        batch, _ = venv.reset(seed=0)
        actions, _ = agent.predict(batch, deterministic=True)
        venv.step(actions)  # a batch in the vector env's layout
        assert len(agent.evaluate(1)) == 1
        agent.save(tmp_path / "agent.pt")
    loaded = Dreamer.load(tmp_path / "agent.pt")
    assert env.action_space.contains(loaded.predict(obs)[0])


def test_dict_spaces_with_integer_keys_are_dicts_not_tuples():
    spec = ObsSpec.from_space(gym.spaces.Dict({0: gym.spaces.Box(-1, 1, (2,)),
                                               1: gym.spaces.Discrete(3)}))
    got = spec.convert({1: 2, 0: np.array([0.5, -0.5])})
    np.testing.assert_array_equal(got["0"], [0.5, -0.5])
    np.testing.assert_array_equal(got["1"], [0, 0, 1])
    try:
        spec.convert({0: np.zeros(2)})
    except KeyError as exc:  # shown as its message, not a quoted key
        assert str(exc) == "observation is missing key '1' (has [0])"
    else:
        raise AssertionError("a missing key was accepted")


def test_predict_is_as_strict_as_training_and_names_the_mistake(tmp_path):
    from lucid import Dreamer
    from envs_for_tests import LaterBrokenEnv
    agent = Dreamer(LaterBrokenEnv(), size="nano")
    obs, info = LaterBrokenEnv().reset(seed=0)
    action, _ = agent.predict(obs)
    assert int(action) in (0, 1)
    cases = [((obs, info), TypeError, r"pair \(observation, info\).*obs, info = env.reset\(\)"),
             (dict(obs, cam=obs["cam"] / 255.0), ValueError,
              "observation 'cam' is float64, which its space's dtype uint8 cannot hold"),
             (dict(obs, b=np.zeros((3, 1))), ValueError,
              r"observation 'b' has shape \(3, 1\), expected \(3,\)"),
             ({"cam": obs["cam"]}, KeyError, "observation is missing key 'b'")]
    for bad, error, message in cases:
        try:
            agent.predict(bad)
        except error as exc:
            assert re.search(message, str(exc)), str(exc)
        else:
            raise AssertionError(f"predict accepted {message}")
    discrete = Dreamer("FrozenLake-v1", size="nano")
    assert int(discrete.predict(3)[0]) in range(4)
    try:
        discrete.predict(2.5)  # a float for a Discrete observation: not rounded silently
    except ValueError as exc:
        assert "is float64, which its space's dtype int64 cannot hold" in str(exc)
    else:
        raise AssertionError("predict took 2.5 for a Discrete observation")


def test_discrete_observations_become_one_hots_from_their_start_and_others_are_refused():
    spec = ObsSpec.from_space(gym.spaces.Discrete(3, start=1))
    got = spec.convert(np.array([1, 3, 2]), (3,))["vector"]
    np.testing.assert_array_equal(got, np.eye(3, dtype=np.float32)[[0, 2, 1]])
    for bad in (0, 4):  # below its start, past its end
        with pytest.raises(ValueError, match=rf"= \[{bad}\] lies outside its Discrete space "
                                             r"\(1 to 3\)"):
            spec.convert(np.array([bad]), (1,))


def test_images_of_one_to_four_channels_are_images_of_any_size():
    for c in (1, 3, 4):  # gray, RGB, RGBA
        spec = ObsSpec.from_space(gym.spaces.Box(0, 255, (32, 48, c), np.uint8))
        assert spec.images == {"image": (32, 48, c)} and not spec.vectors
    for h, w in ((64, 72), (72, 64), (84, 84)):  # sides that 16 does not divide
        spec = ObsSpec.from_space(gym.spaces.Box(0, 255, (h, w, 3), np.uint8))
        assert spec.images == {"image": (h, w, 3)}


def test_bool_box_actions_are_true_above_the_middle_of_the_model_range():
    spec = ActionSpec.from_space(gym.spaces.Box(0, 1, (4,), np.bool_))
    got = spec.to_env(np.array([[-1.0, -0.2, 0.2, 1.0]], np.float32))
    assert got.dtype == np.bool_ and got.tolist() == [[False, False, True, True]]


def test_image_like_layouts_are_told_at_their_16_pixel_boundary_and_float_matrices_are_vectors():
    """16 pixels a side is an image (as for H x W x C): a 16 x 16 uint8 is a grayscale image
    without its channel axis and 4 x 16 x 16 x 3 stacked frames; a float matrix is no image."""
    for shape, message in (((16, 16), "without a channel axis"),
                           ((4, 16, 16, 3), "4 stacked frames")):
        with pytest.raises(TypeError, match=message):
            ObsSpec.from_space(gym.spaces.Box(0, 255, shape, np.uint8))
    spec = ObsSpec.from_space(gym.spaces.Box(-np.inf, np.inf, (16, 16), np.float32))
    assert spec.vectors == {"vector": 256} and not spec.images
    x = np.arange(256, dtype=np.float32).reshape(16, 16)
    np.testing.assert_array_equal(spec.convert(x)["vector"], x.ravel())


def test_image_observations_of_other_sizes_are_refused():
    """All images share one height and width (checked for widths too), and an observation of
    another size than its space's is refused, named, not passed on."""
    for other in ((16, 32, 1), (32, 16, 1)):
        with pytest.raises(ValueError, match="must share one height and width"):
            ObsSpec.from_space(gym.spaces.Dict({
                "a": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8),
                "b": gym.spaces.Box(0, 255, other, np.uint8)}))
    spec = ObsSpec.from_space(gym.spaces.Box(0, 255, (32, 48, 3), np.uint8))
    assert spec.image_shape == (3, 32, 48)  # (C, H, W) of a H x W x C image
    with pytest.raises(ValueError, match=r"has shape \(48, 32, 3\), expected \(32, 48, 3\)"):
        spec.convert(np.zeros((48, 32, 3), np.uint8))


def test_integer_images_become_their_pixels_and_bad_float_images_are_refused():
    """An int32 image in 0..255 is its own pixels (uint8, not scaled); a NaN float image is
    refused, a float image whose low is below 0 at one pixel is refused at its space, and a
    value 1 below a Box(0, 255) float image's bounds is warned about."""
    from lucid import LucidWarning
    spec = ObsSpec.from_space(gym.spaces.Box(0, 255, (16, 16, 3), np.int32))
    assert spec.images == {"image": (16, 16, 3)}
    x = np.random.default_rng(2).integers(0, 256, (2, 16, 16, 3)).astype(np.int32)
    got = spec.convert(x, (2,))["image"]
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, x)
    floats = ObsSpec.from_space(gym.spaces.Box(0.0, 255.0, (16, 16, 1), np.float32))
    bad = np.zeros((16, 16, 1), np.float32)
    bad[3, 4, 0] = np.nan
    with pytest.raises(ValueError, match="contains NaN or Inf"):
        floats.convert(bad)
    below = np.zeros((16, 16, 1), np.float32)
    below[0, 0, 0] = -1.0
    with pytest.warns(LucidWarning, match=r"values outside \[0, 255\]"):
        np.testing.assert_array_equal(floats.convert(below)["image"], 0)
    low = np.zeros((16, 16, 1), np.float32)
    low[5, 5, 0] = -1.0
    with pytest.raises(TypeError, match=r"float image \(16, 16, 1\) with values in \[-1, 1\]"):
        ObsSpec.from_space(gym.spaces.Box(low, 1.0, (16, 16, 1), np.float32))


def test_observations_missing_a_tuple_item_or_of_another_multidiscrete_shape_are_refused():
    spec = ObsSpec.from_space(gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2,)),
                                                gym.spaces.Discrete(3))))
    with pytest.raises(KeyError, match=r"observation has no item '1': it is tuple of 1"):
        spec.convert((np.zeros(2, np.float32),))
    grid = ObsSpec.from_space(gym.spaces.MultiDiscrete([[2, 3], [4, 2]]))
    np.testing.assert_array_equal(grid.convert(np.array([[1, 2], [3, 0]]))["vector"],
                                  [0, 1, 0, 0, 1, 0, 0, 0, 1, 1, 0])
    with pytest.raises(ValueError, match=r"has shape \(4,\), expected \(2, 2\)"):
        grid.convert(np.array([1, 2, 3, 0]))


def test_multidiscrete_grid_actions_keep_their_shape_and_item_takes_the_ith_action():
    grid = gym.spaces.MultiDiscrete([[2, 3], [4, 2]])
    act = ActionSpec.from_space(grid)
    samples = np.array([[[1, 2], [3, 0]], [[0, 0], [1, 1]]])
    back = act.to_env(act.from_env(samples))
    assert back.shape == (2, 2, 2)
    np.testing.assert_array_equal(back, samples)
    space = gym.spaces.Dict({"a": gym.spaces.Discrete(4), "b": gym.spaces.Box(-1, 1, (2,))})
    act = ActionSpec.from_space(space)
    batch = {"a": np.array([0, 1, 2, 3]), "b": np.linspace(-1, 1, 8).reshape(4, 2)}
    back = act.to_env(act.from_env(batch))
    for i in range(4):
        one = act.item(back, i)
        assert one["a"] == i
        np.testing.assert_allclose(one["b"], batch["b"][i], atol=1e-6)


def test_box_actions_with_infinite_bounds_stay_in_minus_1_to_1():
    """Where a Box is unbounded, lucid's action is the model's own, clipped to [-1, 1]."""
    with pytest.warns(Warning, match="infinite bounds"):
        act = ActionSpec.from_space(gym.spaces.Box(-np.inf, np.inf, (2,), np.float32))
    got = act.to_env(np.array([[3.0, -0.25], [-5.0, 0.5]], np.float32))
    np.testing.assert_array_equal(got, [[1.0, -0.25], [-1.0, 0.5]])
