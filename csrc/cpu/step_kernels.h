// The fused CPU kernels of this CPU's ISA (kernels/.../cpu_recurrent.h),
// and their weight packing, shared by the time loops (fused_loops_cpu.cpp)
// and the whole-batch GEMMs (gemm_cpu.cpp).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>

#include "../settings.h"
#include "cpu_path.h"
#include "huge_pages.h"
#include "pipelstm/kernels/cpu_recurrent.h"

namespace pipelstm {
namespace cpu {

// The kernels in use: those of the call's path on this thread
// (cpu_path.h), else the default ones, chosen at the first call under the
// ISA cap, which is then kept for the process (settings.h). Raises if
// PIPELSTM_CPU_ISA names no known ISA.
inline const kernels::cpu::RecurrentKernels& step_kernels() {
  const CpuPath* path = scoped_path();
  return path != nullptr ? *path->kernels : default_kernels();
}

// A fresh buffer of `panels` panels of depth k, filled by one of the
// kernels' packers, pack(out, panel_begin, panel_end), on the intra-op
// threads: packing is a copy bound by memory, and at small T x B one
// thread packing w_hh took a fifth of a forward at 2 threads (H=512 B=1
// T=32 on a 2-core AVX2 EPYC).
template <typename Pack>
at::Tensor packed_panels(int64_t panels, int64_t k, const at::Tensor& like, Pack&& pack) {
  const auto& K = step_kernels();
  at::Tensor out = empty_huge({K.packed_size(panels, k)}, like.options());
  float* o = out.data_ptr<float>();
  // About 64 KiB of panels per task: enough to be worth a thread.
  const int64_t panel_floats = std::max<int64_t>(1, K.packed_size(1, k));  // k may be 0
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / panel_floats);
  at::parallel_for(0, panels, grain, [&](int64_t b, int64_t e) { pack(o, b, e); });
  return out;
}

}  // namespace cpu
}  // namespace pipelstm
