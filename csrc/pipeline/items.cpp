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

}  // namespace

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
  full[0] = t_sizes[k];
  full[1] = b_sizes[m];
  return full;
}

at::Tensor ItemGrid::assemble(const std::vector<at::Tensor>& pieces) const {
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

}  // namespace pipelstm::pipeline
