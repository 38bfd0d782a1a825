// Which CPU this is: its vendor, family and model from cpuid, the
// microarchitecture class they (and its features) name, and its L2 size.
// The class, not the ISA alone, says how wide the vector datapath is: Zen 4
// runs AVX-512 on 256-bit units, Zen 5 and Intel's AVX-512 parts on 512-bit
// ones.
#pragma once

#include <cstdint>
#include <string>

namespace pipelstm {
namespace cpu {

struct CpuIdentity {
  std::string vendor;  // "AMD", "Intel" or cpuid's vendor string
  int family = 0;      // with the extended family added
  int model = 0;       // with the extended model added
  // zen, zen2, zen3, zen4, zen5, intel-amx (AMX tiles: Sapphire Rapids and
  // later Xeons), intel-avx512 (earlier AVX-512 parts: Skylake-SP to Ice
  // Lake), intel-avx2, or other
  std::string microarchitecture;
  int vector_datapath_bits = 0;  // the FMA units' width: 128, 256 or 512
  int64_t l2_bytes = 0;          // one core's L2 (0 where the OS does not say)
};

// Read once (cpuid does not change).
const CpuIdentity& cpu_identity();

}  // namespace cpu
}  // namespace pipelstm
