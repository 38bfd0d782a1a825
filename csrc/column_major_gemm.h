// How a row-major GEMM out = a @ b (out [M, N], a [M, K], b [K, N], any
// strides) is handed to a column-major BLAS (cuBLAS): out read column-major
// is out^T = b^T a^T, so the BLAS's first operand is b and its second a,
// each transposed or not by how its elements lie. Plain arithmetic, no
// device: tested on the host (tests/test_layer_gemm.py).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

namespace pipelstm {

// An [r, c] matrix with strides (s0, s1) that a BLAS reads in place: unit
// stride along its rows (row-major, `ld` = s0) or along its columns
// (column-major, `ld` = s1). A dimension of size 1 takes any stride.
struct MatrixLayout {
  bool row_major;
  int64_t ld;
};

inline std::optional<MatrixLayout> blas_layout(int64_t r, int64_t c, int64_t s0, int64_t s1) {
  const int64_t unit0 = r <= 1 ? 1 : s0, unit1 = c <= 1 ? 1 : s1;
  if (unit1 == 1 && (r <= 1 || s0 >= std::max<int64_t>(1, c))) {
    return MatrixLayout{true, r <= 1 ? std::max<int64_t>(1, c) : s0};
  }
  if (unit0 == 1 && (c <= 1 || s1 >= std::max<int64_t>(1, r))) {
    return MatrixLayout{false, c <= 1 ? std::max<int64_t>(1, r) : s1};
  }
  return std::nullopt;
}

// The column-major call C = op(A) op(B), C [m, n] with leading dimension
// ldc, for out = a @ b: A is b, B is a.
struct ColumnMajorGemm {
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
};

// a and b must have a blas_layout and out a row-major one (else copy them).
inline ColumnMajorGemm column_major_gemm(int64_t M, int64_t N, int64_t K, MatrixLayout out,
                                         MatrixLayout a, MatrixLayout b) {
  // b row-major [K, N] is column-major b^T [N, K]: no transpose; b
  // column-major is b [K, N] itself: transposed. Likewise a.
  return ColumnMajorGemm{!b.row_major, !a.row_major, N, M, K, b.ld, a.ld, out.ld};
}

}  // namespace pipelstm
