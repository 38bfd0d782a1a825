// The fused CPU step kernels built for avx2 (flags in CMakeLists.txt).
#define PIPELSTM_ISA avx2
#define PIPELSTM_VEC 8
#define PIPELSTM_MR 3
#include "cpu_recurrent_impl.h"
