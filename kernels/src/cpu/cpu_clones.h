// PIPELSTM_CPU_CLONES: a float entry point compiled for several instruction
// sets at once (target_clones), the best one picked when the library loads,
// so the binary runs on any x86-64 and still uses AVX-512 where it exists.
#pragma once

#include <type_traits>
#include <utility>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PIPELSTM_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PIPELSTM_CPU_CLONES
#endif

// `template <typename T> void entry(const Args<T>& a, int64_t b0, int64_t b1)`:
// the rows [b0, b1) of a step kernel, `body<T>(a, b0, b1)`, float through
// clones of it (entry_f32), double as written; both instantiated. At the
// scope of entry's declaration.
#define PIPELSTM_CPU_ROWS_ENTRY(entry, Args, body)                                                \
  PIPELSTM_CPU_CLONES static void entry##_f32(const Args<float>& a, int64_t b0, int64_t b1) { \
    body<float>(a, b0, b1);                                                                    \
  }                                                                                            \
  template <typename T>                                                                        \
  void entry(const Args<T>& a, int64_t b0, int64_t b1) {                                       \
    float_through_clones<T>(entry##_f32, body<T>, a, b0, b1);                                  \
  }                                                                                            \
  template void entry<float>(const Args<float>&, int64_t, int64_t);                            \
  template void entry<double>(const Args<double>&, int64_t, int64_t);

namespace pipelstm {
namespace kernels {

// Calls `cloned`, a float entry point marked PIPELSTM_CPU_CLONES, where T is
// float, and `plain`, the same code as written, for any other T.
template <typename T, class Cloned, class Plain, class... Args>
inline void float_through_clones(Cloned cloned, Plain plain, Args&&... args) {
  if constexpr (std::is_same_v<T, float>) {
    cloned(std::forward<Args>(args)...);
  } else {
    plain(std::forward<Args>(args)...);
  }
}

}  // namespace kernels
}  // namespace pipelstm
