# The CUDA-build variant (`make test-cuda-build`, part of `make test`), no GPU
# needed: a second virtual environment with a CUDA build of torch, the
# extension built into it with PIPELSTM_CUDA=on (every op compiled for CUDA and
# linked), imported on a machine without a GPU, and the CPU test suite run
# against that build. Needs an nvcc of torch's CUDA major (see docs/cuda.md).
#
#   make test-cuda-build    all of it (about 5 minutes from scratch on 2 cores)
#   make cuda-venv          only the environment (.venv-cuda)
#   make cuda-build         only the build, installed into it
#
# VENV_CUDA, CUDA_BUILD_DIR and TORCH_CUDA_ARCH_LIST (default here
# CUDA_TEST_ARCHS) override the defaults.

PYTHON ?= python3
VENV_CUDA ?= .venv-cuda
PY_CUDA := $(VENV_CUDA)/bin/python
# Its own CMake folder: the CPU build's (build/cmake-pyXY) stays as it is.
CUDA_BUILD_DIR ?= build/cmake-cuda

.PHONY: test-cuda-build cuda-venv cuda-build

# --no-cache-dir: torch's CUDA wheels (about 3 GB) are not kept a second time
# in pip's cache beside the 6 GB they unpack to.
$(VENV_CUDA)/.deps: requirements-cuda.txt
	@df -h . | awk 'NR == 2 {print "disk free before $(VENV_CUDA) (about 6 GB): " $$4}'
	$(PYTHON) -m venv $(VENV_CUDA)
	$(PY_CUDA) -m pip install --quiet --no-cache-dir -r requirements-cuda.txt
	touch $@

cuda-venv: $(VENV_CUDA)/.deps

# Installed, not editable: the CPU build's in-place python/pipelstm/_C*.so
# is never on this environment's path, nor this build on the CPU one's.
# Machine code for sm_80 and sm_90 (the two the kernels' code differs on)
# and PTX, not the default list's sm_86 and sm_89 as well: nothing here
# runs it, and each architecture is another compilation of every kernel.
CUDA_TEST_ARCHS ?= 8.0;9.0+PTX
cuda-build: $(VENV_CUDA)/.deps
	TORCH_CUDA_ARCH_LIST="$${TORCH_CUDA_ARCH_LIST:-$(CUDA_TEST_ARCHS)}" \
	PIPELSTM_CUDA=on PIPELSTM_BUILD_DIR=$(CUDA_BUILD_DIR) \
	  $(PY_CUDA) -m pip install --quiet --no-build-isolation --no-deps --force-reinstall .

# The suite against the CUDA build (the extension compiled with CUDA, on
# torch's CUDA wheel), less the files whose subject is not that build and
# which run the same code in the CPU build's suite: the docs and their
# examples, the benchmarks' drivers, the simulator, the examples, the
# include graph, the tests of the CPU kernels' ISA builds and buffers (C++
# that CUDA does not change; the op and module tests still run those
# kernels here), and runs of several processes
# (torchrun, gloo ranks, the pipeline's remote stages: the same CPU code).
CUDA_BUILD_SKIP ?= tests/test_docs_examples.py tests/test_docs_hygiene.py tests/test_api_docs.py \
  tests/test_include_graph.py $(wildcard tests/test_bench_*.py) $(wildcard tests/test_simulator*.py) \
  tests/test_pipelining_peer.py tests/test_example_awd_lstm.py tests/test_word_language_model.py \
  tests/test_timeline.py tests/test_cpu_fused_kernels.py tests/test_cpu_huge_pages.py \
  tests/test_distributed.py tests/test_distributed_auto_layout.py tests/test_distributed_timeouts.py \
  tests/test_module_ddp.py tests/test_pipeline_remote.py

test-cuda-build: cuda-build
	# LD_BIND_NOW: every symbol the build calls (cuBLAS's too) must resolve at import.
	LD_BIND_NOW=1 $(PY_CUDA) -c "import pipelstm; assert pipelstm.built_with_cuda(); print('pipelstm from', pipelstm.__file__)"
	$(PY_CUDA) tools/check_cuda_build.py
	$(call run_suite,$(PY_CUDA),-p no:cacheprovider tests $(addprefix --ignore=,$(CUDA_BUILD_SKIP)))
