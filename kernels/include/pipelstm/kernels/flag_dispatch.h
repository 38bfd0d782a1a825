// Runtime flags to template flags: with_flags(f, b0, b1, ...) calls
// f(std::bool_constant<b0>{}, std::bool_constant<b1>{}, ...), one
// instantiation per combination, so the loop f picks has no branches on them.
//
// Everything is forced inline (f's body as well: write it
// `[&](auto... flags) PIPELSTM_FLAGS_INLINE { ... }`), so that a CPU entry
// point compiled for several instruction sets (cpu_clones.h) keeps the loop
// in its own instruction set: GCC does not inline a plain function into a
// function built for another architecture.
#pragma once

#include <type_traits>

#if defined(__GNUC__) && !defined(__CUDACC__)
#define PIPELSTM_FLAGS_INLINE __attribute__((always_inline))
#else
#define PIPELSTM_FLAGS_INLINE
#endif

namespace pipelstm {
namespace kernels {

template <class F>
PIPELSTM_FLAGS_INLINE inline decltype(auto) with_flags(F&& f) {
  return f();
}

template <class F, class... Flags>
PIPELSTM_FLAGS_INLINE inline decltype(auto) with_flags(F&& f, bool first, Flags... rest) {
  if (first) {
    return with_flags([&](auto... flags) PIPELSTM_FLAGS_INLINE { return f(std::true_type{}, flags...); },
                      rest...);
  }
  return with_flags([&](auto... flags) PIPELSTM_FLAGS_INLINE { return f(std::false_type{}, flags...); },
                    rest...);
}

}  // namespace kernels
}  // namespace pipelstm
