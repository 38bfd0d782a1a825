# pipelstm: `make demo` runs the main job, `make test` runs every check.
# Both set everything up on a fresh machine (virtual environment, torch,
# build tools, the extension) from this repository's own files.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MAX_JOBS ?= 2
export MAX_JOBS

.PHONY: all venv build test cpu-checks wheel-then-cuda-venv pytest pytest-host-streams check-cuda indexing-harness test-asan stress first-hour demo demo-word-lm bench clean

# Optional fragments (for example mk/cuda.mk: the CUDA-build variant,
# mk/wheel.mk: the wheel installed into a fresh environment).
-include mk/*.mk

all: build

$(VENV)/.deps: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

venv: $(VENV)/.deps

# BUILT=1: taken as made (`make test`'s sub-makes, after its own build).
build: venv
	$(if $(BUILT),,$(PY) -m pip install --quiet --no-build-isolation --no-deps -e .)

# The suite: the tests that run within their own process on TEST_JOBS
# workers (pytest-xdist), then those that start processes which talk to each
# other (marked `processes`: tests/process_tests.py) one at a time.
# $(call run_suite,python,pytest arguments)
TEST_JOBS ?= 2
run_suite = $(1) -m pytest -q -n $(TEST_JOBS) -m "not processes" $(2) && \
	$(1) -m pytest -q -m processes $(2)

pytest: build
	$(call run_suite,$(PY),tests)

# The CUDA kernels compile (sm_80, sm_90, warnings as errors) with no GPU,
# and the persistent kernels' machine code loads as it should.
check-cuda: venv
	PYTHON=$(PY) bash tools/check_cuda.sh

# The CUDA kernels' indexing, driven over the whole grid on the host.
indexing-harness:
	bash tools/run_indexing_harness.sh

# The pipeline tests again with the CPU's stand-in for a copy stream
# (csrc/pipeline/streams.h): every hand-over between stages is copied late,
# on a thread of its own, so a missing wait on an event fails here too.
pytest-host-streams: build
	PIPELSTM_HOST_COPY_STREAM=300 $(PY) -m pytest -q tests/test_pipeline*.py tests/test_lstm_devices.py

# The CPU build's checks, one after another (a sub-make each, so that the
# parent's -j2 never runs two of them at once).
cpu-checks:
	$(MAKE) pytest
	$(MAKE) pytest-host-streams
	$(MAKE) check-cuda
	$(MAKE) indexing-harness

# The wheel's check, then .venv-cuda: the check removes its environment
# before .venv-cuda is made, so the two never take disk space at once
# (.venv-cuda is about 6 GB).
wheel-then-cuda-venv:
	$(MAKE) test-wheel
	$(MAKE) cuda-venv

# The build, then the CPU build's checks with the wheel's check and
# .venv-cuda's install beside them (mostly downloads), then the CUDA build's.
# The sub-makes take the build as made (BUILT=1).
test: build
	$(MAKE) -j2 BUILT=1 cpu-checks wheel-then-cuda-venv
	$(MAKE) BUILT=1 test-cuda-build

# ASan + UBSan over the C++ core, running the op, fuzz and pipeline tests
# (not part of `make test`: see docs/testing.md for its last result).
test-asan: build
	bash tools/run_sanitizers.sh

# The tests marked `processes` (torch.distributed, torchrun, remote stages,
# the benchmarks' process groups), STRESS_RUNS times in a row, each run a
# fresh pytest (not part of `make test`; about 6 minutes a run on 2 cores):
# any failed run, or an abort in its output, fails it (tools/stress.py,
# build/stress.json).
STRESS_RUNS ?= 50
stress: build
	$(PY) tools/stress.py --runs $(STRESS_RUNS) $(STRESS_TESTS)

# A new user's first hour, timed (not part of `make test`: it downloads
# the torch the README's install picks): a fresh clone, the README's install
# block as written, then every README and docs block with what it installed
# (tools/first_hour.py, build/first_hour.json).
first-hour:
	$(PYTHON) tools/first_hour.py

# The main job: a character-level LSTM language model on a corpus every
# Python ships (pydoc's topics), trained by 2 processes as a 2-stage
# pipeline (torchrun, gloo); validation perplexity after each epoch, the
# pipeline timeline in build/train_lm_timeline.png.
demo: build
	mkdir -p build
	$(VENV)/bin/torchrun --standalone --nproc-per-node=2 examples/train_lm.py --pp 2 \
		--timeline build/train_lm_timeline.json

# The word-level example written for nn.LSTM, run with pipelstm.LSTM.
demo-word-lm: build
	$(PY) examples/word_language_model.py --lstm pipelstm --epochs 4 --log-interval 40

bench: build
	$(PY) -m pipelstm.bench layer

clean:
	rm -rf build python/pipelstm/*.so
