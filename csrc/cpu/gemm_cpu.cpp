#include "gemm_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "huge_pages.h"
#include "step_kernels.h"

namespace pipelstm {
namespace cpu {

namespace {

// Below this many rows packing b (one pass over it) costs more than the
// faster kernel saves: a single row is a matrix-vector product that reads b
// once (docs/cpu.md, "GEMM backend").
constexpr int64_t kMinOwnRows = 4;

// The largest block of a's rows that one pass over all panels reads.
constexpr int64_t kBlockBytes = int64_t{4} << 20;

// "own", "aten" or "auto" (checked).
std::string gemm_setting() { return settings::cpu_gemm(); }  // read per call: cheap beside a GEMM

// By the call's path (cpu_path.h), else by default: on AMD CPUs MKL runs
// its AVX2 code, below the kernels' avx512 and avx2 builds; on Intel CPUs
// MKL is at its best and keeps the GEMMs (docs/cpu.md, "GEMM backend").
bool use_own_gemm(int64_t rows) {
  const std::string v = gemm_setting();
  if (v != "auto") return v == "own";
  const CpuPath* path = scoped_path();
  return (path != nullptr ? path->own_gemm : own_gemm_by_default(default_kernels())) && rows >= kMinOwnRows;
}

// A step loop's products (pack_operand) under `auto`: the kernels' GEMM
// wherever they are a vector build, on Intel's CPUs too, as the fused
// loops' steps are: a small product every step pays a BLAS call's fixed cost
// each time, and its threads fork and join around it.
bool use_own_step_gemm(int64_t rows) {
  const std::string v = gemm_setting();
  if (v != "auto") return v == "own";
  return std::strcmp(step_kernels().isa, "generic") != 0 && rows >= kMinOwnRows;
}

bool cpu_float(const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; }

// A weight gradient (a transposed: grad_gates.t() @ x, 4H x TB @ TB x I)
// has few panels and a long depth. Split over the panels, every thread
// reads all of a, in place across rows kilobytes apart; split over the
// depth, each reads its half and the halves are summed after. That pays
// from a long depth on; shorter ones stay split over the panels
// (docs/cpu.md, "GEMM backend").
constexpr int64_t kMinSplitDepth = 4096;

// PIPELSTM_SPLIT_DEPTH=0: never; =1: every product with a transposed a on
// several threads (for measuring and tests); unset: as above.
bool split_depth(bool transposed, int64_t K, int64_t threads) {
  if (threads < 2 || !transposed) return false;
  const std::optional<bool> forced = settings::split_depth();  // read per call: cheap beside a GEMM
  if (forced.has_value()) return *forced;
  return K >= kMinSplitDepth && std::strcmp(step_kernels().isa, "avx512") == 0;
}

// out (+)= a @ b as `threads` products over slices of the depth, the first
// into out, the others into buffers then added to out.
void depth_split_mm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                        bool accumulate, int64_t threads) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  const at::Tensor partial = empty_huge({threads - 1, M, N}, out.options());
  const CpuPath* path = scoped_path();
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    const PathScope scope(path);  // the call's path on this thread too
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t k0 = K * t / threads, k1 = K * (t + 1) / threads;
      const at::Tensor a_part = a.narrow(1, k0, k1 - k0), b_part = b.narrow(0, k0, k1 - k0);
      // In a parallel region: this product runs on this thread alone.
      layer_mm_out(t == 0 ? out : partial[t - 1], a_part, b_part, t == 0 && accumulate);
    }
  });
  for (int64_t t = 0; t < threads - 1; ++t) const_cast<at::Tensor&>(out).add_(partial[t]);
}

}  // namespace

const char* gemm_backend() {
  const std::string v = gemm_setting();
  if (v != "auto") return v == "own" ? "own" : "aten";
  // Before the first call, by the kernels it will choose, without choosing them.
  return own_gemm_by_default(kernels_for_cap(settings::cpu_isa())) ? "own" : "aten";
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  if (!cpu_float(x) || !cpu_float(w) || (bias.has_value() && !cpu_float(*bias))) {
    return at::linear(x, w, bias);
  }
  TORCH_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1), "pipelstm: linear: ",
              x.sizes(), " @ ", w.sizes(), ".t()");
  const at::Tensor x2 = x.reshape({-1, w.size(1)});
  // From the kept mappings (huge_pages.h): a decoder's logits are tens of MiB
  // per item, and glibc maps such a buffer afresh (faulting every page) each time.
  at::Tensor out = empty_huge({x2.size(0), w.size(0)}, x.options());
  if (bias.has_value()) out.copy_(bias->expand_as(out));  // then accumulated into
  layer_mm_out(out, x2, w.t(), /*accumulate=*/bias.has_value());
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  return out.view(sizes);
}

namespace {

// b [K, N] as the kernels' panels: from its transpose's rows when b is a
// transposed row-major matrix (a weight's .t()), else from its own rows.
at::Tensor pack_panels(const at::Tensor& b) {
  const auto& Kr = step_kernels();
  const int64_t K = b.size(0), N = b.size(1);
  if (b.stride(0) == 1 && b.stride(1) == K) {
    const float* w = b.const_data_ptr<float>();
    return packed_panels(Kr.plain_panels(N), K, b, [&](float* o, int64_t pb, int64_t pe) {
      Kr.pack_rows(w, N, K, o, pb, pe);
    });
  }
  const at::Tensor dense = b.is_contiguous() ? b : b.contiguous();
  const float* w = dense.const_data_ptr<float>();
  return packed_panels(Kr.plain_panels(N), K, b, [&](float* o, int64_t pb, int64_t pe) {
    Kr.pack_cols(w, K, N, o, pb, pe);
  });
}

// out (+)= a @ b on b's panels: a's rows at rows + r * lda, element kk of a
// row at kk * step (a transposed a read in place: lda 1, step its row stride).
void gemm_packed(const at::Tensor& out, const at::Tensor& rows, int64_t lda, int64_t step,
                 bool transposed, const at::Tensor& packed, bool accumulate, int64_t threads);

}  // namespace

void layer_mm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                  bool accumulate) {
  TORCH_CHECK(out.dim() == 2 && a.dim() == 2 && b.dim() == 2 && a.size(0) == out.size(0) &&
                  b.size(1) == out.size(1) && a.size(1) == b.size(0),
              "pipelstm: layer_mm_out: shapes ", out.sizes(), " = ", a.sizes(), " @ ", b.sizes());
  const bool own = cpu_float(out) && cpu_float(a) && cpu_float(b) && out.stride(1) == 1 &&
                   use_own_gemm(a.size(0));
  if (!own) {
    if (accumulate) {
      const_cast<at::Tensor&>(out).addmm_(a, b);
    } else {
      at::mm_out(const_cast<at::Tensor&>(out), a, b);
    }
    return;
  }
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum (a batch of no sequences): nothing to pack
    if (!accumulate) const_cast<at::Tensor&>(out).zero_();
    return;
  }
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  const bool transposed = a.stride(1) != 1 && a.stride(0) == 1;
  if (split_depth(transposed, K, threads)) {
    depth_split_mm_out(out, a, b, accumulate, threads);
    return;
  }
  // a's rows are read in place with unit stride or, for a transposed view
  // (a weight gradient's grad_gates.t()), with its row stride: ATen's copy of
  // such a view is a large part of a small layer's backward. Any other
  // layout is copied.
  const at::Tensor rows = a.stride(1) == 1 || transposed ? a : a.contiguous();
  const int64_t lda = transposed ? 1 : rows.stride(0), step = transposed ? rows.stride(1) : 1;
  gemm_packed(out, rows, lda, step, transposed, pack_panels(b), accumulate, threads);
}

namespace {

void gemm_packed(const at::Tensor& out, const at::Tensor& rows, int64_t lda, int64_t step,
                 bool transposed, const at::Tensor& packed, bool accumulate, int64_t threads) {
  const auto& Kr = step_kernels();
  const int64_t M = out.size(0), N = out.size(1), K = rows.size(1);
  kernels::cpu::Gemm m;
  m.rows = M;
  m.n = N;
  m.k = K;
  m.a = {nullptr, rows.const_data_ptr<float>(), 0, lda, step};
  m.w = packed.const_data_ptr<float>();
  float* o = const_cast<at::Tensor&>(out).data_ptr<float>();
  if (accumulate) {
    m.add = o;  // each element read, then written, by the same thread
    m.ld_add = out.stride(0);
  }
  m.out = o;
  m.ldo = out.stride(0);
  // Row blocks of at most kBlockBytes of a, each run over all panels: the
  // kernel streams a's rows once per panel, and a block stays in L3 between
  // panels where the whole of a (e.g. a gradient of 2048 x 4096 floats)
  // would come from memory each time.
  const int64_t block = std::max<int64_t>(1, kBlockBytes / std::max<int64_t>(1, K * 4));
  const int64_t panels = Kr.plain_panels(N);
  const float* a0 = rows.const_data_ptr<float>();
  // Rows [r0, r1) over panels [pb, pe), a's rows from `rows_of_a` (in
  // place unless given).
  auto run = [&](int64_t r0, int64_t r1, int64_t pb, int64_t pe, const float* rows_of_a = nullptr) {
    kernels::cpu::Gemm part = m;
    part.rows = r1 - r0;
    part.a.rest = a0 + r0 * lda;
    if (rows_of_a != nullptr) part.a = {nullptr, rows_of_a, 0, K, 1};
    part.out = o + r0 * m.ldo;
    if (accumulate) part.add = o + r0 * m.ld_add;
    Kr.gemm(part, pb, pe);
  };
  // Fewer panels than threads (a weight gradient of a small layer: 64
  // columns are one panel on AVX-512): the threads split the rows instead.
  if (panels < threads && M >= 2 * threads) {
    at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t r_begin = M * t / threads, r_end = M * (t + 1) / threads;
        for (int64_t r0 = r_begin; r0 < r_end; r0 += block) {
          run(r0, std::min(r_end, r0 + block), 0, panels);
        }
      }
    });
    return;
  }
  // A transposed a whose row stride is a page or more (grad_gates.t() at
  // H >= 256) read in place takes each tile's MR floats per step from a
  // line of another page, with no hardware prefetch across pages: each row
  // block is first made dense (Kr.transpose, V x V blocks in registers) and
  // then run like a plain a. Below a page (H = 64, 128) that copy costs more
  // than it saves. The avx2 build has no Kr.transpose: there the kernel
  // packs such slices itself (gemm_strided).
  const bool make_dense =
      transposed && Kr.transpose != nullptr && step * static_cast<int64_t>(sizeof(float)) >= 4096;
  at::Tensor dense = make_dense ? empty_huge({std::min(M, block), K}, rows.options()) : at::Tensor();
  float* d = make_dense ? dense.data_ptr<float>() : nullptr;
  for (int64_t r0 = 0; r0 < M; r0 += block) {
    const int64_t r1 = std::min(M, r0 + block);
    if (make_dense) {
      const int64_t V = Kr.vec;
      at::parallel_for(0, (r1 - r0 + V - 1) / V, 1, [&](int64_t b0, int64_t b1) {
        const int64_t i0 = b0 * V, i1 = std::min(r1 - r0, b1 * V);
        Kr.transpose(a0 + r0 + i0, step, i1 - i0, K, d + i0 * K, K);
      });
    }
    at::parallel_for(0, panels, 1, [&](int64_t pb, int64_t pe) { run(r0, r1, pb, pe, d); });
  }
}

}  // namespace

PackedOperand pack_operand(const at::Tensor& b, int64_t rows) {
  PackedOperand p{b, at::Tensor()};
  if (cpu_float(b) && b.size(0) > 0 && b.size(1) > 0 && use_own_step_gemm(rows)) p.panels = pack_panels(b);
  return p;
}

void packed_mm_out(const at::Tensor& out, const at::Tensor& a, const PackedOperand& b,
                   bool accumulate) {
  if (!b.panels.defined() || !cpu_float(out) || !cpu_float(a) || out.stride(1) != 1 ||
      a.size(0) == 0 || !use_own_step_gemm(a.size(0))) {
    return layer_mm_out(out, a, b.b, accumulate);
  }
  TORCH_CHECK(out.dim() == 2 && a.dim() == 2 && a.size(0) == out.size(0) &&
                  b.b.size(1) == out.size(1) && a.size(1) == b.b.size(0),
              "pipelstm: packed_mm_out: shapes ", out.sizes(), " = ", a.sizes(), " @ ", b.b.sizes());
  const at::Tensor rows = a.stride(1) == 1 ? a : a.contiguous();
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  gemm_packed(out, rows, rows.stride(0), 1, /*transposed=*/false, b.panels, accumulate, threads);
}

}  // namespace cpu
}  // namespace pipelstm
