#include "items.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "streams.h"

namespace pipelstm::pipeline {
namespace {

std::vector<int64_t> split_sizes(int64_t n, int64_t parts) {
  std::vector<int64_t> s(parts, n / parts);
  for (int64_t i = 0; i < n % parts; ++i) ++s[i];
  return s;
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> o(sizes.size(), 0);
  for (size_t i = 1; i < sizes.size(); ++i) o[i] = o[i - 1] + sizes[i - 1];
  return o;
}

// K chunks of the T steps, each of about N / K of the `tokens` (rows per
// step) and at least one step.
std::vector<int64_t> token_balanced_sizes(const std::vector<int64_t>& tokens, int64_t K) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  int64_t N = 0;
  for (int64_t n : tokens) N += n;
  std::vector<int64_t> sizes;
  int64_t t = 0, seen = 0;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t start = t;
    // take steps while this chunk is under its share, leaving a step for each chunk after it
    do {
      seen += tokens[t++];
    } while (t < T - (K - 1 - k) && seen * K < N * (k + 1));
    if (k == K - 1) t = T;
    sizes.push_back(t - start);
  }
  return sizes;
}

}  // namespace

ItemGrid ItemGrid::packed_grid(const at::Tensor& batch_sizes, int64_t chunks,
                               int64_t micro_batches) {
  const auto bs_t = batch_sizes.contiguous();
  const int64_t* bs = bs_t.const_data_ptr<int64_t>();
  const int64_t T = bs_t.numel(), B = bs[0];
  ItemGrid g(T, B, chunks, micro_batches);
  g.packed = true;
  g.t_sizes = token_balanced_sizes(std::vector<int64_t>(bs, bs + T), g.K);
  g.t_off = offsets_of(g.t_sizes);
  std::vector<int64_t> step_off(T, 0);
  for (int64_t t = 1; t < T; ++t) step_off[t] = step_off[t - 1] + bs[t - 1];
  const int64_t N = T == 0 ? 0 : step_off[T - 1] + bs[T - 1];
  g.item_batch_sizes.resize(g.count());
  g.item_rows.assign(g.count(), 0);
  g.item_start.assign(g.count(), 0);
  g.order = at::empty({N}, at::kLong);
  int64_t* order = g.order.data_ptr<int64_t>();
  int64_t at_row = 0;
  for (int64_t m = 0; m < g.M; ++m) {
    for (int64_t k = 0; k < g.K; ++k) {
      const int64_t i = g.index(m, k);
      g.item_start[i] = at_row;
      std::vector<int64_t> sizes;
      for (int64_t t = g.t_off[k]; t < g.t_off[k] + g.t_sizes[k]; ++t) {
        const int64_t n = std::clamp(bs[t] - g.b_off[m], int64_t{0}, g.b_sizes[m]);
        if (n == 0) break;  // running sequences only end
        sizes.push_back(n);
        for (int64_t r = 0; r < n; ++r) order[at_row++] = step_off[t] + g.b_off[m] + r;
      }
      g.item_rows[i] = at_row - g.item_start[i];
      if (!sizes.empty()) g.item_batch_sizes[i] = at::tensor(sizes, at::kLong);
    }
  }
  return g;
}

ItemGrid::ItemGrid(int64_t T, int64_t B, int64_t chunks, int64_t micro_batches)
    : K(std::min(chunks, T)), M(std::min(micro_batches, B)) {
  t_sizes = split_sizes(T, K);
  b_sizes = split_sizes(B, M);
  t_off = offsets_of(t_sizes);
  b_off = offsets_of(b_sizes);
}

at::Tensor ItemGrid::piece(const at::Tensor& x, int64_t m, int64_t k) const {
  return x.narrow(0, t_off[k], t_sizes[k]).narrow(1, b_off[m], b_sizes[m]);
}

at::Tensor ItemGrid::rows(const at::Tensor& x, int64_t m) const {
  return x.narrow(0, b_off[m], b_sizes[m]);
}

std::vector<int64_t> ItemGrid::piece_sizes(std::vector<int64_t> full, int64_t m, int64_t k) const {
  if (packed) {
    full[0] = item_rows[index(m, k)];
    return full;
  }
  full[0] = t_sizes[k];
  full[1] = b_sizes[m];
  return full;
}

at::Tensor ItemGrid::assemble(const std::vector<at::Tensor>& pieces) const {
  if (packed) {  // the items' rows back in the input's row order
    const at::Tensor rows = at::cat(pieces, 0);
    return at::empty_like(rows).index_copy_(0, order.to(rows.device()), rows);
  }
  std::vector<at::Tensor> per_m;
  for (int64_t m = 0; m < M; ++m) {
    const std::vector<at::Tensor> per_k(pieces.begin() + m * K, pieces.begin() + (m + 1) * K);
    per_m.push_back(K == 1 ? per_k[0] : at::cat(per_k, 0));
  }
  return M == 1 ? per_m[0] : at::cat(per_m, 1);
}

at::Tensor ItemGrid::join_rows(const std::vector<at::Tensor>& per_m) const {
  return per_m.size() == 1 ? per_m[0] : at::cat(per_m, 0);
}

std::vector<at::Tensor> ItemGrid::scatter(const at::Tensor& x) const {
  std::vector<at::Tensor> pieces(count());
  if (packed) {  // one gather into item order, then each item's rows (views)
    const at::Tensor rows = x.index_select(0, order.to(x.device()));
    for (int64_t i = 0; i < count(); ++i) pieces[i] = rows.narrow(0, item_start[i], item_rows[i]);
    return pieces;
  }
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) pieces[index(m, k)] = piece(x, m, k);
  }
  return pieces;
}

std::vector<std::vector<int64_t>> ItemGrid::scatter_sizes(const std::vector<int64_t>& full) const {
  std::vector<std::vector<int64_t>> sizes(count());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) sizes[index(m, k)] = piece_sizes(full, m, k);
  }
  return sizes;
}

std::vector<std::optional<at::Tensor>> ItemGrid::scatter_rows(
    const std::vector<std::optional<at::Tensor>>& per_layer,
    const std::vector<c10::Device>& devices) const {
  std::vector<std::optional<at::Tensor>> parts(per_layer.size() * M);
  for (size_t l = 0; l < per_layer.size(); ++l) {
    if (!per_layer[l].has_value() || !per_layer[l]->defined()) continue;
    for (int64_t m = 0; m < M; ++m) {
      parts[l * M + m] = to_device(rows(*per_layer[l], m), devices[l]).contiguous();
    }
  }
  return parts;
}

std::vector<std::pair<int64_t, int64_t>> join_runs(const std::vector<int64_t>& rows) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  const int64_t K = static_cast<int64_t>(rows.size());
  for (int64_t k = 0; k < K;) {
    if (rows[k] < 0) {
      ++k;
      continue;
    }
    int64_t end = k, joined = 0;
    while (end < K && rows[end] >= 0 && (end == k || joined < kJoinRows)) {
      joined += rows[end];
      ++end;
    }
    runs.emplace_back(k, end);
    k = end;
  }
  return runs;
}

}  // namespace pipelstm::pipeline
