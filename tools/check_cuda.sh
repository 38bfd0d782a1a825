#!/usr/bin/env bash
# Compile-only check of the CUDA kernel sources (no GPU or torch needed):
# every kernels/src/cuda/*.cu for sm_80 and sm_90 with all warnings as errors,
# the GPU check programs kernels/tests/*_gpu_check.cu likewise, the public
# CUDA headers through the plain host compiler, and the persistent kernels'
# sm_90 machine code (tools/check_sass.py; $PYTHON runs it). The
# compilations and the machine-code check run MAX_JOBS at a time (default 2);
# each one's result is printed in order once all are done.
# Run from the repository root.
set -euo pipefail

NVCC="${NVCC:-/usr/local/bin/nvcc}"
CXX="${CXX:-g++}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

flags=(-std=c++17 -O3
       -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
       -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings
       -I kernels/include)

status=0
started=()  # "name|log|rc file" of each background job, in start order

# Runs "$@" in the background (at most MAX_JOBS at once), its output in a log
# of its own, printed by finish_jobs.
start_job() {
  local name="$1" n=${#started[@]}
  shift
  while (( $(jobs -rp | wc -l) >= ${MAX_JOBS:-2} )); do wait -n || true; done
  ( local start=$SECONDS
    if "$@" >"$tmp/job$n.log" 2>&1; then echo "0 $((SECONDS - start))"; else echo "1 $((SECONDS - start))"; fi
  ) >"$tmp/job$n.rc" &
  started+=("$name|$tmp/job$n.log|$tmp/job$n.rc")
}

# Waits for every job; prints each compilation's OK/FAIL (with its log on a
# failure) and the machine-code check's own lines.
finish_jobs() {
  wait
  local job name log rc seconds
  for job in "${started[@]}"; do
    IFS="|" read -r name log rc <<<"$job"
    read -r rc seconds <"$rc"
    if [[ "$name" == "sass" ]]; then
      cat "$log"
    elif [[ "$rc" == 0 ]]; then
      echo "OK   $name (${seconds}s)"
    else
      cat "$log" >&2
      echo "FAIL $name"
    fi
    [[ "$rc" == 0 ]] || status=1
  done
}

compile() {
  local src="$1"
  shift
  start_job "$src" "$NVCC" "${flags[@]}" "$@" -c "$src" -o "$tmp/$(basename "$src" .cu).o"
}

shopt -s nullglob
sources=(kernels/src/cuda/*.cu)
if [[ ${#sources[@]} -eq 0 ]]; then
  echo "FAIL no .cu files under kernels/src/cuda" >&2
  exit 1
fi
# The persistent kernels' loads, in their sm_90 machine code (it compiles
# them itself); the longest compilation first.
start_job sass "${PYTHON:-python3}" tools/check_sass.py
for src in "${sources[@]}"; do
  compile "$src"
done

for src in kernels/tests/*_gpu_check.cu; do
  compile "$src" -I kernels/tests
done
finish_jobs

for hdr in kernels/include/pipelstm/kernels/*_cuda.h; do
if echo "#include \"${hdr#kernels/include/}\"" |
   "$CXX" -std=c++17 -Wall -Wextra -Werror -fsyntax-only -I kernels/include \
     -I "$CUDA_HOME/include" -x c++ - 2>"$tmp/log"; then
  echo "OK   $hdr ($CXX)"
else
  cat "$tmp/log" >&2
  echo "FAIL $hdr ($CXX)"
  status=1
fi
done

# Launchers query the device per launch: through cudaDeviceGetAttribute
# (kernels/src/cuda/device_limits.h), never cudaGetDeviceProperties, which
# fills in every property, some slowly, each call.
if grep -nE "cudaGetDeviceProperties *\(" kernels/src/cuda/*.cu kernels/src/cuda/*.h; then
  echo "FAIL kernels/src/cuda calls cudaGetDeviceProperties (use device_limits)"
  status=1
else
  echo "OK   no cudaGetDeviceProperties in kernels/src/cuda"
fi

exit $status
