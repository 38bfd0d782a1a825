# The CUDA-build variant, run by `make test` with no GPU needed: a second
# virtual environment with a CUDA build of torch, the extension built with
# PIPELSTM_CUDA=on (every op compiled for CUDA and linked), imported on a
# machine without a GPU, and the CPU test suite run against that build.

VENV_CUDA ?= .venv-cuda
PY_CUDA := $(VENV_CUDA)/bin/python

.PHONY: test-cuda-build

$(VENV_CUDA)/.deps: requirements-cuda.txt
	$(PYTHON) -m venv $(VENV_CUDA)
	$(PY_CUDA) -m pip install --quiet --upgrade pip
	$(PY_CUDA) -m pip install --quiet -r requirements-cuda.txt
	touch $@

test-cuda-build: $(VENV_CUDA)/.deps
	PIPELSTM_CUDA=on PIPELSTM_BUILD_DIR=build/cmake-cuda \
	  $(PY_CUDA) -m pip install --quiet --no-build-isolation --no-deps --force-reinstall .
	$(PY_CUDA) tools/check_cuda_build.py
	$(PY_CUDA) -m pytest -q -p no:cacheprovider tests
