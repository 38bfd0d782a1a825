// The kernel library's element type for ATen's (Storage<T>::type) and the
// conversion of the kernels' argument structs between them: c10::Half and
// c10::BFloat16 hold the same 16 bits as __half and __nv_bfloat16; float and
// double are themselves.
#pragma once

#include <bit>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace pipelstm {
namespace cuda {

template <typename T> struct Storage { using type = T; };
template <> struct Storage<c10::Half> { using type = __half; };
template <> struct Storage<c10::BFloat16> { using type = __nv_bfloat16; };

// A kernel argument struct (kernels::PointwiseForwardArgs<T> and the like)
// in the kernel library's element type. Args<T> and Args<S> are one template
// over element types of one size and alignment, so their members lie alike
// and each carries over bit for bit: every pointer now points to S, every
// size and flag is unchanged.
template <template <typename> class Args, typename T, typename S = typename Storage<T>::type>
Args<S> in_storage(const Args<T>& a) {
  static_assert(sizeof(S) == sizeof(T) && alignof(S) == alignof(T));
  static_assert(sizeof(Args<S>) == sizeof(Args<T>) && alignof(Args<S>) == alignof(Args<T>));
  return std::bit_cast<Args<S>>(a);
}

}  // namespace cuda
}  // namespace pipelstm
