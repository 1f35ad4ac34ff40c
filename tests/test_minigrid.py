"""MiniGrid as lucid makes it: the same pixels as minigrid's own wrapper chain, and an env
that gymnasium can remake from its spec, so its `check_env` passes (issue 38)."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

pytest.importorskip("minigrid")
pytest.importorskip("cv2")

from minigrid.wrappers import ImgObsWrapper, RGBImgObsWrapper, RGBImgPartialObsWrapper  # noqa: E402

from lucid.envs import make_env  # noqa: E402


@pytest.mark.parametrize("task,partial", [("Empty-5x5", False), ("DoorKey-5x5", False),
                                          ("DoorKey-5x5", True), ("Empty-8x8", False)])
def test_pixels_equal_minigrids_own_wrappers_and_check_env_passes(task, partial):
    ours = make_env(f"minigrid:{task}", partial=partial)
    wrapper = RGBImgPartialObsWrapper if partial else RGBImgObsWrapper
    theirs = ImgObsWrapper(wrapper(gym.make(f"MiniGrid-{task}-v0"), tile_size=16))
    if theirs.observation_space.shape[:2] != (64, 64):
        theirs = gym.wrappers.ResizeObservation(theirs, (64, 64))
    assert ours.observation_space == gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    a, _ = ours.reset(seed=3)
    b, _ = theirs.reset(seed=3)
    np.testing.assert_array_equal(a, b)
    rng = np.random.default_rng(0)
    for _ in range(30):
        action = int(rng.integers(7))
        np.testing.assert_array_equal(ours.step(action)[0], theirs.step(action)[0])
    assert ours.spec is not None and ours.spec.id == f"MiniGrid-{task}-v0"
    check_env(make_env(f"minigrid:{task}", partial=partial), skip_render_check=True)
