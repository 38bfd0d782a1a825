// The fused CPU step kernels built for avx512 (flags in CMakeLists.txt).
#define PIPELSTM_ISA avx512
#define PIPELSTM_VEC 16
#define PIPELSTM_MR 5
#include "cpu_recurrent_impl.h"
