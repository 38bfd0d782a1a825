// One work item of the CUDA pointwise kernels, as a __host__ __device__
// function of (args, linear work index).
//
// The kernels in src/cuda/lstm_pointwise.cu are only a grid-stride loop around
// forward_item / backward_item. Keeping the body here lets a plain C++ host
// harness (kernels/tests/indexing_harness.cpp) drive it over the whole grid
// and compare it with the CPU loops, on a machine without a GPU.
//
// A work item is VEC consecutive columns j of one row b. With VEC > 1 every
// access is one aligned Pack load/store, which the caller must guarantee with
// can_vectorize(); VEC == 1 is the scalar fallback and has no requirements.
#pragma once

#include <cstdint>

#include "pipelstm/kernels/gate_math.h"
#include "pipelstm/kernels/lstm_pointwise.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

// Only the device pass knows the pragma; the host compiler would warn.
#if defined(__CUDA_ARCH__)
#define PIPELSTM_UNROLL _Pragma("unroll")
#else
#define PIPELSTM_UNROLL
#endif

namespace pipelstm {
namespace kernels {
namespace indexing {

// Storage type <-> math type. The identity by default, so the host harness can
// instantiate everything with float and double; 16-bit types compute in float.
template <typename T>
struct Storage {
  using compute_t = T;
  static PIPELSTM_HD compute_t load(T v) { return v; }
  static PIPELSTM_HD T store(compute_t v) { return v; }
};

#if defined(__CUDACC__)
template <>
struct Storage<__half> {
  using compute_t = float;
  static PIPELSTM_HD float load(__half v) { return __half2float(v); }
  static PIPELSTM_HD __half store(float v) { return __float2half_rn(v); }
};

template <>
struct Storage<__nv_bfloat16> {
  using compute_t = float;
  static PIPELSTM_HD float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static PIPELSTM_HD __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};
#endif

// Storage<T>'s load and store as function objects: what the persistent
// kernels' shared bodies take (lstm_persistent.h, lstm_persistent_tc.h).
template <typename T>
struct Load {
  PIPELSTM_HD typename Storage<T>::compute_t operator()(T v) const { return Storage<T>::load(v); }
};

template <typename T>
struct Store {
  PIPELSTM_HD T operator()(typename Storage<T>::compute_t v) const { return Storage<T>::store(v); }
};

// VEC elements moved as one access (16 bytes for the CUDA kernels).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  static_assert(VEC > 0 && (VEC & (VEC - 1)) == 0, "VEC must be a power of two");
  T v[VEC];
};

template <typename T, int VEC>
PIPELSTM_HD Pack<T, VEC> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, VEC>*>(p);
}

template <typename T, int VEC>
PIPELSTM_HD void store_pack(T* p, const Pack<T, VEC>& x) {
  *reinterpret_cast<Pack<T, VEC>*>(p) = x;
}

// Where work item `idx` lies. 64-bit throughout: B * 4H may pass
// 2^31 (the device compiler takes a 32-bit division fast path when it can).
struct ItemIndex {
  int64_t row;
  int64_t col;
  int64_t gates;  // offset of its elements of gate 0 in a [B, 4H] tensor (gate k: + k * H)
  int64_t state;  // offset of its elements in a [B, H] tensor
};

template <int VEC>
PIPELSTM_HD ItemIndex item_index(int64_t idx, int64_t hidden) {
  const int64_t per_row = hidden / VEC;
  const int64_t row = idx / per_row;
  const int64_t col = (idx - row * per_row) * VEC;
  return {row, col, row * 4 * hidden + col, row * hidden + col};
}

// Number of work items; with VEC > 1 only valid when hidden % VEC == 0.
template <int VEC>
inline int64_t num_items(int64_t batch, int64_t hidden) {
  return batch * (hidden / VEC);
}

// Launch shape: grid-stride loop, so the grid is capped and each thread may
// take several items. The cap fills any current GPU many times over.
constexpr int kBlockSize = 256;
constexpr int64_t kMaxBlocks = 65535;

inline int64_t grid_blocks(int64_t items, int64_t max_blocks = kMaxBlocks) {
  const int64_t blocks = (items + kBlockSize - 1) / kBlockSize;
  return blocks < max_blocks ? blocks : max_blocks;
}

template <typename T, int VEC>
inline bool aligned_for(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * VEC) == 0;  // null is aligned
}

template <typename T, int VEC>
inline bool aligned_for(const KeepWeights<T>& k) {
  return aligned_for<T, VEC>(k.c) && aligned_for<T, VEC>(k.h) && k.stride % VEC == 0;
}

// Host-side choice of the vector path: every row and gate block then starts
// on a Pack boundary, so all of one item's accesses are aligned.
template <typename T, int VEC>
inline bool can_vectorize(const PointwiseForwardArgs<T>& a) {
  return a.hidden % VEC == 0 && aligned_for<T, VEC>(a.gates) &&
         aligned_for<T, VEC>(a.hidden_gates) && aligned_for<T, VEC>(a.bias_ih) &&
         aligned_for<T, VEC>(a.bias_hh) && aligned_for<T, VEC>(a.c_prev) &&
         aligned_for<T, VEC>(a.act_gates) && aligned_for<T, VEC>(a.c) &&
         aligned_for<T, VEC>(a.h) && aligned_for<T, VEC>(a.h_prev) && aligned_for<T, VEC>(a.keep);
}

template <typename T, int VEC>
inline bool can_vectorize(const PointwiseBackwardArgs<T>& a) {
  return a.hidden % VEC == 0 && aligned_for<T, VEC>(a.grad_h) &&
         aligned_for<T, VEC>(a.grad_out) && a.grad_out_stride % VEC == 0 &&
         aligned_for<T, VEC>(a.grad_c) && aligned_for<T, VEC>(a.act_gates) &&
         aligned_for<T, VEC>(a.c_prev) && aligned_for<T, VEC>(a.c) &&
         aligned_for<T, VEC>(a.grad_gates) && aligned_for<T, VEC>(a.grad_c_prev) &&
         aligned_for<T, VEC>(a.keep) && aligned_for<T, VEC>(a.grad_h_prev);
}

// Same formulas and summation order as the CPU loops. act_gates may alias
// gates: the item reads all its inputs before its first store, and no other
// item touches the same elements. kZoneout: c and h blended by the keep
// weights (only without hidden gates and biases, as the layers call it).
template <typename T, int VEC, bool kHiddenGates, bool kBiasIh, bool kBiasHh, bool kZoneout = false>
PIPELSTM_HD void forward_item(const PointwiseForwardArgs<T>& a, int64_t idx) {
  using S = Storage<T>;
  using C = typename S::compute_t;
  using P = Pack<T, VEC>;
  const int64_t H = a.hidden;
  const ItemIndex it = item_index<VEC>(idx, H);

  C pre[4][VEC];
  PIPELSTM_UNROLL
  for (int k = 0; k < 4; ++k) {
    const P x = load_pack<T, VEC>(a.gates + it.gates + k * H);
    P hg{}, bi{}, bh{};
    if constexpr (kHiddenGates) hg = load_pack<T, VEC>(a.hidden_gates + it.gates + k * H);
    if constexpr (kBiasIh) bi = load_pack<T, VEC>(a.bias_ih + k * H + it.col);
    if constexpr (kBiasHh) bh = load_pack<T, VEC>(a.bias_hh + k * H + it.col);
    PIPELSTM_UNROLL
    for (int e = 0; e < VEC; ++e) {
      C v = S::load(x.v[e]);
      if constexpr (kHiddenGates) v += S::load(hg.v[e]);
      if constexpr (kBiasIh) v += S::load(bi.v[e]);
      if constexpr (kBiasHh) v += S::load(bh.v[e]);
      pre[k][e] = v;
    }
  }
  const P cp = load_pack<T, VEC>(a.c_prev + it.state);
  P hp{}, kc{}, kh{};
  if constexpr (kZoneout) {
    hp = load_pack<T, VEC>(a.h_prev + it.state);
    kc = load_pack<T, VEC>(a.keep.c_row(it.row) + it.col);
    kh = load_pack<T, VEC>(a.keep.h_row(it.row) + it.col);
  }

  P act[4], c, h;
  PIPELSTM_UNROLL
  for (int e = 0; e < VEC; ++e) {
    auto r = math::cell_forward(pre[0][e], pre[1][e], pre[2][e], pre[3][e], S::load(cp.v[e]));
    if constexpr (kZoneout) {  // h from the new cell, then both blended
      r.h = math::zoned(r.h, S::load(hp.v[e]), S::load(kh.v[e]));
      r.c = math::zoned(r.c, S::load(cp.v[e]), S::load(kc.v[e]));
    }
    act[0].v[e] = S::store(r.i);
    act[1].v[e] = S::store(r.f);
    act[2].v[e] = S::store(r.g);
    act[3].v[e] = S::store(r.o);
    c.v[e] = S::store(r.c);
    h.v[e] = S::store(r.h);
  }
  PIPELSTM_UNROLL
  for (int k = 0; k < 4; ++k) store_pack<T, VEC>(a.act_gates + it.gates + k * H, act[k]);
  store_pack<T, VEC>(a.c + it.state, c);
  store_pack<T, VEC>(a.h + it.state, h);
}

// grad_c_prev may alias grad_c, and grad_h_prev grad_h, for the same
// reason as above. kZoneout: the backward of forward_item's.
template <typename T, int VEC, bool kGradH, bool kGradOut, bool kGradC, bool kZoneout = false>
PIPELSTM_HD void backward_item(const PointwiseBackwardArgs<T>& a, int64_t idx) {
  using S = Storage<T>;
  using C = typename S::compute_t;
  using P = Pack<T, VEC>;
  const int64_t H = a.hidden;
  const ItemIndex it = item_index<VEC>(idx, H);

  P gh{}, go{}, gc{};
  if constexpr (kGradH) gh = load_pack<T, VEC>(a.grad_h + it.state);
  if constexpr (kGradOut) go = load_pack<T, VEC>(a.grad_out + it.row * a.grad_out_stride + it.col);
  if constexpr (kGradC) gc = load_pack<T, VEC>(a.grad_c + it.state);
  P act[4];
  PIPELSTM_UNROLL
  for (int k = 0; k < 4; ++k) act[k] = load_pack<T, VEC>(a.act_gates + it.gates + k * H);
  const P cp = load_pack<T, VEC>(a.c_prev + it.state);
  P cc{}, kc{}, kh{};
  if constexpr (kZoneout) {
    kc = load_pack<T, VEC>(a.keep.c_row(it.row) + it.col);
    kh = load_pack<T, VEC>(a.keep.h_row(it.row) + it.col);
  } else {
    cc = load_pack<T, VEC>(a.c + it.state);
  }

  P dg[4], dcp, dhp;
  PIPELSTM_UNROLL
  for (int e = 0; e < VEC; ++e) {
    const C grad_h = kGradH ? (kGradOut ? S::load(gh.v[e]) + S::load(go.v[e]) : S::load(gh.v[e]))
                            : (kGradOut ? S::load(go.v[e]) : C(0));
    const C grad_c = kGradC ? S::load(gc.v[e]) : C(0);
    const C i = S::load(act[0].v[e]), f = S::load(act[1].v[e]), g = S::load(act[2].v[e]),
            o = S::load(act[3].v[e]), c_prev = S::load(cp.v[e]);
    math::CellBackward<C> r;
    if constexpr (kZoneout) {
      r = math::cell_backward_zoneout(grad_h, grad_c, i, f, g, o, c_prev, S::load(kc.v[e]),
                                      S::load(kh.v[e]));
      dhp.v[e] = S::store(S::load(kh.v[e]) * grad_h);
    } else {
      r = math::cell_backward(grad_h, grad_c, i, f, g, o, c_prev, S::load(cc.v[e]));
    }
    dg[0].v[e] = S::store(r.d_i);
    dg[1].v[e] = S::store(r.d_f);
    dg[2].v[e] = S::store(r.d_g);
    dg[3].v[e] = S::store(r.d_o);
    dcp.v[e] = S::store(r.d_c_prev);
  }
  PIPELSTM_UNROLL
  for (int k = 0; k < 4; ++k) store_pack<T, VEC>(a.grad_gates + it.gates + k * H, dg[k]);
  store_pack<T, VEC>(a.grad_c_prev + it.state, dcp);
  if constexpr (kZoneout) store_pack<T, VEC>(a.grad_h_prev + it.state, dhp);
}

}  // namespace indexing
}  // namespace kernels
}  // namespace pipelstm
