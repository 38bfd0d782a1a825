#!/usr/bin/env bash
# Everything a lent GPU machine is for, in one call (docs/cuda.md, "On a lent
# GPU"): the extension built against that machine's torch, tests/gpu, and
# `bench gpu`, with and without CUDA graphs. Logs and JSON under $OUT (the
# device tool brings that folder back); a short summary is printed last.
#
#   bash tools/gpu_check.sh                     # all of it
#   BENCH_ARGS="--settings fp32 bf16 --B 1 8 32" bash tools/gpu_check.sh
#   STEPS="build tests" bash tools/gpu_check.sh # a part
#
# PYTHON (default python3: the image's torch), OUT (default build/gpu_check),
# BENCH_SECONDS: rows start only within this many seconds of each bench run
# (default 200), TESTS (default tests/gpu), TEST_SECONDS: the whole test run
# is stopped after this many seconds (default 300), PIPELSTM_SOURCE_COMMIT:
# the commit the tree was copied from, recorded in the JSON (a copy sent to a
# lent machine has no .git; default: git rev-parse HEAD where there is one).
# Run from the repository root.
set -uo pipefail

PY="${PYTHON:-python3}"
OUT="${OUT:-build/gpu_check}"
STEPS="${STEPS:-build tests bench}"
BENCH_SECONDS="${BENCH_SECONDS:-200}"
TESTS="${TESTS:-tests/gpu}"
TEST_SECONDS="${TEST_SECONDS:-300}"
export PIPELSTM_SOURCE_COMMIT="${PIPELSTM_SOURCE_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >"$summary"

note() { echo "$*" | tee -a "$summary"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }

note "gpu_check: $(date -u +%FT%TZ), commit ${PIPELSTM_SOURCE_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$summary"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())" \
  2>&1 | tee -a "$summary"

if want build; then
  # The system compiler: the image's /opt/gcc wrapper links libstdc++
  # statically, which the build refuses (cmake/shared_libstdcxx.cmake).
  start=$SECONDS
  if CXX="${CXX:-/usr/bin/g++}" CUDAHOSTCXX="${CUDAHOSTCXX:-/usr/bin/g++}" \
     TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" PIPELSTM_CUDA=on MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
     "$PY" setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1; then
    note "build: ok ($((SECONDS - start)) s)"
  else
    note "build: FAILED ($((SECONDS - start)) s); the end of $OUT/build.log:"
    tail -40 "$OUT/build.log"
    exit 1
  fi
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if want tests; then
  start=$SECONDS
  # shellcheck disable=SC2086  (TESTS may carry pytest options)
  timeout "$TEST_SECONDS" "$PY" -m pytest -q -p no:cacheprovider -rfE $TESTS >"$OUT/tests.log" 2>&1
  rc=$?
  note "tests ($TESTS): rc=$rc ($((SECONDS - start)) s): $(tail -1 "$OUT/tests.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -30 | tee -a "$summary"
fi

if want bench; then
  for graphs in 0 1; do
    name=gpu$([[ $graphs == 1 ]] && echo _graphs)
    start=$SECONDS
    # shellcheck disable=SC2086  (BENCH_ARGS is a list of options)
    PIPELSTM_CUDA_GRAPHS=$graphs timeout $((BENCH_SECONDS + 120)) "$PY" -m pipelstm.bench gpu \
      --budget-seconds "$BENCH_SECONDS" --json "$OUT/$name.json" ${BENCH_ARGS:-} >"$OUT/$name.log" 2>&1
    note "bench $name: rc=$? ($((SECONDS - start)) s; rows past the budget are listed as not run)"
    sed -n '/geometric mean/,$p' "$OUT/$name.log" | head -8 | tee -a "$summary"
  done
fi
