// Argument checks shared by every op: each raises before any work is done,
// naming the op, the argument and what was expected.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <initializer_list>

namespace pipelstm {

// `name` must be a defined tensor with exactly these sizes.
void check_shape(const char* op, const char* name, const at::Tensor& t,
                 std::initializer_list<int64_t> sizes);

// `name` must have `dim` dimensions; `layout` names them for the message,
// for example "[T, B, I]".
void check_dim(const char* op, const char* name, const at::Tensor& t, int64_t dim,
               const char* layout);

// `name` must have the dtype and device of `ref` (called `ref_name`).
void check_same_kind(const char* op, const char* name, const at::Tensor& t,
                     const char* ref_name, const at::Tensor& ref);

// The product of `factors`, or a clear error where it overflows int64: the
// sizes of expanded or meta tensors can be that large. `what` names the
// product for the message, for example "T x B".
int64_t checked_product(const char* op, const char* what, std::initializer_list<int64_t> factors);

// a + b, or a clear error where it overflows int64.
int64_t checked_sum(const char* op, const char* what, int64_t a, int64_t b);

// The dtype must be float32, float16, bfloat16 or float64: every backend takes all four.
void check_supported_dtype(const char* op, const char* name, const at::Tensor& t);

}  // namespace pipelstm
