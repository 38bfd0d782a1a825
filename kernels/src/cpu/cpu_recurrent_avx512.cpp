// The fused CPU step kernels built for avx512 (flags in CMakeLists.txt).
#define PIPELSTM_ISA avx512
#define PIPELSTM_VEC 16
// Six rows per tile: 24 accumulators, 4 weight vectors and a broadcast in
// the 32 zmm registers. Against five rows on a 2-core Zen 5 (the step
// kernels in a C++ loop, medians of 5 alternated runs, 2026-11-25): the
// forward loop 1.00-1.05x as fast (H = 64..512), the backward loop 1.02-
// 1.08x, the GEMMs within 2 %; seven rows (28 accumulators) were slower
// (5-15 %). The whole layer, 1 thread, before/after: forward 1.00-1.03x,
// fwd+bwd 1.00-1.02x.
#define PIPELSTM_MR 6
// Panel slices of depth 128 (32 KiB) and chunks of 42 rows (docs/cpu.md,
// "Blocking"). On a 2-core AMD Zen 5 (48 KiB L1d), `PIPELSTM_CPU_GEMM=own
// python -m pipelstm.bench grid --H 512 1024 --B 32 64 --T 32 --layers 1
// --variants dense --threads 1 --modes fwdbwd` gave 0.56-0.68x nn.LSTM with
// 16 KiB and 96 rows (the AVX2 build's), 0.80-0.91x with 32 KiB and 40 rows
// (2026-11-24; with six-row tiles, 42 rows keep seven tiles a chunk);
// 64 KiB slices or 20-row chunks changed nothing beyond noise in a quicker
// interleaved check.
#define PIPELSTM_KC_BYTES (32 * 1024)
#define PIPELSTM_RC_ROWS 42
// Panels of up to 1 MiB (the Zen 5's L2 per core) are not sliced. The step
// kernels alone (a C++ loop over T steps, 1 thread, medians of 5 alternated
// runs, 2026-11-25), sliced at 32 KiB -> unsliced, GFLOP/s: forward H=256
// B=32 193 -> 199, H=512 B=8 198 -> 218, H=1024 B=32 198 -> 217; backward
// (depth 4H) H=256 B=32 186 -> 207, H=512 B=32 206 -> 230, H=1024 190 ->
// 190; the input projection's GEMM 4096x256 @ 256x1024 173 -> 184.
#define PIPELSTM_UNSLICED_BYTES (1024 * 1024)
#include "cpu_recurrent_impl.h"
