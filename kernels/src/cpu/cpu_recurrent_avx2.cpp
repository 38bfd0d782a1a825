// The fused CPU step kernels built for avx2 (flags in CMakeLists.txt).
#define PIPELSTM_ISA avx2
#define PIPELSTM_VEC 8
#define PIPELSTM_MR 3
// Panels of up to 256 KiB are not sliced (the default: half a Zen 3's L2).
// On a Zen 5 running this build (1 MiB L2) that took the forward's step
// kernels at H=512-1024 from 95-103 to 108-114 GFLOP/s and the backward's at
// H=256-512 from 103-111 to 112-119 (sliced at 16 KiB -> unsliced, C++ loop,
// 1 thread, 2026-11-25); not yet measured on a Zen 3.
// Weight gradients at H = 256, 512, 1024 read grad_gates.t() through a
// packed copy (gemm_strided in cpu_recurrent_impl.h).
#define PIPELSTM_PACK_STRIDED_A 1
#include "cpu_recurrent_impl.h"
