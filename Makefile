# `make train` and `make test` do all set-up on a fresh machine (a virtualenv in .venv).
# torch is installed first and pinned, so that `pip install -e .` keeps it; which build comes
# is pip's choice (a local CPU wheel where pip is configured with one; from plain PyPI on Linux,
# the CUDA build). Choose with e.g. `make TORCH_PIP_ARGS="--index-url .../whl/cpu"`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
TORCH_PIP_ARGS ?=
PYTEST_ARGS ?=
# The suite runs as two pytest processes at once, one thread each, over shares of the test
# files balanced by tests/durations.json (tests/shards.py; each share's log is printed when it
# ends). TEST_SHARDS=1 runs one ordinary pytest process (for PYTEST_ARGS naming files or tests).
TEST_SHARDS ?= 2

.PHONY: setup train test test-all bench gpu-wheels clean

$(BIN)/.installed: pyproject.toml
	@# Headless Chromium (Debian package) renders `lucid report` pages in the tests.
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
	  apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
	  (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1) || \
	  echo "note: could not install chromium; the report rendering test will be skipped"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH) $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

setup: $(BIN)/.installed

train: setup
	$(BIN)/lucid train

test: setup
ifeq ($(TEST_SHARDS),1)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)
else
	$(BIN)/python tests/shards.py -n $(TEST_SHARDS) -- $(PYTEST_ARGS)
endif

bench: setup
	$(BIN)/python benchmarks/train_step.py

# The wheels benchmarks/gpu_suite.sh and gpu_repro.sh install on a bare GPU image (CPython
# 3.12 there): lucid's pure-Python needs and the DMC stack, dm_control without the locomotion,
# dog and test assets the control suite never loads (56 -> 3 MB), so that .whl fits the
# 64 MiB the device tool carries (docs/reproduction.md).
WHEEL_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
gpu-wheels:
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp $(WHEEL_PLATFORMS) -d .whl \
	  omegaconf==2.4.0 gymnasium==1.4.0 farama-notifications==0.0.6 \
	  mujoco==3.17.0 dm-control==1.0.50 dm-env==1.6 dm-tree==0.1.10 labmaze==1.0.6 \
	  glfw==2.11.0 pyopengl==3.1.10
	$(PY) benchmarks/slim_wheel.py .whl/dm_control-1.0.50-py3-none-any.whl \
	  dm_control/locomotion/soccer dm_control/locomotion/walkers dm_control/suite/dog_assets \
	  dm_control/mujoco/testing dm_control/blender dm_control/mjcf/test_assets

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
