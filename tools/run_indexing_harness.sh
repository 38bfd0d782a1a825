#!/usr/bin/env bash
# Build and run the host harness of the CUDA work-item indexing (g++ only, no
# CUDA or torch): kernels/tests/*_harness.cpp against the CPU loops.
# Run from the repository root.
set -euo pipefail

CXX="${CXX:-g++}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$CXX" -std=c++17 -O2 -fopenmp-simd -Wall -Wextra -Werror -I kernels/include \
  kernels/tests/indexing_harness.cpp kernels/src/cpu/lstm_pointwise_cpu.cpp \
  -o "$tmp/indexing_harness"
"$tmp/indexing_harness"

# The persistent kernel's per-block body, scheduled as its grid barrier orders it.
"$CXX" -std=c++17 -O2 -fopenmp-simd -Wall -Wextra -Werror -I kernels/include \
  kernels/tests/persistent_harness.cpp kernels/src/cpu/lstm_pointwise_cpu.cpp \
  -o "$tmp/persistent_harness"
"$tmp/persistent_harness"

# The persistent tensor-core kernel's per-warp body, with a scalar mma.sync of
# the PTX ISA's m16n8k16 fragment layout; also the backward recurrent product.
"$CXX" -std=c++17 -O2 -fopenmp-simd -Wall -Wextra -Werror -I kernels/include \
  kernels/tests/persistent_tc_harness.cpp kernels/src/cpu/lstm_pointwise_cpu.cpp \
  -o "$tmp/persistent_tc_harness"
"$tmp/persistent_tc_harness"

# The cluster forward's coverage, h copies and bank-conflict-free loads.
"$CXX" -std=c++17 -O2 -fopenmp-simd -Wall -Wextra -Werror -I kernels/include \
  kernels/tests/persistent_cluster_harness.cpp -o "$tmp/persistent_cluster_harness"
"$tmp/persistent_cluster_harness"

# The LayerNorm LSTM's row kernels, phase by phase, each block sum over the threads.
"$CXX" -std=c++17 -O2 -fopenmp-simd -Wall -Wextra -Werror -I kernels/include \
  kernels/tests/layernorm_rows_harness.cpp kernels/src/cpu/layernorm_lstm_rows_cpu.cpp \
  -o "$tmp/layernorm_rows_harness"
"$tmp/layernorm_rows_harness"
