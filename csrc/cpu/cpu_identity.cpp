#include "cpu_identity.h"

#include <cstring>

#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace pipelstm {
namespace cpu {
namespace {

#if defined(__x86_64__) && defined(__GNUC__)
// AMX tiles (cpuid leaf 7, EDX bit 24): the class of Sapphire Rapids and
// the Xeons after it, read by feature because a hypervisor may report
// another model number.
bool amx_tiles() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (d >> 24 & 1) != 0;
}

CpuIdentity read_identity() {
  CpuIdentity id;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return {"unknown", 0, 0, "other", 128, 0};
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  const bool amd = std::strcmp(vendor, "AuthenticAMD") == 0;
  const bool intel = std::strcmp(vendor, "GenuineIntel") == 0;
  id.vendor = amd ? "AMD" : intel ? "Intel" : vendor;
  __get_cpuid(1, &a, &b, &c, &d);
  const int base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  id.family = base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family;
  id.model = base_family == 0xf || base_family == 0x6 ? base_model + (((a >> 16) & 0xf) << 4) : base_model;
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2");
  id.vector_datapath_bits = avx512 ? 512 : avx2 ? 256 : 128;
  if (amd) {
    if (id.family == 0x17) {
      // Zen and Zen+ split a 256-bit operation over two 128-bit halves.
      id.microarchitecture = id.model >= 0x30 ? "zen2" : "zen";
      if (id.model < 0x30) id.vector_datapath_bits = 128;
    } else if (id.family == 0x19) {
      id.microarchitecture = avx512 ? "zen4" : "zen3";
      id.vector_datapath_bits = 256;  // Zen 4 runs AVX-512 as two halves
    } else if (id.family == 0x1a) {
      id.microarchitecture = "zen5";
    } else {
      id.microarchitecture = "other";
    }
  } else if (intel) {
    id.microarchitecture = avx512 && amx_tiles() ? "intel-amx"
                           : avx512          ? "intel-avx512"
                           : avx2            ? "intel-avx2"
                                             : "other";
  } else {
    id.microarchitecture = "other";
  }
  return id;
}
#else
CpuIdentity read_identity() { return {"unknown", 0, 0, "other", 128, 0}; }
#endif

int64_t l2_bytes() {
#ifdef _SC_LEVEL2_CACHE_SIZE
  const long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return bytes > 0 ? bytes : 0;
#else
  return 0;
#endif
}

}  // namespace

const CpuIdentity& cpu_identity() {
  static const CpuIdentity id = [] {
    CpuIdentity read = read_identity();
    read.l2_bytes = l2_bytes();
    return read;
  }();
  return id;
}

}  // namespace cpu
}  // namespace pipelstm
