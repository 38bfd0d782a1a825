// Units of a pipeline stage (see units.h).
#include "units.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include "../lstm_ops.h"

namespace pipelstm::pipeline {

const char* unit_kind_name(UnitKind k) {
  switch (k) {
    case UnitKind::Lstm: return "LSTM layer";
    case UnitKind::Embedding: return "Embedding";
    case UnitKind::Linear: return "Linear";
    case UnitKind::Dropout: return "Dropout";
    case UnitKind::Activation: return "activation";
    case UnitKind::LayerNorm: return "LayerNorm";
    case UnitKind::CrossEntropy: return "CrossEntropy";
  }
  return "?";
}

namespace {

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

at::Generator seeded_generator(const c10::Device& device, uint64_t seed) {
  if (device.is_cpu()) return at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Generator global = at::globalContext().defaultGenerator(device);
  at::Generator g;
  {
    std::lock_guard<std::mutex> lock(global.mutex());
    g = global.clone();
  }
  g.set_current_seed(seed);
  return g;
}

}  // namespace

const Tensor& need(const OptTensor& t, const UnitSpec& u, const char* what) {
  TORCH_CHECK(t.has_value() && t->defined(), "missing parameter ", what, " of unit '", u.name, "'");
  return *t;
}

uint64_t dropout_seed(uint64_t pass_seed, int64_t unit, int64_t m, int64_t k) {
  return splitmix64(splitmix64(splitmix64(pass_seed ^ static_cast<uint64_t>(unit)) ^
                               static_cast<uint64_t>(m)) ^
                    static_cast<uint64_t>(k));
}

Tensor unit_forward(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool training,
                    bool keep, Tensor& h, Tensor& c, std::vector<Tensor>& saved, uint64_t seed,
                    const Tensor& target) {
  switch (u.kind) {
    case UnitKind::Lstm: {
      auto [out, h_n, c_n, ws] =
          lstm_layer_forward(x, h, c, need(p[0], u, "w_ih"), need(p[1], u, "w_hh"), p[2], p[3],
                             p[4], /*reverse=*/false);
      if (keep) saved = {x, h, c, out, ws};
      h = h_n;
      c = c_n;
      return out;
    }
    case UnitKind::Embedding: {
      TORCH_CHECK(x.scalar_type() == at::kLong || x.scalar_type() == at::kInt,
                  "Embedding expects integer indices, got ", x.scalar_type());
      if (keep) saved = {x};
      return at::embedding(need(p[0], u, "weight"), x, u.padding_idx, u.scale_grad_by_freq,
                           /*sparse=*/false);
    }
    case UnitKind::Linear: {
      if (keep) saved = {x};
      return at::linear(x, need(p[0], u, "weight"), p[1]);
    }
    case UnitKind::Activation: {
      Tensor y;
      switch (u.activation) {
        case Activation::Relu: y = at::relu(x); break;
        case Activation::Tanh: y = at::tanh(x); break;
        case Activation::Sigmoid: y = at::sigmoid(x); break;
        case Activation::Gelu: y = at::gelu(x, "none"); break;
        case Activation::GeluTanh: y = at::gelu(x, "tanh"); break;
        case Activation::Silu: y = at::silu(x); break;
      }
      if (keep) saved = {x, y};
      return y;
    }
    case UnitKind::LayerNorm: {
      auto [y, mean, rstd] =
          at::native_layer_norm(x, {x.size(-1)}, p[0], p[1], u.eps);
      if (keep) saved = {x, mean, rstd};
      return y;
    }
    case UnitKind::CrossEntropy: {
      TORCH_CHECK(x.dim() == 3 && target.defined(), "the loss expects logits [T, B, classes], got ",
                  x.sizes());
      const Tensor lsm = at::log_softmax(x.reshape({-1, x.size(-1)}), 1);
      auto [loss, total_weight] = at::nll_loss_forward(lsm, target.reshape({-1}), {},
                                                       at::Reduction::Sum, u.ignore_index);
      if (keep) saved = {lsm, target, total_weight};
      return loss;
    }
    case UnitKind::Dropout: {
      if (!training || u.p == 0.0) return x;
      Tensor mask = at::empty_like(x, at::MemoryFormat::Contiguous);
      if (u.p >= 1.0) {
        mask.zero_();
      } else {
        mask.bernoulli_(1.0 - u.p, seeded_generator(x.device(), seed)).div_(1.0 - u.p);
      }
      if (keep) saved = {mask};
      return x * mask;
    }
  }
  TORCH_CHECK(false, "unknown unit kind");
}


Tensor unit_backward_data(const UnitSpec& u, const UnitParams& p, const Tensor& g,
                          const std::vector<Tensor>& saved, OptTensor& grad_h, OptTensor& grad_c,
                          Piece& piece) {
  switch (u.kind) {
    case UnitKind::Lstm: {
      const Tensor &x = saved[0], &h0 = saved[1], &c0 = saved[2], &out = saved[3],
                   &ws = saved[4];
      if (!g.defined() && !grad_h.has_value() && !grad_c.has_value()) return Tensor();
      LayerDataGrads d = lstm_layer_backward_data(g.defined() ? OptTensor(g) : std::nullopt, grad_h,
                                                  grad_c, x, h0, c0, *p[0], *p[1], p[4], out, ws);
      grad_h = d.grad_h0;
      grad_c = d.grad_c0;
      piece = {x, h0, out, d.grad_gates, d.grad_h, d.raw_h};
      return d.grad_input;
    }
    case UnitKind::Embedding: {
      if (g.defined()) piece = {saved[0], g};
      return Tensor();
    }
    case UnitKind::Linear: {
      if (!g.defined()) return Tensor();
      piece = {saved[0], g};
      return at::matmul(g, *p[0]);
    }
    case UnitKind::Dropout: {
      if (!g.defined() || saved.empty()) return g;
      return g * saved[0];
    }
    case UnitKind::Activation: {
      if (!g.defined()) return g;
      const Tensor &x = saved[0], &y = saved[1];
      switch (u.activation) {
        case Activation::Relu: return at::threshold_backward(g, y, 0);
        case Activation::Tanh: return at::tanh_backward(g, y);
        case Activation::Sigmoid: return at::sigmoid_backward(g, y);
        case Activation::Gelu: return at::gelu_backward(g, x, "none");
        case Activation::GeluTanh: return at::gelu_backward(g, x, "tanh");
        case Activation::Silu: return at::silu_backward(g, x);
      }
      TORCH_CHECK(false, "unknown activation");
    }
    case UnitKind::LayerNorm: {  // its parameter gradients go into the piece
      if (!g.defined()) return g;
      auto [gx, gw, gb] = at::native_layer_norm_backward(
          g.contiguous(), saved[0], {saved[0].size(-1)}, saved[1], saved[2], p[0], p[1],
          {true, p[0].has_value(), p[1].has_value()});
      piece = {gw, gb};
      return gx;
    }
    case UnitKind::CrossEntropy: {  // g: the gradient of the item's loss sum
      if (!g.defined()) return g;
      const Tensor &lsm = saved[0], &target = saved[1];
      const Tensor grad_lsm = at::nll_loss_backward(g, lsm, target.reshape({-1}), {},
                                                    at::Reduction::Sum, u.ignore_index, saved[2]);
      return at::_log_softmax_backward_data(grad_lsm, lsm, 1, lsm.scalar_type())
          .view({target.size(0), target.size(1), lsm.size(1)});
    }
  }
  TORCH_CHECK(false, "unknown unit kind");
}

void unit_weight_grads(const UnitSpec& u, const UnitParams& p, const Pieces& pieces,
                       std::vector<Tensor>& acc) {
  auto add = [&acc](size_t i, const Tensor& t) {
    if (!t.defined()) return;
    if (acc[i].defined()) {
      acc[i].add_(t);
    } else {
      acc[i] = t;
    }
  };
  switch (u.kind) {
    case UnitKind::Lstm: {
      // Per micro-batch, each run of consecutive chunks as one sequence:
      // pieces {x, h0, out, grad_gates, grad_h, raw_h}, rows time-major.
      for (const auto& row : pieces) {
        const int64_t K = static_cast<int64_t>(row.size());
        for (int64_t k = 0; k < K;) {
          if (row[k].empty()) {
            ++k;
            continue;
          }
          int64_t end = k;
          while (end < K && !row[end].empty()) ++end;
          auto joined = [&](size_t i) -> Tensor {
            if (!row[k][i].defined() || end - k == 1) return row[k][i];
            std::vector<Tensor> parts;
            for (int64_t j = k; j < end; ++j) parts.push_back(row[j][i]);
            return at::cat(parts, 0);
          };
          LayerDataGrads d;
          d.grad_gates = joined(3);
          d.grad_h = joined(4);
          d.raw_h = joined(5);
          const LayerWeightGrads w = lstm_layer_weight_grads(d, joined(0), row[k][1], joined(2));
          add(0, w.w_ih);
          add(1, w.w_hh);
          if (p[2].has_value()) add(2, w.bias);
          if (p[3].has_value()) add(3, p[2].has_value() ? w.bias.clone() : w.bias);
          if (p[4].has_value()) add(4, w.w_hr);
          k = end;
        }
      }
      return;
    }
    case UnitKind::Linear: {
      // Piece by piece into one sum (no copy of the output gradients, which
      // for a decoder are as large as its logits), in a fixed order.
      const Tensor& w = *p[0];
      for (const auto& row : pieces) {
        for (const auto& piece : row) {
          if (piece.empty()) continue;
          const Tensor x2 = piece[0].reshape({-1, w.size(1)}), g2 = piece[1].reshape({-1, w.size(0)});
          if (acc[0].defined()) {
            acc[0].addmm_(g2.t(), x2);
          } else {
            acc[0] = at::mm(g2.t(), x2);
          }
          if (p[1].has_value()) add(1, g2.sum(0));
        }
      }
      return;
    }
    case UnitKind::Embedding: {
      // All items at once: scale_grad_by_freq counts over the whole batch.
      std::vector<Tensor> indices, grads;
      for (const auto& row : pieces) {
        for (const auto& piece : row) {
          if (piece.empty()) continue;
          indices.push_back(piece[0].reshape({-1}));
          grads.push_back(piece[1].reshape({-1, piece[1].size(-1)}));
        }
      }
      if (indices.empty()) return;
      add(0, at::embedding_dense_backward(at::cat(grads, 0), at::cat(indices, 0), p[0]->size(0),
                                          u.padding_idx, u.scale_grad_by_freq));
      return;
    }
    case UnitKind::LayerNorm: {  // the items' sums, in a fixed order
      for (const auto& row : pieces) {
        for (const auto& piece : row) {
          if (piece.empty()) continue;
          if (p[0].has_value()) add(0, piece[0]);
          if (p[1].has_value()) add(1, piece[1]);
        }
      }
      return;
    }
    case UnitKind::Dropout:
    case UnitKind::Activation:
    case UnitKind::CrossEntropy: return;
  }
}

void keep_for_replay(const UnitSpec& u, std::vector<Tensor>& saved) {
  if (saved.empty()) return;
  switch (u.kind) {
    case UnitKind::Lstm: saved = {saved[1], saved[2]}; return;  // initial h, c
    case UnitKind::Dropout: return;                              // the mask
    case UnitKind::Embedding:
    case UnitKind::Linear:
    case UnitKind::Activation:
    case UnitKind::LayerNorm: saved.clear(); return;  // the input is recomputed
    case UnitKind::CrossEntropy: saved = {saved[1]}; return;  // the target
  }
}

void replay(const std::vector<UnitSpec>& units, const std::vector<UnitParams>& params,
            int64_t first_unit, bool training, SavedItem& item) {
  Tensor x = std::move(item.input);
  const int64_t n = static_cast<int64_t>(units.size());
  for (int64_t j = 0; j < n; ++j) {
    const UnitSpec& u = units[j];
    std::vector<Tensor>& saved = item.units[j];
    const bool last = j == n - 1;
    if (u.kind == UnitKind::Dropout) {
      if (!last && !saved.empty()) x = x * saved[0];
      continue;
    }
    if (u.kind == UnitKind::CrossEntropy) {
      Tensor h, c;
      const Tensor target = saved[0];
      unit_forward(u, {}, x, training, /*keep=*/true, h, c, saved, /*seed=*/0, target);
      break;
    }
    if (last && (u.kind == UnitKind::Linear || u.kind == UnitKind::Embedding)) {
      // its backward needs only its input
      saved = {x};
      break;
    }
    Tensor h, c;
    if (u.kind == UnitKind::Lstm) {
      h = saved[0];
      c = saved[1];
    }
    x = unit_forward(u, params[first_unit + j], x, training, /*keep=*/true, h, c, saved,
                     /*seed=*/0);  // dropout masks are replayed, never drawn here
  }
  item.recompute = false;
}

}  // namespace pipelstm::pipeline
