#!/usr/bin/env bash
# Everything a lent GPU machine is for, in one call (docs/design/cuda.md, "On a
# GPU machine"): the extension built against that machine's torch, tests/gpu, the
# persistent tensor-core kernels' own check (kernels/tests/
# run_persistent_tc_gpu_check.sh: results, refusals, timings,
# compute-sanitizer), and `bench gpu` with CUDA graphs as the library
# chooses, off and on. Logs and JSON under $OUT (the
# device tool brings that folder back); a short summary is printed last.
#
#   bash tools/gpu_check.sh                     # all of it
#   BENCH_ARGS="--settings fp32 bf16 --B 1 8 32" bash tools/gpu_check.sh
#   STEPS="build tests" bash tools/gpu_check.sh # a part
#   STEPS="build persistent wavefront profile" bash tools/gpu_check.sh # the switches against the defaults, a profile
#   STEPS="build stack" bash tools/gpu_check.sh # the stack graph against the defaults
#   STEPS="build simulator" bash tools/gpu_check.sh # the simulator against stages on one GPU
#   STEPS="build regularised" bash tools/gpu_check.sh # LayerNorm and the AWD-LSTM options against their peers
#
# PYTHON (default python3: the image's torch), OUT (default build/gpu_check),
# BENCH_SECONDS: rows start only within this many seconds of each bench run
# (default 200), TESTS (default tests/gpu), TEST_SECONDS: the whole test run
# is stopped after this many seconds (default 300), PIPELSTM_SOURCE_COMMIT:
# the commit the tree was copied from, recorded in the JSON (the copy a lent
# machine gets carries no .git of its own: name it; default: git rev-parse HEAD).
# Run from the repository root, one call at a time: a step run beside
# another on the same GPU (the tc step's compute-sanitizer beside a bench)
# slows both, and its timings mean nothing. Only the build may overlap the
# tc step's GPU work.
set -uo pipefail

PY="${PYTHON:-python3}"
OUT="${OUT:-build/gpu_check}"
STEPS="${STEPS:-build tests tc bench}"
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

# The first C++ compiler that links libstdc++ dynamically (the build refuses
# the others, cmake/shared_libstdcxx.cmake): the GPU image's /opt/gcc wrapper,
# which its environment may name in CXX, links it statically.
shared_libstdcxx_compiler() {
  local dir cxx
  dir=$(mktemp -d)
  for cxx in ${PIPELSTM_CXX:-} /usr/bin/g++ /usr/bin/g++-13 /usr/bin/g++-12 /usr/bin/g++-14 ${CXX:-}; do
    [[ -x $cxx ]] || continue
    if "$cxx" cmake/libstdcxx_probe.cpp -o "$dir/probe" 2>/dev/null && readelf -d "$dir/probe" | grep -q 'libstdc++\.so'; then
      echo "$cxx"; rm -rf "$dir"; return 0
    fi
  done
  rm -rf "$dir"; return 1
}

if want build; then
  start=$SECONDS
  if ! cxx=$(shared_libstdcxx_compiler); then
    note "build: FAILED: no C++ compiler here links libstdc++ dynamically (tried PIPELSTM_CXX, /usr/bin/g++[-12/13/14], CXX=${CXX:-})"
    ls -l /usr/bin/*g++* 2>&1 | tee -a "$summary"
    exit 1
  fi
  note "build: compiler $cxx ($("$cxx" -dumpfullversion 2>/dev/null))"
  if CXX="$cxx" CUDAHOSTCXX="$cxx" \
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

if want tc; then
  start=$SECONDS
  timeout "${TC_SECONDS:-300}" env OUT="$OUT/persistent_tc" bash kernels/tests/run_persistent_tc_gpu_check.sh \
    >"$OUT/persistent_tc.log" 2>&1
  note "persistent tensor-core kernels: rc=$? ($((SECONDS - start)) s): $(tail -1 "$OUT/persistent_tc.log")"
  grep -E "^FAIL|us a forward step" "$OUT/persistent_tc.log" | head -30 | tee -a "$summary"
  # Their microseconds a step as a result file (bench persistent_steps),
  # where the extension is built here (the build step before this one).
  if "$PY" -c "import pipelstm" 2>/dev/null; then
    "$PY" -m pipelstm.bench persistent_steps --log "$OUT/persistent_tc/check.log" \
      --json "$OUT/persistent_steps.json" >"$OUT/persistent_steps.log" 2>&1
    note "bench persistent_steps: rc=$? ($OUT/persistent_steps.json)"
  fi
fi

if want bench; then
  # BENCH_GRAPHS: PIPELSTM_CUDA_GRAPHS for each run, "unset" for the library's
  # own choice (gpu.json), 0 (gpu_steps.json), 1 (gpu_graphs.json).
  for graphs in ${BENCH_GRAPHS:-unset 0 1}; do
    case $graphs in unset) name=gpu ;; 0) name=gpu_steps ;; *) name=gpu_graphs ;; esac
    if [[ $graphs == unset ]]; then switch=(-u PIPELSTM_CUDA_GRAPHS); else switch=("PIPELSTM_CUDA_GRAPHS=$graphs"); fi
    start=$SECONDS
    # shellcheck disable=SC2086  (BENCH_ARGS is a list of options)
    env "${switch[@]}" timeout $((BENCH_SECONDS + 120)) "$PY" -m pipelstm.bench gpu \
      --budget-seconds "$BENCH_SECONDS" --json "$OUT/$name.json" ${BENCH_ARGS:-} >"$OUT/$name.log" 2>&1
    note "bench $name: rc=$? ($((SECONDS - start)) s; rows past the budget are listed as not run)"
    sed -n '/geometric mean/,$p' "$OUT/$name.log" | head -8 | tee -a "$summary"
  done
fi

if want persistent; then
  # The persistent kernels everywhere they fit (pipelstm.backends.cuda.persistent
  # = True) against the library's default, the measurement the default rule
  # (csrc/persistent_rule.h) comes from: the gain column.
  start=$SECONDS
  # shellcheck disable=SC2086
  timeout $((BENCH_SECONDS + 120)) "$PY" -m pipelstm.bench gpu --variant persistent=1 \
    --budget-seconds "$BENCH_SECONDS" --settings fp16 bf16 default --B 1 4 8 16 32 --T 100 500 --layers 1 \
    --json "$OUT/gpu_persistent.json" ${PERSISTENT_ARGS:-} >"$OUT/gpu_persistent.log" 2>&1
  note "bench persistent: rc=$? ($((SECONDS - start)) s)"
  sed -n '/geometric mean/,$p' "$OUT/gpu_persistent.log" | head -8 | tee -a "$summary"
fi

if want wavefront; then
  # The layer wavefront (pipelstm.backends.cuda.layer_wavefront = K) against
  # the layers one after another, 4 layers at B <= 32: WAVEFRONT_CHUNKS
  # (default "4 10"), one gpu_wavefront_K.json each (the gain column).
  for chunks in ${WAVEFRONT_CHUNKS:-4 10}; do
    start=$SECONDS
    # shellcheck disable=SC2086
    timeout $((BENCH_SECONDS + 120)) "$PY" -m pipelstm.bench gpu --variant "layer_wavefront=$chunks" \
      --budget-seconds "$BENCH_SECONDS" --settings default bf16 fp16 --B 1 8 32 --T 100 --layers 4 \
      --json "$OUT/gpu_wavefront_$chunks.json" ${WAVEFRONT_ARGS:-} >"$OUT/gpu_wavefront_$chunks.log" 2>&1
    note "bench wavefront K=$chunks: rc=$? ($((SECONDS - start)) s)"
    sed -n '/geometric mean/,$p' "$OUT/gpu_wavefront_$chunks.log" | head -8 | tee -a "$summary"
  done
fi

if want stack; then
  # The stack graph (pipelstm.backends.cuda.stack_graph = K) against the
  # library's default: STACK_CHUNKS (default "1 8"; 1: the layers one after
  # another in one graph, K >= 2: a wavefront inside it), one
  # gpu_stack_K.json each (the gain and memory columns), 4 layers over the
  # small batches the wavefront is for and the large ones where the host
  # gaps were.
  for chunks in ${STACK_CHUNKS:-1 8}; do
    start=$SECONDS
    # shellcheck disable=SC2086
    timeout $((BENCH_SECONDS + 120)) "$PY" -m pipelstm.bench gpu --variant "stack_graph=$chunks" \
      --budget-seconds "$BENCH_SECONDS" --settings default bf16 fp16 --B 1 8 32 256 --H 512 1024 --T 100 --layers 4 \
      --json "$OUT/gpu_stack_$chunks.json" ${STACK_ARGS:-} >"$OUT/gpu_stack_$chunks.log" 2>&1
    note "bench stack graph K=$chunks: rc=$? ($((SECONDS - start)) s)"
    sed -n '/geometric mean/,$p' "$OUT/gpu_stack_$chunks.log" | head -8 | tee -a "$summary"
  done
fi

if want simulator; then
  # The pipeline simulator against one and two pipeline stages on this GPU
  # (bench simulator --device cuda): measured and predicted step and memory.
  start=$SECONDS
  timeout "${SIMULATOR_SECONDS:-240}" "$PY" -m pipelstm.bench simulator --device cuda --reps "${SIMULATOR_REPS:-7}" \
    --json "$OUT/simulator_gpu.json" --calibration "$OUT/simulator_gpu_calibration.json" >"$OUT/simulator_gpu.log" 2>&1
  note "bench simulator on the GPU: rc=$? ($((SECONDS - start)) s)"
  grep -E "^Worst" "$OUT/simulator_gpu.log" | tee -a "$summary"
fi

if want regularised; then
  # The LayerNorm LSTM against plain pipelstm.LSTM and a cell loop, and
  # weight/variational dropout and zoneout against nn.LSTM with the weight
  # drop users write (bench layernorm / regularisation --device cuda).
  for bench in layernorm regularisation; do
    start=$SECONDS
    timeout "${REGULARISED_SECONDS:-150}" "$PY" -m pipelstm.bench "$bench" --device cuda --threads 1 --repeats 7 \
      --json "$OUT/${bench}_gpu.json" >"$OUT/${bench}_gpu.log" 2>&1
    note "bench $bench on the GPU: rc=$? ($((SECONDS - start)) s)"
    grep -E "^\|" "$OUT/${bench}_gpu.log" | cut -c1-140 | tee -a "$summary"
  done
fi

if want profile; then
  # Where a step's time goes, pipelstm and cuDNN (tools/gpu_profile.py).
  start=$SECONDS
  timeout 120 "$PY" tools/gpu_profile.py --json "$OUT/gpu_profile.json" >"$OUT/gpu_profile.log" 2>&1
  note "profile: rc=$? ($((SECONDS - start)) s)"
  grep -E "pipelstm|cuDNN" "$OUT/gpu_profile.log" | cut -c1-120 | tee -a "$summary"
fi
