// The persistent tensor-core LSTM kernels (fp16 / bf16 in, fp32 accumulate):
// the fragment arithmetic, tiling and shared-memory layout as plain
// __host__ __device__ functions, so that a host harness
// (kernels/tests/persistent_tc_harness.cpp) can drive the per-warp body on
// the CPU with a scalar mma.sync of the documented fragment layout.
//
// Forward, one launch per sequence (kernels/src/cuda/lstm_persistent_tc.cu):
//   gates_t^T [4H, B] = w_hh [4H, H] @ h_{t-1}^T [H, B] + input_gates_t^T
// computed as mma.m16n8k16 tiles with the weights as the A operand (rows:
// gate rows, 16 per M-tile) and h_{t-1} as the B operand (columns: batch
// rows, 8 per N-tile). Block g owns unit tiles of 8 hidden units each; a
// unit tile is two M-tiles whose rows are
//   M-tile 0: rows 0-7 gate i, rows 8-15 gate f of units u0 .. u0 + 7
//   M-tile 1: rows 0-7 gate g, rows 8-15 gate o of the same units
// so the accumulators of one lane (rows g and g + 8 of both M-tiles, the
// same two columns) are the four gates of two (unit, batch) cells: the cell
// update needs nothing from another lane, warp or block.
//
// The block's weights stay in shared memory for the whole sequence, stored
// in fragment order: the four 32-bit A registers of one lane for one
// (unit tile, K-tile, M-tile) are one 16-byte slot, and the 32 lanes' slots
// of a fragment are consecutive, so a warp's fragment load is one
// conflict-free 128-bit load per lane (no swizzle needed).
//
// Per step the block's work is split into items: a (unit tile, N-tile) pair
// and a slice of the K-tiles. With fewer pairs than warps the K dimension is
// split so that every warp has work; the slices' partial accumulators meet
// in shared memory and one warp per pair sums them and applies the gate
// math. Steps are separated by a grid-wide barrier.
//
// Backward, one launch per sequence, positions in the reverse of the
// forward's order:
//   grad_h_{t-1}^T [H, B] = w_hh^T [H, 4H] @ grad_gates_t^T [4H, B]
// as the same mma tiles with w_hh^T as A (rows: 16 hidden units per
// M-tile, K: the 4H gate rows) and grad_gates_t as B. A lane's four
// accumulators are grad_h of four (unit, batch) cells whose activated gates,
// cells and running grad_c the block owns, so the cell backward is local
// too; a last product phase gives grad_h0. The weight and input gradients
// stay one GEMM each over all steps, outside.
#pragma once

#include <cstdint>

#include "pipelstm/kernels/lstm_persistent.h"
#include "pipelstm/kernels/lstm_pointwise_indexing.h"  // PIPELSTM_UNROLL

namespace pipelstm {
namespace kernels {
namespace tc {

constexpr int kLanes = 32;
constexpr int kTileM = 16, kTileN = 8, kTileK = 16;
constexpr int kUnitsPerTile = 8;   // forward: 8 units x 4 gates = two M-tiles
constexpr int kWarps = 8;          // warps per block
constexpr int kThreads = kWarps * kLanes;
constexpr int64_t kMaxBatch = 64;  // bounds the partial-sum buffer
constexpr int kLoadDepth = 16;     // K-tiles whose B fragments a warp loads at once

// A position in a fragment's matrix: A is M x K (row, col = k), B is K x N
// (row = k, col = n), C/D is M x N.
struct Coord {
  int row, col;
};

// mma.m16n8k16 with 16-bit A/B and f32 C/D, after the PTX ISA's "Matrix
// Fragments for mma.m16n8k16 with floating point type". groupID = lane / 4,
// threadID_in_group = lane % 4. A: 8 elements (4 registers of two, the
// lower index in the low half), B: 4 elements (2 registers), C/D: 4 floats.
PIPELSTM_HD Coord a_elem(int lane, int i) {
  const int g = lane >> 2, q = lane & 3;
  return {g + ((i >> 1) & 1) * 8, q * 2 + (i & 1) + (i >> 2) * 8};
}

PIPELSTM_HD Coord b_elem(int lane, int i) {
  const int g = lane >> 2, q = lane & 3;
  return {q * 2 + (i & 1) + (i >> 1) * 8, g};
}

PIPELSTM_HD Coord c_elem(int lane, int i) {
  const int g = lane >> 2, q = lane & 3;
  return {g + (i >> 1) * 8, q * 2 + (i & 1)};
}

// Forward: row r of M-tile m of a unit tile is gate `gate` of unit `unit`
// (0 .. 7 within the tile).
struct GateRow {
  int gate, unit;
};

PIPELSTM_HD GateRow fwd_row(int m, int r) { return {2 * m + (r >> 3), r & 7}; }

// The launch geometry of one call, either direction (ForwardPlan,
// BackwardPlan say what their tiles hold).
struct TilePlan {
  int64_t batch = 0, hidden = 0;
  int64_t k_tiles = 0;     // K-tiles of the product
  int64_t unit_tiles = 0;  // tiles of hidden units per block
  int64_t blocks = 0;
  int64_t n_tiles = 0;     // ceil(B / 8)
  int64_t pairs = 0;       // (unit tile, N-tile) pairs per block
  int64_t slices = 0;      // K slices per pair
};

// Forward: k_tiles = ceil(H / 16), unit tiles of 8 units (two M-tiles).
struct ForwardPlan : TilePlan {};

PIPELSTM_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// `unit_tiles` tiles of `units_per_tile` units per block, K over `k` rows;
// the K dimension split so that every warp has a work item where the pairs
// are fewer than the warps (so K is split only where the pairs are at most
// kWarps / 2, and each warp then finishes at most one pair).
PIPELSTM_HD TilePlan make_tile_plan(int64_t batch, int64_t hidden, int64_t k,
                                    int64_t units_per_tile, int64_t unit_tiles) {
  TilePlan p;
  p.batch = batch;
  p.hidden = hidden;
  p.k_tiles = ceil_div(k, kTileK);
  p.unit_tiles = unit_tiles;
  p.blocks = ceil_div(ceil_div(hidden, units_per_tile), unit_tiles);
  p.n_tiles = ceil_div(batch, kTileN);
  p.pairs = unit_tiles * p.n_tiles;
  const int64_t split = kWarps / p.pairs;
  p.slices = split < 1 ? 1 : (split > p.k_tiles ? p.k_tiles : split);
  return p;
}

// `unit_tiles` unit tiles per block (the caller picks it: the fewest for
// which every block has a multiprocessor, see default_unit_tiles).
PIPELSTM_HD ForwardPlan make_forward_plan(int64_t batch, int64_t hidden, int64_t unit_tiles) {
  return {make_tile_plan(batch, hidden, hidden, kUnitsPerTile, unit_tiles)};
}

// The fewest unit tiles per block that need at most `sms` blocks.
inline int64_t default_unit_tiles(int64_t hidden, int64_t sms) {
  return ceil_div(ceil_div(hidden, kUnitsPerTile), sms);
}

// Shared memory: the weight slab (16-byte slots), then the partial sums.
PIPELSTM_HD int64_t slab_slots(const ForwardPlan& p) { return p.unit_tiles * p.k_tiles * 2 * kLanes; }

PIPELSTM_HD int64_t partial_floats(const ForwardPlan& p) {
  return p.slices > 1 ? p.slices * p.pairs * 8 * kLanes : 0;
}

inline int64_t forward_smem_bytes(const ForwardPlan& p) {
  return slab_slots(p) * 16 + partial_floats(p) * 4;
}

// The slot of lane `lane`'s A fragment of (unit tile, K-tile, M-tile).
PIPELSTM_HD int64_t slab_slot(const ForwardPlan& p, int64_t tau, int64_t kt, int m, int lane) {
  return ((tau * p.k_tiles + kt) * 2 + m) * kLanes + lane;
}

// Where element i (0 .. 7) of slab slot `slot` of block `block` comes from:
// an index into w_hh [4H, H], or -1 for the zero padding of the tails.
PIPELSTM_HD int64_t slab_source(const ForwardPlan& p, int64_t block, int64_t slot, int i) {
  const int lane = static_cast<int>(slot % kLanes);
  const int m = static_cast<int>((slot / kLanes) % 2);
  const int64_t kt = (slot / (kLanes * 2)) % p.k_tiles;
  const int64_t tau = slot / (kLanes * 2 * p.k_tiles);
  const Coord c = a_elem(lane, i);
  const GateRow r = fwd_row(m, c.row);
  const int64_t H = p.hidden;
  const int64_t j = (block * p.unit_tiles + tau) * kUnitsPerTile + r.unit;
  const int64_t col = kt * kTileK + c.col;
  if (j >= H || col >= H) return -1;
  return (r.gate * H + j) * H + col;
}

// One warp's work item of a step.
struct Item {
  int64_t pair, tau, n_tile, slice, kt_begin, kt_end;
};

PIPELSTM_HD int64_t item_count(const TilePlan& p) { return p.pairs * p.slices; }

// Item `it` of a step: pair it % pairs, K slice it / pairs.
PIPELSTM_HD Item item_at(const TilePlan& p, int64_t it) {
  Item w;
  w.pair = it % p.pairs;
  w.slice = it / p.pairs;
  w.tau = w.pair / p.n_tiles;
  w.n_tile = w.pair % p.n_tiles;
  w.kt_begin = w.slice * p.k_tiles / p.slices;
  w.kt_end = (w.slice + 1) * p.k_tiles / p.slices;
  return w;
}

// Element i (0 .. 3) of lane `lane`'s B fragment for (N-tile, K-tile):
// batch row n and column k of h_{t-1}; out of range (n >= B or k >= H)
// the element is zero.
struct BSource {
  int64_t n, k;
  bool valid;
};

PIPELSTM_HD BSource b_source(const TilePlan& p, int64_t k_rows, int64_t n_tile, int64_t kt,
                             int lane, int i) {
  const Coord c = b_elem(lane, i);
  BSource s;
  s.n = n_tile * kTileN + c.col;
  s.k = kt * kTileK + c.row;
  s.valid = s.n < p.batch && s.k < k_rows;
  return s;
}

PIPELSTM_HD BSource fwd_b_source(const ForwardPlan& p, int64_t n_tile, int64_t kt, int lane,
                                 int i) {
  return b_source(p, p.hidden, n_tile, kt, lane, i);
}

// The partial accumulators of slice s of a pair: [slice][pair][8][lane]
// floats, lane innermost (conflict-free).
PIPELSTM_HD int64_t partial_index(const ForwardPlan& p, int64_t slice, int64_t pair, int e,
                                  int lane) {
  return ((slice * p.pairs + pair) * 8 + e) * kLanes + lane;
}

// The two cells a lane finishes for an item (columns c_elem(lane, 0) and
// c_elem(lane, 1): one hidden unit, two batch rows) and what their gate
// math reads besides the product. The kernel loads them before the item's
// product, so that these loads travel with the product's own instead of
// waiting one more round trip after it; nothing they read is written
// during the step.
struct FwdCells {
  int64_t unit[2], row[2];
  bool valid[2];
  persistent::UnitInputs in[2];
};

template <typename T, typename Load>
PIPELSTM_HD FwdCells fwd_cells(const PersistentForwardArgs<T>& a, const ForwardPlan& p,
                               int64_t block, const Item& w, int lane, int64_t t,
                               int64_t step_pos, Load load) {
  FwdCells f;
  PIPELSTM_UNROLL
  for (int cell = 0; cell < 2; ++cell) {
    const Coord home = c_elem(lane, cell);
    f.unit[cell] = (block * p.unit_tiles + w.tau) * kUnitsPerTile + fwd_row(0, home.row).unit;
    f.row[cell] = w.n_tile * kTileN + home.col;
    f.valid[cell] = f.unit[cell] < p.hidden && f.row[cell] < p.batch;
    if (f.valid[cell]) {
      f.in[cell] = persistent::unit_inputs(a, t, step_pos, f.row[cell], f.unit[cell], load);
    }
  }
  return f;
}

// The gate math of a lane's accumulators: acc[m * 4 + i] is C element i of
// M-tile m, that is gate fwd_row(m, row).gate of unit fwd_row(m, row).unit
// for batch column col (row, col = c_elem(lane, i)). A lane holds two
// columns, each with all four gates of one unit; persistent::finish_unit
// writes h, c and the activated gates of each (unit, batch row) in range,
// and on_h(batch row, unit, h) gets each h it wrote.
struct NoHook {
  template <typename... A>
  PIPELSTM_HD void operator()(const A&...) const {}
};

template <typename T, typename Store, typename OnH = NoHook>
PIPELSTM_HD void fwd_finish(const PersistentForwardArgs<T>& a, const FwdCells& f, int lane,
                            int64_t t, const float (&acc)[8], Store store, OnH on_h = {}) {
  // Cell k is the column of C element k; every array index below is a
  // constant once unrolled (the matching is by value), so the device keeps
  // everything in registers.
  PIPELSTM_UNROLL
  for (int cell = 0; cell < 2; ++cell) {
    const Coord home = c_elem(lane, cell);
    float dot[4];
    PIPELSTM_UNROLL
    for (int gate = 0; gate < 4; ++gate) {
      dot[gate] = 0.0f;
      PIPELSTM_UNROLL
      for (int e = 0; e < 8; ++e) {
        const Coord c = c_elem(lane, e & 3);
        const GateRow r = fwd_row(e >> 2, c.row);
        if (c.col == home.col && r.gate == gate) dot[gate] = acc[e];
      }
    }
    if (f.valid[cell]) {
      on_h(f.row[cell], f.unit[cell], persistent::finish_unit(a, t, f.row[cell], f.unit[cell], f.in[cell], dot, store));
    }
  }
}

// ---- Backward recurrent product: grad_h^T = w_hh^T @ grad_gates^T ----

// Geometry: blocks own M-tiles of 16 hidden units (the unit tiles, pairs
// (M-tile, N-tile)); K runs over the 4H gate rows as one dimension,
// k_tiles = ceil(4H / 16) (a K-tile may hold rows of two gates when H is
// not a multiple of 16; nothing depends on where the gates meet).
struct BackwardPlan : TilePlan {};

PIPELSTM_HD BackwardPlan make_backward_plan(int64_t batch, int64_t hidden, int64_t unit_tiles) {
  return {make_tile_plan(batch, hidden, 4 * hidden, kTileM, unit_tiles)};
}

PIPELSTM_HD int64_t slab_slots(const BackwardPlan& p) { return p.unit_tiles * p.k_tiles * kLanes; }

PIPELSTM_HD int64_t bwd_slab_slot(const BackwardPlan& p, int64_t mt, int64_t kt, int lane) {
  return (mt * p.k_tiles + kt) * kLanes + lane;
}

// Where element i of backward slab slot `slot` of block `block` comes from:
// A[row = unit j][col = gate row k] = w_hh[k, j], an index into w_hh
// [4H, H], or -1 (padding).
PIPELSTM_HD int64_t slab_source(const BackwardPlan& p, int64_t block, int64_t slot, int i) {
  const int lane = static_cast<int>(slot % kLanes);
  const int64_t kt = (slot / kLanes) % p.k_tiles;
  const int64_t mt = slot / (kLanes * p.k_tiles);
  const Coord c = a_elem(lane, i);
  const int64_t H = p.hidden;
  const int64_t j = (block * p.unit_tiles + mt) * kTileM + c.row;
  const int64_t k = kt * kTileK + c.col;
  if (j >= H || k >= 4 * H) return -1;
  return k * H + j;
}

// Element i of a lane's B fragment: batch row n, gate column k of
// grad_gates [B, 4H].
PIPELSTM_HD BSource bwd_b_source(const BackwardPlan& p, int64_t n_tile, int64_t kt, int lane,
                                 int i) {
  return b_source(p, 4 * p.hidden, n_tile, kt, lane, i);
}

// The (hidden unit, batch row) of accumulator i (0 .. 3) of a lane; valid
// only where both are in range.
struct Cell {
  int64_t j, b;
  bool valid;
};

// The (unit, batch row) of accumulator i (0 .. 3) of a lane.
PIPELSTM_HD Cell bwd_cell(const BackwardPlan& p, int64_t block, const Item& w, int lane, int i) {
  const Coord c = c_elem(lane, i);
  Cell r;
  r.j = (block * p.unit_tiles + w.tau) * kTileM + c.row;
  r.b = w.n_tile * kTileN + c.col;
  r.valid = r.j < p.hidden && r.b < p.batch;
  return r;
}

// The partial accumulators of the backward's K slices: [slice][pair][4][lane].
PIPELSTM_HD int64_t bwd_partial_floats(const BackwardPlan& p) {
  return p.slices > 1 ? p.slices * p.pairs * 4 * kLanes : 0;
}

PIPELSTM_HD int64_t bwd_partial_index(const BackwardPlan& p, int64_t slice, int64_t pair, int e,
                                      int lane) {
  return ((slice * p.pairs + pair) * 4 + e) * kLanes + lane;
}

inline int64_t backward_smem_bytes(const BackwardPlan& p) {
  return slab_slots(p) * 16 + bwd_partial_floats(p) * 4;
}

inline int64_t default_backward_unit_tiles(int64_t hidden, int64_t sms) {
  return ceil_div(ceil_div(hidden, kTileM), sms);
}

}  // namespace tc

// The backward of one layer direction without projection, as the step loop
// computes it: per step (in the reverse of the forward's order) grad_h is
// grad_output + the recurrent gradient (grad_h_n at the first), the cell
// backward gives grad_gates and the running grad_c, and grad_gates @ w_hh is
// the next recurrent gradient. Layouts as PersistentForwardArgs.
template <typename T>
struct PersistentBackwardArgs {
  const T* grad_output = nullptr;  // optional [T, B, H]: gradient of every step's h
  const T* grad_h_n = nullptr;     // optional [B, H]
  const T* grad_c_n = nullptr;     // optional [B, H]
  const T* w_hh = nullptr;         // [4H, H]
  const T* c0 = nullptr;           // [B, H]
  const T* act_gates = nullptr;    // [T, B, 4H]: the forward's activated gates
  const T* cells = nullptr;        // [T, B, H]: the forward's c of every step
  T* grad_gates = nullptr;         // [T, B, 4H] out: pre-activation gradients
  T* grad_h0 = nullptr;            // [B, H] out
  T* grad_c0 = nullptr;            // [B, H] out; holds the running grad_c meanwhile
  int64_t steps = 0, batch = 0, hidden = 0;
  bool reverse = false;
};

namespace tc {

// The four cells a lane finishes for an item at step position `pos` (step
// t) and what their cell backward reads besides the product: the given
// gradients (grad_h_n only at the first position processed, pos == steps -
// 1, where it stands in for the product), the running grad_c (kept in
// grad_c0, read and written by this lane only), the forward's activated
// gates and cells. Loaded before the item's product, as FwdCells; nothing
// they read is written by another lane during the step.
struct BwdCells {
  Cell cell[4];
  float grad_h_n[4], grad_out[4], grad_c[4], c_prev[4], c[4], gate[4][4];
};

template <typename T, typename Load>
PIPELSTM_HD BwdCells bwd_cells(const PersistentBackwardArgs<T>& a, const BackwardPlan& p,
                               int64_t block, const Item& w, int lane, int64_t t, int64_t pos,
                               Load load) {
  const int64_t H = a.hidden, B = a.batch;
  const bool first = pos == a.steps - 1;
  const int64_t prev = pos == 0 ? -1 : persistent::step_at(pos - 1, a.steps, a.reverse);
  BwdCells f;
  PIPELSTM_UNROLL
  for (int i = 0; i < 4; ++i) {
    const Cell c = f.cell[i] = bwd_cell(p, block, w, lane, i);
    if (!c.valid) continue;
    const int64_t s = c.b * H + c.j, ts = (t * B + c.b) * H + c.j;
    const int64_t g0 = (t * B + c.b) * 4 * H + c.j;
    f.grad_h_n[i] = first && a.grad_h_n ? load(a.grad_h_n[s]) : 0.0f;
    f.grad_out[i] = a.grad_output ? load(a.grad_output[ts]) : 0.0f;
    f.grad_c[i] = first ? (a.grad_c_n ? load(a.grad_c_n[s]) : 0.0f) : load(a.grad_c0[s]);
    f.c_prev[i] = prev < 0 ? load(a.c0[s]) : load(a.cells[(prev * B + c.b) * H + c.j]);
    f.c[i] = load(a.cells[ts]);
    PIPELSTM_UNROLL
    for (int k = 0; k < 4; ++k) f.gate[i][k] = load(a.act_gates[g0 + k * H]);
  }
  return f;
}

// The cell backward of those cells at step position `pos` (step t): acc[i]
// is the recurrent gradient of cell i (ignored at the first position
// processed, where grad_h_n stands in for it). on_gates(batch row, unit,
// d_i, d_f, d_g, d_o) gets each cell's gate gradients as it stored them.
template <typename T, typename Store, typename OnGates = NoHook>
PIPELSTM_HD void bwd_finish(const PersistentBackwardArgs<T>& a, const BwdCells& f, int64_t t,
                            int64_t pos, const float (&acc)[4], Store store, OnGates on_gates = {}) {
  const int64_t H = a.hidden, B = a.batch;
  const bool first = pos == a.steps - 1;
  PIPELSTM_UNROLL
  for (int i = 0; i < 4; ++i) {
    const Cell c = f.cell[i];
    if (!c.valid) continue;
    float grad_h = first ? f.grad_h_n[i] : acc[i];
    if (a.grad_output) grad_h += f.grad_out[i];
    const auto r = math::cell_backward(grad_h, f.grad_c[i], f.gate[i][0], f.gate[i][1],
                                       f.gate[i][2], f.gate[i][3], f.c_prev[i], f.c[i]);
    const int64_t g0 = (t * B + c.b) * 4 * H + c.j;
    const T d[4] = {store(r.d_i), store(r.d_f), store(r.d_g), store(r.d_o)};
    PIPELSTM_UNROLL
    for (int k = 0; k < 4; ++k) a.grad_gates[g0 + k * H] = d[k];
    a.grad_c0[c.b * H + c.j] = store(r.d_c_prev);
    on_gates(c.b, c.j, d[0], d[1], d[2], d[3]);
  }
}

// The last phase: the product of the last step processed is grad_h0.
template <typename T, typename Store>
PIPELSTM_HD void bwd_write_h0(const PersistentBackwardArgs<T>& a, const BackwardPlan& p,
                              int64_t block, const Item& w, int lane, const float (&acc)[4],
                              Store store) {
  for (int i = 0; i < 4; ++i) {
    const Cell c = bwd_cell(p, block, w, lane, i);
    if (c.valid) a.grad_h0[c.b * a.hidden + c.j] = store(acc[i]);
  }
}

// The grad_gates row that the product at position pos reads: that of the
// step processed before it (pos + 1), or of the last one (pos == -1, the
// grad_h0 phase). Valid for pos < steps - 1.
template <typename T>
PIPELSTM_HD const T* bwd_b_row(const PersistentBackwardArgs<T>& a, int64_t pos, int64_t n) {
  const int64_t src = persistent::step_at(pos + 1, a.steps, a.reverse);
  return a.grad_gates + (src * a.batch + n) * 4 * a.hidden;
}

}  // namespace tc
}  // namespace kernels
}  // namespace pipelstm
