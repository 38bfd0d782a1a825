// The fused CPU step kernels built for avx2 (flags in CMakeLists.txt).
#define PIPELSTM_ISA avx2
#define PIPELSTM_VEC 8
#define PIPELSTM_MR 3
// Panels of up to 256 KiB are not sliced (the default: half a Zen 3's L2,
// the smallest an AVX2 machine of today is likely to have).
// Weight gradients at H = 256, 512, 1024 read grad_gates.t() through a
// packed copy (gemm_strided in cpu_recurrent_impl.h).
#define PIPELSTM_PACK_STRIDED_A 1
#include "cpu_recurrent_impl.h"
