#!/usr/bin/env bash
# On a GPU machine (nvcc and a driver; no torch needed): builds
# kernels/tests/persistent_tc_gpu_check.cu for this GPU, runs it (fp16/bf16
# forward and backward against the CPU references, the "does not fit"
# answers, timings at T = 100), then compute-sanitizer's memcheck, racecheck,
# synccheck and initcheck on its small checks. Logs go to $OUT (default
# build/persistent_tc_gpu_check). Run from the repository root.
set -uo pipefail

# nvcc and compute-sanitizer from PATH, else from the CUDA toolkit root.
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
NVCC="${NVCC:-$(command -v nvcc || echo "$cuda_home/bin/nvcc")}"
out="${OUT:-build/persistent_tc_gpu_check}"
mkdir -p "$out"
# The program outside $out: a lent GPU machine sends back only a few files.
bin="$(mktemp -d)/persistent_tc_gpu_check"
status=0

start=$SECONDS
if ! "$NVCC" -std=c++17 -O3 -arch=native -lineinfo -Xcompiler -fopenmp-simd -I kernels/include -I kernels/tests \
     kernels/tests/persistent_tc_gpu_check.cu kernels/src/cuda/lstm_persistent_tc.cu \
     kernels/src/cuda/lstm_persistent_cluster.cu \
     kernels/src/cpu/lstm_pointwise_cpu.cpp -o "$bin" >"$out/build.log" 2>&1; then
  cat "$out/build.log"
  echo "FAIL build"
  exit 1
fi
echo "built in $((SECONDS - start))s"

"$bin" 2>&1 | tee "$out/check.log" || status=1

sanitizer="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer ||
                                   echo "$cuda_home/bin/compute-sanitizer")}"
if command -v "$sanitizer" >/dev/null 2>&1; then
  for tool in memcheck racecheck synccheck initcheck; do
    start=$SECONDS
    if "$sanitizer" --tool "$tool" --error-exitcode 9 "$bin" --quick >"$out/$tool.log" 2>&1; then
      echo "ok   compute-sanitizer $tool ($((SECONDS - start))s)"
    else
      tail -30 "$out/$tool.log"
      echo "FAIL compute-sanitizer $tool"
      status=1
    fi
  done
else
  echo "SKIP compute-sanitizer: not found (set COMPUTE_SANITIZER)"
fi
exit $status
