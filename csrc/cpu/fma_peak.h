// The FMA peak of the cores the fused CPU kernels run on, for benchmarks:
// the kernels' register-only FMA loop (kernels/cpu_recurrent.h, fma_loop)
// in the build that PIPELSTM_CPU_ISA picks, on one or more threads at once.
#pragma once

#include <cstdint>

namespace pipelstm {
namespace cpu {

// The FLOP of one thread's fma_loop of `iterations`.
double fma_loop_flop(int64_t iterations);

// Wall seconds for `threads` threads, released together once all are
// started, to run fma_loop(iterations) each.
double fma_loop_seconds(int threads, int64_t iterations);

// fma_loop's result on the calling thread (tests: the loop runs the FMAs it counts).
float fma_loop_sum(int64_t iterations, float a, float b);

}  // namespace cpu
}  // namespace pipelstm
