// Picks the build of the fused CPU step kernels for this CPU: the widest ISA
// it runs, no wider than a cap (PIPELSTM_CPU_ISA, as ONEDNN_MAX_CPU_ISA caps
// oneDNN), so an AVX-512 machine can measure the AVX2 path.
#include <cctype>
#include <string>

#include "pipelstm/kernels/cpu_recurrent.h"

namespace pipelstm {
namespace kernels {
namespace cpu {

#if defined(PIPELSTM_HAVE_AVX512)
namespace avx512 { const RecurrentKernels& kernels(); }
#endif
#if defined(PIPELSTM_HAVE_AVX2)
namespace avx2 { const RecurrentKernels& kernels(); }
#endif
namespace generic { const RecurrentKernels& kernels(); }

namespace {

// Widest first.
constexpr const char* kIsas[] = {"avx512", "avx2", "generic"};

bool cpu_runs(const std::string& isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (isa == "avx512") {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  }
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return isa == "generic";
}

const RecurrentKernels* built(const std::string& isa) {
#if defined(PIPELSTM_HAVE_AVX512)
  if (isa == "avx512") return &avx512::kernels();
#endif
#if defined(PIPELSTM_HAVE_AVX2)
  if (isa == "avx2") return &avx2::kernels();
#endif
  if (isa == "generic") return &generic::kernels();
  return nullptr;
}

}  // namespace

const RecurrentKernels* widest_kernels(const std::string& cap, std::string* error) {
  std::string c = cap;
  for (auto& ch : c) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  bool allowed = c.empty() || c == "native";
  for (const char* isa : kIsas) {
    allowed = allowed || c == isa;
    if (allowed && cpu_runs(isa) && built(isa) != nullptr) return built(isa);
  }
  if (error != nullptr) {
    *error = "the ISA cap '" + cap +
             "' is not one of avx512, avx2, generic (or native: the widest this CPU runs)";
  }
  return nullptr;
}

const RecurrentKernels* recurrent_kernels_for(const std::string& isa) {
  return cpu_runs(isa) ? built(isa) : nullptr;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace pipelstm
