// Which CPU this is: its vendor, family and model from cpuid, and the
// microarchitecture class they name. The class, not the ISA alone, says
// how wide the vector datapath is: Zen 4 runs AVX-512 on 256-bit units,
// Zen 5 and Intel's AVX-512 parts on 512-bit ones.
#pragma once

#include <string>

namespace pipelstm {
namespace cpu {

struct CpuIdentity {
  std::string vendor;  // "AMD", "Intel" or cpuid's vendor string
  int family = 0;      // with the extended family added
  int model = 0;       // with the extended model added
  // zen, zen2, zen3, zen4, zen5, intel-avx512, intel-avx2, or other
  std::string microarchitecture;
  int vector_datapath_bits = 0;  // the FMA units' width: 128, 256 or 512
};

// Read once (cpuid does not change).
const CpuIdentity& cpu_identity();

}  // namespace cpu
}  // namespace pipelstm
