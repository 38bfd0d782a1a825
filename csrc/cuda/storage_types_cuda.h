// The kernel library's element type for ATen's (Storage<T>::type) and the
// pointer casts between them: c10::Half and c10::BFloat16 hold the same 16
// bits as __half and __nv_bfloat16; float and double are themselves.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace pipelstm {
namespace cuda {

template <typename T> struct Storage { using type = T; };
template <> struct Storage<c10::Half> { using type = __half; };
template <> struct Storage<c10::BFloat16> { using type = __nv_bfloat16; };

template <typename S, typename T>
S* as(T* p) {
  static_assert(sizeof(S) == sizeof(T) && alignof(S) == alignof(T));
  return reinterpret_cast<S*>(p);
}
template <typename S, typename T>
const S* as(const T* p) {
  static_assert(sizeof(S) == sizeof(T) && alignof(S) == alignof(T));
  return reinterpret_cast<const S*>(p);
}

}  // namespace cuda
}  // namespace pipelstm
