// The fused CPU step kernels built for generic (flags in CMakeLists.txt).
#define PIPELSTM_ISA generic
#define PIPELSTM_VEC 4
#define PIPELSTM_MR 2
#include "cpu_recurrent_impl.h"
