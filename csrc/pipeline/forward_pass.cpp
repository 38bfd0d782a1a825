// The forward pass (run_state.h): its plan (the input's items enter, each
// LSTM layer's (h, c) carries over from chunk to chunk, the output's items
// leave) and what a stage computes per item (ForwardWork).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <memory>
#include <unordered_set>
#include <utility>

#include "../layer_geometry.h"
#include "carry.h"
#include "fault_hook.h"
#include "pass.h"
#include "profile_range.h"
#include "run_state.h"
#include "schedule.h"
#include "streams.h"
#include "units.h"

namespace pipelstm::pipeline {
namespace {

// Bytes of the distinct storages in `items`.
int64_t storage_bytes(const std::vector<std::vector<SavedItem>>& items) {
  std::unordered_set<const void*> seen;
  int64_t total = 0;
  auto count = [&](const Tensor& t) {
    if (!t.defined() || !t.has_storage()) return;
    const void* key = t.storage().unsafeGetStorageImpl();
    if (seen.insert(key).second) total += static_cast<int64_t>(t.storage().nbytes());
  };
  for (const auto& stage : items) {
    for (const auto& item : stage) {
      count(item.input);
      for (const auto& unit : item.units) {
        for (const auto& t : unit) count(t);
      }
    }
  }
  return total;
}

// What every stage's forward work shares.
struct ForwardShared {
  RunState& st;
  const std::vector<Tensor>& targets;  // per item, with a loss
  uint64_t pass_seed;
  Checkpoint checkpoint;
  std::vector<Tensor>& h_final;  // [layer * M + m]
  std::vector<Tensor>& c_final;
};

// Stage s's forward: each item through its units, the hidden state of each
// LSTM layer carried per micro-batch from one chunk to the next.
class ForwardWork final : public StageWork {
 public:
  ForwardWork(ForwardShared& sh, int s, std::vector<TraceEvent>& trace)
      : sh_(sh), stage_((*sh.st.stages)[s]), s_(s), first_unit_(sh.st.stages->first_unit(s)),
        n_units_(static_cast<int64_t>(stage_.units.size())), trace_(trace),
        state_(stage_, sh.st.grid.M, sh.st.h0_parts, sh.st.c0_parts) {}

  Tensor run(Item it, Tensor x, int64_t& j) override {
    RunState& st = sh_.st;
    const ItemGrid& grid = st.grid;
    const int64_t m = it.m, t0 = now_ns();
    SavedItem& item = st.saved[s_][grid.index(it)];
    item.units.resize(n_units_);
    const int64_t i = grid.index(it);
    ItemContext context;
    context.target = sh_.targets[i];
    if (grid.packed) {
      context.packed = true;
      context.batch_sizes = grid.item_batch_sizes[i];
    }
    // an item without rows keeps nothing to replay
    item.recompute = st.kept && recomputes(sh_.checkpoint, it, grid.K, grid.M) &&
                     (!grid.packed || grid.item_rows[i] > 0);
    if (item.recompute) item.input = x;
    for (j = 0; j < n_units_; ++j) {
      const int64_t gu = first_unit_ + j;
      testing::check_fault(gu, Direction::Forward, it);
      const ProfileRange range({"forward", s_, &stage_.units[j], gu, m, it.k});
      const uint64_t seed = unit_seed(stage_.units[j], sh_.pass_seed, st.stages->model_unit(gu), m, it.k);
      x = unit_forward(stage_.units[j], st.params[gu], x, st.training, st.kept, state_.h(j, m),
                       state_.c(j, m), item.units[j], seed, context);
      if (item.recompute) keep_for_replay(stage_.units[j], item.units[j]);
    }
    j = -1;
    trace_.push_back({s_, "forward", static_cast<int>(m), static_cast<int>(it.k), t0, now_ns()});
    if (ends_recurrence(Direction::Forward, it, grid.K)) state_.store(m, sh_.h_final, sh_.c_final);
    return x;
  }

  // The next process receives into buffers of this shape for the gradients.
  Tensor for_remote(Item it, Tensor x) override {
    sh_.st.out_sizes[sh_.st.grid.index(it)] = x.sizes().vec();
    if (it.m == 0 && it.k == 0) sh_.st.out_options = x.options();
    return x;
  }

 private:
  ForwardShared& sh_;
  const StageSpec& stage_;
  int s_;
  int64_t first_unit_, n_units_;
  std::vector<TraceEvent>& trace_;
  CarriedState<Tensor> state_;
};

// The loss's targets, per item, on the last stage's device; sets the divisor
// of a mean loss (the counted targets).
std::vector<Tensor> scatter_targets(RunState& st, const OptTensor& target) {
  const Stages& stages = *st.stages;
  const UnitSpec* loss = stages.loss();
  const ItemGrid& grid = st.grid;
  TORCH_CHECK(target.has_value() == (loss != nullptr),
              loss ? "pipelstm.Pipeline: this pipeline ends in a loss; pass the targets"
                   : "pipelstm.Pipeline: targets given, but this pipeline has no loss");
  if (!loss) return std::vector<Tensor>(grid.count());
  TORCH_CHECK(!st.links.next, "pipelstm.Pipeline: the loss must be on the last process's last stage");
  if (grid.packed) {
    const int64_t N = st.input_sizes[0];
    TORCH_CHECK(target->dim() == 1 && target->size(0) == N,
                "pipelstm.Pipeline: expected packed target of shape [", N,
                "] (one per token of the packed input), got ", target->sizes());
  } else {
    const int64_t T = st.input_sizes[0], B = st.input_sizes[1];
    TORCH_CHECK(target->dim() == 2 && target->size(0) == T && target->size(1) == B,
                "pipelstm.Pipeline: expected target of shape [", T, ", ", B,
                "] (the input's time and batch sizes), got ", target->sizes());
  }
  TORCH_CHECK(target->scalar_type() == at::kLong,
              "pipelstm.Pipeline: expected target of dtype torch.int64 (class indices), got ",
              target->scalar_type());
  const Tensor t = to_device(*target, stages.device(stages.size() - 1));
  if (loss->mean) st.loss_divisor = static_cast<double>(t.ne(loss->ignore_index).sum().item<int64_t>());
  return grid.scatter(t);
}

// Each LSTM layer's initial state per micro-batch, on its device: given, or
// zeros of the layer's widths and dtype.
void scatter_initial_states(RunState& st, const std::vector<OptTensor>& h0,
                            const std::vector<OptTensor>& c0) {
  const Stages& stages = *st.stages;
  const ItemGrid& grid = st.grid;
  const int64_t L = stages.num_lstm_layers(), M = grid.M;
  std::vector<c10::Device> devices;
  for (int64_t l = 0; l < L; ++l) devices.push_back(stages.layer_device(l));
  const auto h_given = grid.scatter_rows(h0, devices), c_given = grid.scatter_rows(c0, devices);
  st.h0_parts.resize(L * M);
  st.c0_parts.resize(L * M);
  for (int64_t gu = 0; gu < stages.num_units(); ++gu) {
    const UnitSpec& u = stages.unit(gu);
    if (!unit_kind_has_state(u.kind)) continue;
    const int64_t l = u.state_index;
    const UnitParams& p = st.params[gu];
    const Tensor& w_ih = need(p[0], u, "w_ih");
    const LayerGeometry g = LayerGeometry::of(w_ih, need(p[1], u, "w_hh"), p[4]);
    for (int64_t m = 0; m < M; ++m) {
      auto part = [&](const OptTensor& given, int64_t width) {
        if (given.has_value()) return *given;
        return at::zeros({grid.b_sizes[m], width}, w_ih.options().device(devices[l]));
      };
      st.h0_parts[l * M + m] = part(h_given[l * M + m], g.out);
      st.c0_parts[l * M + m] = part(c_given[l * M + m], g.hidden);
    }
  }
}

}  // namespace

void forward_pass(RunState& st, const Tensor& input, const std::vector<OptTensor>& h0,
                  const std::vector<OptTensor>& c0, const OptTensor& target,
                  Checkpoint checkpoint) {
  const Stages& stages = *st.stages;
  const ItemGrid& grid = st.grid;
  const int64_t S = stages.size(), L = stages.num_lstm_layers(), M = grid.M;
  const std::vector<Tensor> targets = scatter_targets(st, target);
  st.saved.assign(S, std::vector<SavedItem>(grid.count()));
  scatter_initial_states(st, h0, c0);

  PassPlan plan;
  // What enters: the input's items, or, from a previous process, its
  // activations (`input` then only gives the shape and dtype, e.g. a meta
  // tensor).
  if (st.links.prev) {
    TORCH_CHECK(at::isFloatingType(input.scalar_type()),
                "pipelstm.Pipeline: activations from another process must be floating point");
    plan.from = st.links.prev.get();
    plan.receive_sizes = grid.scatter_sizes(input.sizes().vec());
    plan.receive_options = input.options().device(stages.device(0));
  } else {
    plan.enter = grid.scatter(to_device(input, stages.device(0)));
  }
  // What leaves: the output's items, or they go to the next process.
  if (st.links.next) {
    plan.to = st.links.next.get();
    st.out_sizes.resize(grid.count());
  }
  const uint64_t pass_seed = !st.training ? 0 : st.pass_seed ? *st.pass_seed : draw_pass_seed();
  // What carries over: each layer's (h, c), from h0_parts to the final states.
  std::vector<Tensor> h_final(L * M), c_final(L * M);
  ForwardShared shared{st, targets, pass_seed, checkpoint, h_final, c_final};
  plan.work = [&](int s, std::vector<TraceEvent>& trace) {
    return std::make_unique<ForwardWork>(shared, s, trace);
  };
  PassResult done = run(Direction::Forward, stages, grid, plan);
  st.trace->set(std::move(done.trace), /*forward=*/true);

  // Gather: time chunks along dim 0, then micro-batches along dim 1 (with a
  // next process, which has the output, an empty placeholder).
  {
    at::AutoDispatchBelowADInplaceOrView below;
    c10::AutoGradMode no_grad(false);
    const std::vector<Tensor>& items = done.leave;
    if (st.links.next) {
      st.output = at::empty({0}, st.out_options);
    } else if (stages.loss()) {  // the items' loss sums, in a fixed order
      Tensor total = items[0].clone();
      for (size_t i = 1; i < items.size(); ++i) total.add_(items[i]);
      st.output = total.div_(st.loss_divisor);
    } else {
      st.output = grid.assemble(items);
    }
    for (auto& h : grid.gather_rows(h_final)) st.h_n.push_back(*h);
    for (auto& c : grid.gather_rows(c_final)) st.c_n.push_back(*c);
  }
  if (st.kept) {
    st.saved_bytes = storage_bytes(st.saved);
  } else {
    st.saved.clear();
    st.params.clear();
  }
}

}  // namespace pipelstm::pipeline
