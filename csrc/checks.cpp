#include "checks.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace pipelstm {
namespace {

std::string format_sizes(std::initializer_list<int64_t> sizes) {
  std::ostringstream s;
  s << "[";
  bool first = true;
  for (int64_t v : sizes) {
    s << (first ? "" : ", ") << v;
    first = false;
  }
  s << "]";
  return s.str();
}

}  // namespace

void check_shape(const char* op, const char* name, const at::Tensor& t,
                 std::initializer_list<int64_t> sizes) {
  TORCH_CHECK(t.defined(), "pipelstm::", op, ": `", name, "` must be a tensor, got None");
  TORCH_CHECK(t.sizes().equals(at::IntArrayRef(sizes.begin(), sizes.size())), "pipelstm::", op,
              ": expected `", name, "` of shape ", format_sizes(sizes), ", got ", t.sizes());
}

void check_dim(const char* op, const char* name, const at::Tensor& t, int64_t dim,
               const char* layout) {
  TORCH_CHECK(t.defined(), "pipelstm::", op, ": `", name, "` must be a tensor, got None");
  TORCH_CHECK(t.dim() == dim, "pipelstm::", op, ": expected `", name, "` to be ", dim,
              "-D ", layout, ", got a ", t.dim(), "-D tensor of shape ", t.sizes());
}

void check_same_kind(const char* op, const char* name, const at::Tensor& t,
                     const char* ref_name, const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "pipelstm::", op, ": expected `", name,
              "` to have the dtype of `", ref_name, "` (", ref.scalar_type(), "), got ",
              t.scalar_type());
  TORCH_CHECK(t.device() == ref.device(), "pipelstm::", op, ": expected `", name,
              "` on the device of `", ref_name, "` (", ref.device(), "), got ", t.device());
}

int64_t checked_product(const char* op, const char* what, std::initializer_list<int64_t> factors) {
  int64_t product = 1;
  for (int64_t f : factors) {
    TORCH_CHECK(!__builtin_mul_overflow(product, f, &product), "pipelstm::", op, ": ", what, " ",
                format_sizes(factors), " overflows int64");
  }
  return product;
}

int64_t checked_sum(const char* op, const char* what, int64_t a, int64_t b) {
  int64_t sum = 0;
  TORCH_CHECK(!__builtin_add_overflow(a, b, &sum), "pipelstm::", op, ": ", what, " overflows int64");
  return sum;
}

void check_supported_dtype(const char* op, const char* name, const at::Tensor& t) {
  // The CPU computes bfloat16 and float16 in float32 (float32_upcast.h).
  const auto dtype = t.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 ||
                  dtype == at::kDouble,
              "pipelstm::", op, ": `", name, "` must be float32, float16, bfloat16 or float64, got ",
              dtype);
}

}  // namespace pipelstm
