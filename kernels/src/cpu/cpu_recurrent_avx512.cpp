// The fused CPU step kernels built for avx512 (flags in CMakeLists.txt).
#define PIPELSTM_ISA avx512
#define PIPELSTM_VEC 16
// Six rows per tile: 24 accumulators, 4 weight vectors and a broadcast in
// the 32 zmm registers (five and seven rows measured: docs/design/cpu.md,
// "Measurements behind the constants").
#define PIPELSTM_MR 6
// Panel slices of depth 128 (32 KiB: a slice stays in a 48 KiB L1d) and
// chunks of 42 rows (seven six-row tiles), docs/design/cpu.md, "Blocking".
#define PIPELSTM_KC_BYTES (32 * 1024)
#define PIPELSTM_RC_ROWS 42
// Panels of up to 1 MiB (the Zen 5's L2 per core) are not sliced: a panel
// that stays in L2 is read faster whole than in slices.
#define PIPELSTM_UNSLICED_BYTES (1024 * 1024)
#include "cpu_recurrent_impl.h"
