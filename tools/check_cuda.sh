#!/usr/bin/env bash
# Compile-only check of the CUDA kernel sources (no GPU or torch needed):
# every kernels/src/cuda/*.cu for sm_80 and sm_90 with all warnings as errors,
# the GPU check programs kernels/tests/*_gpu_check.cu likewise, the public
# CUDA headers through the plain host compiler, and the persistent kernels'
# sm_90 machine code (tools/check_sass.py; $PYTHON runs it).
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

# Compiles one .cu file (extra nvcc flags after it); reports OK or FAIL
# with the compiler's messages.
compile() {
  local src="$1" start=$SECONDS
  shift
  if "$NVCC" "${flags[@]}" "$@" -c "$src" -o "$tmp/$(basename "$src" .cu).o" 2>"$tmp/log"; then
    echo "OK   $src ($((SECONDS - start))s)"
  else
    cat "$tmp/log" >&2
    echo "FAIL $src"
    status=1
  fi
}

shopt -s nullglob
sources=(kernels/src/cuda/*.cu)
if [[ ${#sources[@]} -eq 0 ]]; then
  echo "FAIL no .cu files under kernels/src/cuda" >&2
  exit 1
fi
for src in "${sources[@]}"; do
  compile "$src"
done

# The GPU check programs (run on a GPU machine) must build too.
for src in kernels/tests/*_gpu_check.cu; do
  compile "$src" -I kernels/tests
done

# The CUDA entry-point headers must stay usable from g++-compiled sources.
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

# The persistent tensor-core kernels' loads, in their sm_90 machine code.
"${PYTHON:-python3}" tools/check_sass.py || status=1
exit $status
