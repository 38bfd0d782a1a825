# The packages (`make test-wheel`, part of `make test`): the source
# distribution must hold every tracked file the build reads and no build
# output (tests/scripts/sdist_check.py); the wheel, `python -m build --wheel`
# from this tree (the extension from the same CMake folder as `make build`,
# so nothing is compiled again), is installed into a fresh virtual
# environment with the torch .venv holds (same version; pip takes it from its
# cache or the configured index, not from .venv), where pipelstm must import
# from that environment and match nn.LSTM forward and backward
# (tests/scripts/wheel_check.py). About a minute on 2 cores with torch from
# a local wheel, most of it installing torch. The environment (about 1 GB) is
# removed once the check passes, so `make test` never holds it beside
# .venv-cuda; a failed check leaves it in place to look into.
#
# WHEEL_DIR and WHEEL_VENV override the folders (both under build/).

WHEEL_DIR ?= build/wheel-dist
WHEEL_VENV ?= build/wheel-venv

.PHONY: test-wheel wheel

wheel: build
	rm -rf $(WHEEL_DIR)
	$(PY) -m build --sdist --no-isolation --outdir $(WHEEL_DIR)
	$(PY) tests/scripts/sdist_check.py $(WHEEL_DIR)/pipelstm-*.tar.gz
	$(PY) -m build --wheel --no-isolation --outdir $(WHEEL_DIR)

# The environment from .venv's Python: the wheel is built for its version.
test-wheel: wheel
	rm -rf $(WHEEL_VENV)
	$(PY) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install --quiet $(WHEEL_DIR)/pipelstm-*.whl \
	  "torch==$$($(PY) -c 'import torch; print(torch.__version__)')"
	cd $(WHEEL_VENV) && bin/python $(CURDIR)/tests/scripts/wheel_check.py
	rm -rf $(WHEEL_VENV)
