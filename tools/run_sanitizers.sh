#!/usr/bin/env bash
# ASan + UBSan over the C++ core: builds pipelstm._C with
# -fsanitize=address,undefined (no recovery: the first finding aborts) in
# build/cmake-asan, stages it beside a copy of the Python package in
# build/asan/ (the normal build is left alone), and runs the op, fuzz and
# pipeline tests under it. Run from the repository root: `make test-asan`.
# Needs the virtual environment of `make build`.
set -euo pipefail

PY="${PY:-.venv/bin/python}"
CXX="${CXX:-g++}"
BUILD=build/cmake-asan
STAGE=build/asan
TESTS=(${ASAN_TESTS:-tests/test_layer_op.py tests/test_packed_layer_op.py tests/test_cell_op.py
       tests/test_bad_input.py tests/test_fuzz_inputs.py tests/test_module_transforms.py
       tests/test_pipeline.py tests/test_pipeline_units.py tests/test_pipeline_balance.py
       tests/test_pipeline_placement.py tests/test_pipeline_core.py tests/test_pipeline_plan.py
       tests/test_lstm_devices.py tests/test_pipeline_recompute.py tests/test_lent_buffers.py
       tests/test_graph_captures.py tests/test_lstm_autograd.py tests/test_cpu_path.py
       tests/test_cpu_fused_loops.py})

mkdir -p "$BUILD"
py_abs="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # not resolved: the venv's own
cmake -S . -B "$BUILD" -G Ninja -DPython3_EXECUTABLE="$py_abs" \
  -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$(realpath "$BUILD")/lib" -DCMAKE_BUILD_TYPE=Release \
  -DPIPELSTM_CUDA=off -DPIPELSTM_SANITIZE=address,undefined >/dev/null
cmake --build "$BUILD" -j "${MAX_JOBS:-2}"

rm -rf "$STAGE"
mkdir -p "$STAGE"
cp -r python/pipelstm "$STAGE/"
rm -f "$STAGE"/pipelstm/_C*.so
cp "$BUILD"/lib/_C*.so "$STAGE/pipelstm/"

# Python itself is not instrumented: the sanitizer runtime must be loaded
# first, and libstdc++ with it (ASan intercepts its operator new/delete).
export LD_PRELOAD="$("$CXX" -print-file-name=libasan.so):$("$CXX" -print-file-name=libstdc++.so)"
# Leaks: the interpreter's own are not ours to chase.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
export PYTHONPATH="$STAGE"
"$PY" -c "import pipelstm, sys; assert pipelstm.__file__.startswith('$STAGE/') or '/$STAGE/' in pipelstm.__file__, pipelstm.__file__"
# --capture=sys: a finding is printed on the real stderr before the abort.
"$PY" -m pytest -q -p no:cacheprovider --capture=sys "${TESTS[@]}"
