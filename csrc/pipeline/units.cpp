// Units of a pipeline stage (see units.h).
#include "units.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "units/kinds.h"

namespace pipelstm::pipeline {
namespace {

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

const UnitKindOps& ops(UnitKind kind) {
  const auto& kinds = unit_kinds();
  const auto i = static_cast<size_t>(kind);
  TORCH_CHECK(i < kinds.size(), "unknown unit kind ", i);
  return *kinds[i];
}

// The records in the order they registered (the link order of their
// files): a function's static, so it exists before the first
// registration, whichever file's initialisers run first.
std::vector<const UnitKindOps*>& registered() {
  static std::vector<const UnitKindOps*> records;
  return records;
}

}  // namespace

RegisterUnitKind::RegisterUnitKind(UnitKindOps ops) : record(std::move(ops)) {
  registered().push_back(&record);
}

const std::vector<const UnitKindOps*>& unit_kinds() {
  // Ordered by name, so that a kind's index does not hang on the link order.
  static const std::vector<const UnitKindOps*> table = [] {
    std::vector<const UnitKindOps*> t = registered();
    std::sort(t.begin(), t.end(), [](const UnitKindOps* a, const UnitKindOps* b) {
      return std::string_view(a->py_name) < std::string_view(b->py_name);
    });
    for (size_t i = 1; i < t.size(); ++i) {
      if (std::string_view(t[i - 1]->py_name) == t[i]->py_name) {
        throw std::logic_error(std::string("pipelstm: two unit kinds are named ") + t[i]->py_name);
      }
    }
    return t;
  }();
  return table;
}

void accumulate(std::vector<Tensor>& acc, size_t i, const Tensor& t) {
  if (!t.defined()) return;
  if (acc[i].defined()) {
    acc[i].add_(t);
  } else {
    acc[i] = t;
  }
}

void recompute_input_for_replay(std::vector<Tensor>& saved) { saved.clear(); }

const char* unit_kind_name(UnitKind kind) { return ops(kind).name; }
bool unit_kind_has_state(UnitKind kind) { return ops(kind).has_state; }
bool unit_kind_is_loss(UnitKind kind) { return ops(kind).is_loss; }

const Tensor& need(const OptTensor& t, const UnitSpec& u, const char* what) {
  TORCH_CHECK(t.has_value() && t->defined(), "missing parameter ", what, " of unit '", u.name, "'");
  return *t;
}

uint64_t dropout_seed(uint64_t pass_seed, int64_t unit, int64_t m, int64_t k) {
  return splitmix64(splitmix64(splitmix64(pass_seed ^ static_cast<uint64_t>(unit)) ^
                               static_cast<uint64_t>(m)) ^
                    static_cast<uint64_t>(k));
}

uint64_t unit_seed(const UnitSpec& u, uint64_t pass_seed, int64_t unit, int64_t m, int64_t k) {
  return dropout_seed(pass_seed, unit, m, ops(u.kind).seed_per_micro_batch ? -1 : k);
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

uint64_t draw_pass_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

Tensor unit_forward(const UnitSpec& u, const UnitParams& p, const Tensor& x, bool training,
                    bool keep, Tensor& h, Tensor& c, std::vector<Tensor>& saved, uint64_t seed,
                    const ItemContext& item) {
  return ops(u.kind).forward(u, p, x, training, keep, h, c, saved, seed, item);
}

Tensor unit_backward_data(const UnitSpec& u, const UnitParams& p, const Tensor& g,
                          const std::vector<Tensor>& saved, OptTensor& grad_h, OptTensor& grad_c,
                          Piece& piece) {
  return ops(u.kind).backward_data(u, p, g, saved, grad_h, grad_c, piece);
}

void unit_weight_grads(const UnitSpec& u, const UnitParams& p, const Pieces& pieces,
                       std::vector<Tensor>& acc) {
  const auto& kind = ops(u.kind);
  if (kind.weight_grads != nullptr) kind.weight_grads(u, p, pieces, acc);
}

void keep_for_replay(const UnitSpec& u, std::vector<Tensor>& saved) {
  if (!saved.empty()) ops(u.kind).keep_for_replay(saved);
}

void replay(const std::vector<UnitSpec>& units, const std::vector<UnitParams>& params,
            int64_t first_unit, bool training, const ItemContext& context, SavedItem& item) {
  Tensor x = std::move(item.input);
  const int64_t n = static_cast<int64_t>(units.size());
  for (int64_t j = 0; j < n; ++j) {
    const UnitSpec& u = units[j];
    std::vector<Tensor>& saved = item.units[j];
    const bool last = j == n - 1;
    const UnitKindOps& kind = ops(u.kind);
    if (kind.replay == Replay::Mask) {
      if (!last && !saved.empty()) x = x * saved[0];
      continue;
    }
    if (kind.is_loss) {
      Tensor h, c;
      ItemContext with_target = context;
      with_target.target = saved[0];
      unit_forward(u, {}, x, training, /*keep=*/true, h, c, saved, /*seed=*/0, with_target);
      break;
    }
    if (last && kind.replay == Replay::InputIfLast) {
      // its backward needs only its input
      saved = {x};
      break;
    }
    Tensor h, c;
    if (kind.has_state) {
      h = saved[0];
      c = saved[1];
    }
    ItemContext again = context;
    again.replaying = true;  // masks are replayed, never drawn here
    x = unit_forward(u, params[first_unit + j], x, training, /*keep=*/true, h, c, saved,
                     /*seed=*/0, again);
  }
  item.recompute = false;
}

}  // namespace pipelstm::pipeline
