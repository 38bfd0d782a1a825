#include "fused_loops_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gemm_cpu.h"
#include "huge_pages.h"
#include "phase_team.h"
#include "row_split.h"
#include "step_kernels.h"

namespace pipelstm {
namespace cpu {

namespace k = pipelstm::kernels::cpu;

namespace {

const k::RecurrentKernels& kernels() { return step_kernels(); }

// Below this many multiply-adds per thread and step a step runs on one
// thread: a chosen bound (a few microseconds of work against a barrier of
// well under one), not a tuned one.
constexpr int64_t kMinMacsPerThread = int64_t{1} << 16;

// The input projection inside the steps (input_projection_in_steps): a
// step runs its tiles over I + P rows of depth, starting from the bias, and
// its cells read no pre-activations from memory. A separate GEMM over all
// steps stores them first (its short-depth tiles ran at about 90 % of the
// recurrent tiles' rate at H = 64) and each cell loads them back, but it
// reads w_ih once, where the steps read it at every step, and its tiles are
// full where a step has fewer rows than a tile. So: at least
// kMinInStepRows rows a step, and w_ih and w_hh of at most
// kMaxInStepWeightsL2 floats together (4H x (I + P), 1 MiB: a core's L2 on
// a Zen 5), or of at most kMaxInStepWeights (8 MiB, H = I = P = 512) from
// kMinInStepRowsBeyondL2 rows, where a step does enough arithmetic per
// weight to read them from L3. The avx2 build keeps the GEMM: its tiles
// have 3 rows, not 6. The timings behind the bounds: docs/design/cpu.md,
// "The constants of the blocking".
constexpr int64_t kMinInStepRows = 4;
constexpr int64_t kMinInStepRowsBeyondL2 = 32;
constexpr int64_t kMaxInStepWeightsL2 = int64_t{1} << 18;
constexpr int64_t kMaxInStepWeights = int64_t{1} << 21;
// Beside MKL's GEMM (an Intel CPU's default) the steps paid only with small
// weights and at least 16 rows a step (docs/design/cpu.md).
constexpr int64_t kMinInStepRowsBesideMkl = 16;
constexpr int64_t kMaxInStepWeightsBesideMkl = int64_t{3} << 15;

// Rows per step, on average (packed input), and the weights w_ih and w_hh.
int64_t rows_per_step(const LayerSteps& steps) { return steps.steps() == 0 ? 0 : steps.rows / steps.steps(); }
int64_t in_step_weights(const LayerGeometry& g) { return 4 * g.hidden * (g.input + g.out); }

int team_size(int64_t macs_per_step, int64_t panels) {
  if (at::in_parallel_region()) return 1;
  const int64_t by_work = std::max<int64_t>(1, macs_per_step / kMinMacsPerThread);
  return static_cast<int>(std::min({static_cast<int64_t>(at::get_num_threads()), by_work, panels}));
}

float* ptr(const Tensor& t) { return t.data_ptr<float>(); }
const float* cptr(const Tensor& t) { return t.const_data_ptr<float>(); }

// Where step t's rows start in a [N, width] buffer (or null before the first step).
const float* step_rows(const float* base, const LayerSteps& steps, int64_t t, int64_t width) {
  return t < 0 ? nullptr : base + steps.offset[t] * width;
}

// Rows [r0, ...) of a step's rows.
k::RowSource rows_from(const k::RowSource& s, int64_t r0) {
  return {s.first != nullptr ? s.first + r0 * s.ld : nullptr, s.rest + r0 * s.ld,
          std::max<int64_t>(0, s.split - r0), s.ld};
}

// Rows from r0 of a row-major buffer with leading dimension ld (none stays none).
const float* rows_at(const float* base, int64_t r0, int64_t ld) {
  return base != nullptr ? base + r0 * ld : nullptr;
}

// How a weight [rows, cols] is packed for the kernels: as gate panels
// (four gate rows interleaved, depth cols), plain panels of its rows (depth
// cols), or of its columns (the transposed product, depth rows).
enum class Packing { kGateRows, kRows, kCols };

Tensor packed(const Tensor& weight, Packing how) {
  const auto& K = kernels();
  const Tensor w = weight.contiguous();
  const int64_t rows = w.size(0), cols = w.size(1);
  const int64_t panels = how == Packing::kGateRows ? K.gate_panels(rows / 4)
                         : how == Packing::kRows  ? K.plain_panels(rows)
                                                  : K.plain_panels(cols);
  return packed_panels(panels, how == Packing::kCols ? rows : cols, w, [&](float* out, int64_t b, int64_t e) {
    switch (how) {
      case Packing::kGateRows: K.pack_gates(cptr(w), rows / 4, cols, out, b, e); break;
      case Packing::kRows: K.pack_rows(cptr(w), rows, cols, out, b, e); break;
      case Packing::kCols: K.pack_cols(cptr(w), rows, cols, out, b, e); break;
    }
  });
}

// The backward's results, allocated; grad_c0 holds grad_c_n (or zeros):
// the loop keeps each sequence's running gradient of c there.
FusedBackward new_backward_result(const LayerSteps& steps, const LayerGeometry& geometry,
                                  const FusedBackwardInputs& in) {
  const int64_t N = steps.rows, B = steps.max_batch, H = geometry.hidden, P = geometry.out;
  const auto opts = in.act.options();
  FusedBackward r;
  r.grad_gates = empty_huge({N, 4 * H}, opts);
  r.grad_h0 = at::empty({B, P}, opts);
  r.grad_c0 = in.grad_c_n.has_value() ? in.grad_c_n->contiguous().clone() : at::zeros({B, H}, opts);
  if (geometry.projected) r.grad_h = empty_huge({N, P}, opts);
  return r;
}

// A gradient read in place where its rows are dense (a slice, say), else
// made so; undefined where none was given.
Tensor dense_rows(const std::optional<Tensor>& t) {
  if (!t.has_value()) return Tensor();
  return t->stride(1) == 1 ? *t : t->contiguous();
}

// A loop's steps, each in phases (a cell, and with w_hr a projection):
// phase(q, p, r0, r1, pb, pe) runs phase q of the step at position p (in
// the forward recurrence) for rows [r0, r1) and panels [pb, pe) of the
// panels[q] it has. With `blocks` > 1 (dense input) each block of batch
// rows runs every step on a thread of its own; otherwise each phase's
// panels are split over a team of `threads`. The steps run from the first
// position, or from the last with `backward`.
template <class Phase>
void run_steps(const LayerSteps& steps, bool reverse, bool backward, const std::vector<int64_t>& panels,
               int64_t blocks, int threads, const Phase& phase) {
  const int64_t T = steps.steps(), phases = static_cast<int64_t>(panels.size());
  auto position = [&](int64_t i) { return backward ? T - 1 - i : i; };
  if (blocks > 1) {
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; ++blk) {
        const auto [r0, r1] = chunk_range(steps.max_batch, blocks, blk);
        for (int64_t i = 0; i < T; ++i) {
          for (int64_t q = 0; q < phases; ++q) phase(q, position(i), r0, r1, 0, panels[q]);
        }
      }
    });
    return;
  }
  auto chunks = [&](int64_t s) { return std::min<int64_t>(threads, panels[s % phases]); };
  run_phases(T * phases, threads, chunks, [&](int64_t s, int64_t chunk, int64_t n_chunks) {
    const int64_t p = position(s / phases), q = s % phases;
    const auto [pb, pe] = chunk_range(panels[q], n_chunks, chunk);
    phase(q, p, 0, steps.batch[LayerSteps::step_at(p, T, reverse)], pb, pe);
  });
}

// The final state of each sequence: h and c of the step it ends at.
void leave_final_states(const LayerSteps& steps, bool reverse, const float* out, const float* c,
                        int64_t P, int64_t H, float* hn, float* cn) {
  const int64_t T = steps.steps();
  for (int64_t p = 0; p < T; ++p) {
    const int64_t t = LayerSteps::step_at(p, T, reverse);
    const int64_t rows = steps.batch[t], on = steps.going_on(p, reverse);
    if (rows <= on) continue;
    const int64_t r0 = steps.offset[t] + on;
    std::memcpy(hn + on * P, out + r0 * P, sizeof(float) * (rows - on) * P);
    std::memcpy(cn + on * H, c + r0 * H, sizeof(float) * (rows - on) * H);
  }
}

// The rows that started from h0 at a step: grad_h0 = their grad_gates
// (dg [N, 4H]) @ w_hh (packed_hh, as the backward packs it).
void grad_h0_from_gates(const LayerSteps& steps, bool reverse, const float* dg, const float* packed_hh,
                        int64_t H, int64_t P, float* dh0) {
  const auto& K = kernels();
  const int64_t T = steps.steps(), panels = K.plain_panels(P);
  for (int64_t p = 0; p < T; ++p) {
    const int64_t t = LayerSteps::step_at(p, T, reverse);
    const int64_t rows = steps.batch[t], cont = steps.continuing(p, reverse);
    if (rows <= cont) continue;
    k::Gemm m;
    m.rows = rows - cont;
    m.n = P;
    m.k = 4 * H;
    m.a = {dg + (steps.offset[t] + cont) * 4 * H, nullptr, rows - cont, 4 * H};
    m.w = packed_hh;
    m.out = dh0 + cont * P;
    m.ldo = P;
    const int threads = team_size((rows - cont) * 4 * H * P, panels);
    run_phases(1, threads, [&](int64_t) { return std::min<int64_t>(threads, panels); },
               [&](int64_t, int64_t chunk, int64_t n_chunks) {
                 const auto [b, e] = chunk_range(panels, n_chunks, chunk);
                 K.gemm(m, b, e);
               });
  }
}

bool all_zero(const Tensor& t) {
  const float* p = cptr(t);
  for (int64_t i = 0, n = t.numel(); i < n; ++i) {
    if (p[i] != 0.0f) return false;
  }
  return true;
}

}  // namespace

void check_fused_loops_isa() { kernels(); }

const char* fused_loops_isa() { return kernels().isa; }

bool input_in_steps_fit(const LayerGeometry& geometry, const LayerSteps& steps) {
  const int64_t rows = rows_per_step(steps), weights = in_step_weights(geometry);
  // Work for two threads a step (team_size), as the GEMM would have. Not
  // the thread count itself: results stay bitwise the same on any number
  // of threads.
  return rows >= kMinInStepRows && rows * weights >= 2 * kMinMacsPerThread && weights <= kMaxInStepWeights;
}

bool input_projection_in_steps(const LayerGeometry& geometry, const LayerSteps& steps) {
  const std::optional<bool> forced = settings::input_in_steps();  // read per call: cheap beside a loop
  if (forced.has_value()) return *forced;
  if (const CpuPath* path = scoped_path()) return path->input_in_steps && input_in_steps_fit(geometry, steps);
  // Measured against the GEMM in the avx512 build only; beyond these bounds
  // timing (pipelstm.backends.cpu.benchmark) decides.
  if (std::strcmp(kernels().isa, "avx512") != 0 || !input_in_steps_fit(geometry, steps)) return false;
  const int64_t rows = rows_per_step(steps), weights = in_step_weights(geometry);
  if (std::strcmp(gemm_backend(), "own") != 0) {
    return rows >= kMinInStepRowsBesideMkl && weights <= kMaxInStepWeightsBesideMkl;
  }
  return weights <= (rows >= kMinInStepRowsBeyondL2 ? kMaxInStepWeights : kMaxInStepWeightsL2);
}

void fused_forward_loop(const LayerSteps& steps, const LayerGeometry& geometry, bool reverse,
                        const Tensor& x, const Tensor& w_ih, const Tensor& h0, const Tensor& c0,
                        const Tensor& w_hh, const std::optional<Tensor>& w_hr,
                        const Tensor& bias, Tensor& gates,
                        Tensor& cells, Tensor& raw_h, Tensor& output, Tensor& h_n, Tensor& c_n,
                        const Zoneout* zoneout) {
  const auto& K = kernels();
  const int64_t T = steps.steps(), H = geometry.hidden, P = geometry.out;
  const bool projected = geometry.projected;
  const Tensor w = w_hh.contiguous();
  const Tensor packed_hh = packed(w, Packing::kGateRows);
  const Tensor packed_hr = projected ? packed(*w_hr, Packing::kRows) : Tensor();
  // With the input projection in the steps, w_ih packed like w_hh.
  const bool in_step = x.defined();
  const int64_t I = geometry.input;
  const Tensor xs = in_step ? x.contiguous() : Tensor();
  const Tensor packed_ih = in_step ? packed(w_ih, Packing::kGateRows) : Tensor();
  float* g = ptr(gates);
  float* c = ptr(cells);
  float* out = ptr(output);
  float* raw = projected ? ptr(raw_h) : nullptr;
  const Tensor b = bias.defined() ? bias.contiguous() : Tensor();
  const float* h_init = cptr(h0);
  const float* c_init = cptr(c0);

  // A step that starts every row from a zero h0 (no hx given) has no
  // recurrent product to compute, unless w_hh holds an inf or a NaN: then
  // 0 * w is NaN, as in nn.LSTM and the float64 path (a sum that is not
  // finite says so in one vectorised pass; one that overflows only costs
  // the skip).
  const bool zero_h0 = all_zero(h0) && std::isfinite(w.sum().item<float>());
  const int64_t cell_panels = K.gate_panels(H), proj_panels = K.plain_panels(P);
  // Step p's cell (and with w_hr its projection) for rows [r0, r1) of its
  // batch and panels [pb, pe).
  auto cell = [&](int64_t p, int64_t r0, int64_t r1, int64_t pb, int64_t pe) {
    const int64_t t = LayerSteps::step_at(p, T, reverse);
    const int64_t prev = p > 0 ? LayerSteps::step_at(p - 1, T, reverse) : -1;
    const int64_t row0 = steps.offset[t] + r0, cont = steps.continuing(p, reverse);
    k::ForwardStep f;
    f.rows = r1 - r0;
    f.hidden = H;
    f.k = zero_h0 && cont == 0 ? 0 : P;
    f.h_prev = rows_from({step_rows(out, steps, prev, P), h_init, cont, P}, r0);
    f.w = cptr(packed_hh);
    if (in_step) {
      f.input_in_step = true;
      f.x = cptr(xs) + row0 * I;
      f.ldx = I;
      f.kx = I;
      f.w_x = cptr(packed_ih);
    }
    f.gates = g + row0 * 4 * H;
    f.bias = b.defined() ? cptr(b) : nullptr;
    f.c_prev = rows_from({step_rows(c, steps, prev, H), c_init, cont, H}, r0);
    f.c = c + row0 * H;
    f.h = projected ? raw + row0 * H : out + row0 * P;
    f.ldh = projected ? H : P;
    if (zoneout) {
      f.keep = zoneout->from_row<float>(row0);
    }
    K.forward_step(f, pb, pe);
  };
  auto projection = [&](int64_t p, int64_t r0, int64_t r1, int64_t pb, int64_t pe) {
    const int64_t row0 = steps.offset[LayerSteps::step_at(p, T, reverse)] + r0;
    k::Gemm m;
    m.rows = r1 - r0;
    m.n = P;
    m.k = H;
    m.a = {raw + row0 * H, nullptr, r1 - r0, H};
    m.w = cptr(packed_hr);
    m.out = out + row0 * P;
    m.ldo = P;
    K.gemm(m, pb, pe);
  };
  const int64_t blocks = loop_row_blocks(steps, geometry, /*backward=*/false);
  const int threads = team_size(steps.max_batch * 4 * H * (P + (in_step ? I : 0)), cell_panels);
  std::vector<int64_t> panels{cell_panels};
  if (projected) panels.push_back(proj_panels);
  run_steps(steps, reverse, /*backward=*/false, panels, blocks, threads,
            [&](int64_t q, int64_t p, int64_t r0, int64_t r1, int64_t pb, int64_t pe) {
              if (q == 0) {
                cell(p, r0, r1, pb, pe);
              } else {
                projection(p, r0, r1, pb, pe);
              }
            });
  leave_final_states(steps, reverse, out, c, P, H, ptr(h_n), ptr(c_n));
}

FusedBackward fused_backward_loop(const LayerSteps& steps, const LayerGeometry& geometry,
                                  bool reverse, const FusedBackwardInputs& in) {
  const auto& K = kernels();
  const int64_t T = steps.steps(), B = steps.max_batch, H = geometry.hidden, P = geometry.out;
  const bool projected = geometry.projected;
  FusedBackward r = new_backward_result(steps, geometry, in);
  const Tensor grad_out = dense_rows(in.grad_output);
  const Tensor grad_h_last = in.grad_h_n.has_value() ? in.grad_h_n->contiguous() : Tensor();
  const Tensor packed_hh = packed(in.w_hh, Packing::kCols);
  const Tensor packed_hr = projected ? packed(*in.w_hr, Packing::kCols) : Tensor();
  float* dg = ptr(r.grad_gates);
  float* dc = ptr(r.grad_c0);  // per-sequence: grad of the c each row's next step started from
  float* dh = projected ? ptr(r.grad_h) : nullptr;
  const float* go = grad_out.defined() ? cptr(grad_out) : nullptr;
  const int64_t ldo = grad_out.defined() ? grad_out.stride(0) : 0;
  const float* state = grad_h_last.defined() ? cptr(grad_h_last) : nullptr;
  const float* a = cptr(in.act);
  const float* c = cptr(in.cells);
  const float* c_init = cptr(in.c0);
  // Zoneout: per sequence, the part of its h's gradient sent straight back
  // from the step after (grad_h0's own part at the end).
  const Zoneout* zoneout = in.zoneout;
  const Tensor carry = zoneout ? at::zeros({B, H}, in.act.options()) : Tensor();

  const int64_t cell_panels = K.plain_panels(H), proj_panels = K.plain_panels(P);
  const int64_t panel_width = 4 * K.vec;
  // A step's row r is sequence r: it reads row r of the per-sequence buffers
  // (grad_h_n, grad_c0) and of the next step, so rows [r0, r1) of a step
  // touch only rows [r0, r1) of those.
  // Of step p's rows [r0, r1): how many go on to the next step (the first ones).
  auto going_on = [&](int64_t p, int64_t r0, int64_t r1) {
    return std::clamp<int64_t>(steps.going_on(p, reverse) - r0, 0, r1 - r0);
  };
  auto next_gates = [&](int64_t p, int64_t r0) {
    const int64_t next = p + 1 < T ? LayerSteps::step_at(p + 1, T, reverse) : -1;
    return rows_at(step_rows(dg, steps, next, 4 * H), r0, 4 * H);
  };
  // With w_hr, step p's total grad of h for rows [r0, r1), columns of
  // panels [pb, pe): grad_gates_next @ w_hh (or grad_h_n for rows that end
  // here) + grad_output.
  auto projection = [&](int64_t p, int64_t r0, int64_t r1, int64_t pb, int64_t pe) {
    const int64_t row0 = steps.offset[LayerSteps::step_at(p, T, reverse)] + r0;
    const int64_t on = going_on(p, r0, r1);
    const float* add = rows_at(go, row0, ldo);
    k::Gemm m;
    m.rows = on;
    m.n = P;
    m.k = 4 * H;
    m.a = {next_gates(p, r0), nullptr, on, 4 * H};
    m.w = cptr(packed_hh);
    m.add = add;
    m.ld_add = ldo;
    m.out = dh + row0 * P;
    m.ldo = P;
    K.gemm(m, pb, pe);
    const float* last = rows_at(state, r0, P);
    for (int64_t i = on; i < r1 - r0; ++i) {
      for (int64_t j = pb * panel_width, je = std::min(P, pe * panel_width); j < je; ++j) {
        dh[(row0 + i) * P + j] = (last ? last[i * P + j] : 0.0f) + (add ? add[i * ldo + j] : 0.0f);
      }
    }
  };
  // Step p's cell backward for rows [r0, r1) and panels [pb, pe) of H.
  auto cell = [&](int64_t p, int64_t r0, int64_t r1, int64_t pb, int64_t pe) {
    const int64_t t = LayerSteps::step_at(p, T, reverse);
    const int64_t prev = p > 0 ? LayerSteps::step_at(p - 1, T, reverse) : -1;
    const int64_t row0 = steps.offset[t] + r0;
    k::BackwardStep b;
    b.rows = r1 - r0;
    b.hidden = H;
    if (projected) {  // grad of h before the projection: grad_h @ w_hr
      b.k = P;
      b.gemm_rows = r1 - r0;
      b.a = dh + row0 * P;
      b.lda = P;
      b.w = cptr(packed_hr);
    } else {
      // Rows that go on to the next step get their h's gradient from it.
      b.k = 4 * H;
      b.gemm_rows = going_on(p, r0, r1);
      b.a = next_gates(p, r0);
      b.lda = 4 * H;
      b.w = cptr(packed_hh);
      b.state = rows_at(state, r0, P);
      b.lds = P;
      b.grad_out = rows_at(go, row0, ldo);
      b.ldo = ldo;
    }
    b.act = a + row0 * 4 * H;
    b.c_prev =
        rows_from({step_rows(c, steps, prev, H), c_init, steps.continuing(p, reverse), H}, r0);
    b.c = c + row0 * H;
    b.grad_c = dc + r0 * H;
    b.grad_gates = dg + row0 * 4 * H;
    if (zoneout) {
      b.keep = zoneout->from_row<float>(row0);
      b.carry = ptr(carry) + r0 * H;
    }
    K.backward_step(b, pb, pe);
  };
  // As in the forward, blocks of rows may run as whole loops, here from the last step back.
  const int64_t blocks = loop_row_blocks(steps, geometry, /*backward=*/true);
  const int threads = team_size(B * 4 * H * P, std::min(cell_panels, proj_panels));
  const std::vector<int64_t> panels = projected ? std::vector<int64_t>{proj_panels, cell_panels}
                                                : std::vector<int64_t>{cell_panels};
  run_steps(steps, reverse, /*backward=*/true, panels, blocks, threads,
            [&](int64_t q, int64_t p, int64_t r0, int64_t r1, int64_t pb, int64_t pe) {
              if (q + 1 == static_cast<int64_t>(panels.size())) {
                cell(p, r0, r1, pb, pe);
              } else {
                projection(p, r0, r1, pb, pe);
              }
            });

  grad_h0_from_gates(steps, reverse, dg, cptr(packed_hh), H, P, ptr(r.grad_h0));
  if (zoneout) r.grad_h0.add_(carry);
  return r;
}

}  // namespace cpu
}  // namespace pipelstm
