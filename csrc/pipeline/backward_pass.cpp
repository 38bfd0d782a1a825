// The backward pass (run_state.h): its plan (the output's gradient enters,
// the gradient of each LSTM layer's (h, c) carries over from chunk to chunk
// backwards, the input's gradient leaves) and what a stage computes per
// item (BackwardWork), then the parameter gradients as tasks.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <exception>
#include <memory>
#include <utility>

#include "carry.h"
#include "fault_hook.h"
#include "pass.h"
#include "profile_range.h"
#include "run_state.h"
#include "schedule.h"
#include "streams.h"
#include "units.h"
#include "weight_tasks.h"
#include "workers.h"

namespace pipelstm::pipeline {
namespace {

// What every stage's backward work shares.
struct BackwardShared {
  RunState& st;
  WeightTasks& weights;
  std::vector<Pieces>& pieces;            // per unit
  std::vector<std::vector<Tensor>>& acc;  // per unit, its parameter gradients
  const std::vector<OptTensor>& gh_parts;  // [layer * M + m]
  const std::vector<OptTensor>& gc_parts;
  std::vector<OptTensor>& gh0;  // [layer * M + m]
  std::vector<OptTensor>& gc0;
};

// Stage s's backward: each item's data gradients through its units in
// reverse (replaying a recomputed item's forward first), the gradient of
// each LSTM layer's state carried per micro-batch from one chunk to the
// one before; then the parameter gradients as tasks (weight_tasks.h).
class BackwardWork final : public StageWork {
 public:
  BackwardWork(BackwardShared& sh, int s, std::vector<TraceEvent>& trace)
      : sh_(sh), stages_(*sh.st.stages), stage_(stages_[s]), s_(s),
        first_unit_(stages_.first_unit(s)), n_units_(static_cast<int64_t>(stage_.units.size())),
        trace_(trace), grads_(stage_, sh.st.grid.M, sh.gh_parts, sh.gc_parts) {}

  Tensor run(Item it, Tensor g, int64_t& j) override {
    RunState& st = sh_.st;
    const int64_t m = it.m, k = it.k;
    const ItemGrid& grid = st.grid;
    const int64_t i = grid.index(it);
    SavedItem& item = st.saved[s_][i];
    // A packed item without rows leaves its units no weight gradient.
    const bool no_rows = grid.packed && grid.item_rows[i] == 0;
    if (item.recompute) {
      const int64_t tr = now_ns();
      const ProfileRange range({"recompute", s_, nullptr, -1, m, k});
      ItemContext context;
      if (grid.packed) {
        context.packed = true;
        context.batch_sizes = grid.item_batch_sizes[i];
      }
      replay(stage_.units, st.params, first_unit_, st.training, context, item);
      trace_.push_back({s_, "recompute", static_cast<int>(m), static_cast<int>(k), tr, now_ns()});
    }
    const int64_t t0 = now_ns();
    for (j = n_units_ - 1; j >= 0; --j) {
      const int64_t gu = first_unit_ + j;
      testing::check_fault(gu, Direction::Backward, it);
      const ProfileRange range({"backward", s_, &stage_.units[j], gu, m, k});
      g = unit_backward_data(stage_.units[j], st.params[gu], g, item.units[j], grads_.h(j, m),
                             grads_.c(j, m), sh_.pieces[gu][m][k]);
      if (no_rows) sh_.pieces[gu][m][k].clear();
      item.units[j].clear();  // free activations as soon as they are used
    }
    j = -1;
    trace_.push_back({s_, "backward", static_cast<int>(m), static_cast<int>(k), t0, now_ns()});
    if (ends_recurrence(Direction::Backward, it, st.grid.K)) grads_.store(m, sh_.gh0, sh_.gc0);
    return g;
  }

  // The previous process waits for every piece: zeros where no gradient
  // reached the input.
  Tensor for_remote(Item it, Tensor g) override {
    if (g.defined()) return g;
    const RunState& st = sh_.st;
    return at::zeros(st.grid.piece_sizes(st.input_sizes, it.m, it.k),
                     st.input_options.device(stage_.device));
  }

  // The parameter gradients, while the last sends are in flight.
  bool finish(Sync& sync) override {
    sh_.weights.mark_ready(sync, s_);
    for (;;) {
      const auto [owner, gu] = sh_.weights.claim(sync, s_);
      if (owner < 0) return true;
      const UnitSpec& unit = stages_.unit(gu);
      const int64_t t0 = now_ns();
      try {
        const ProfileRange range({"weights", s_, &unit, gu});
        unit_weight_grads(unit, sh_.st.params[gu], sh_.pieces[gu], sh_.acc[gu]);
        sh_.pieces[gu].clear();
      } catch (const std::exception& e) {
        sync.fail(describe_failure(stages_, owner, &unit, gu, "parameter gradients", -1, -1, e));
        return false;
      }
      trace_.push_back({s_, "weights", -1, -1, t0, now_ns()});
    }
  }

 private:
  BackwardShared& sh_;
  const Stages& stages_;
  const StageSpec& stage_;
  int s_;
  int64_t first_unit_, n_units_;
  std::vector<TraceEvent>& trace_;
  CarriedState<OptTensor> grads_;  // of the state carried from chunk k+1
};

// The gradient of the input [T, B, I] from its items' (zeros where no
// gradient reached an item), or nullopt where none reached any.
OptTensor gather_input_grad(const RunState& st, const std::vector<Tensor>& items) {
  bool any = false;
  at::ScalarType dtype = at::kFloat;
  for (const Tensor& t : items) {
    if (t.defined()) {
      any = true;
      dtype = t.scalar_type();
    }
  }
  if (!any) return std::nullopt;
  const ItemGrid& grid = st.grid;
  const c10::Device d0 = st.stages->device(0);
  std::vector<Tensor> pieces(items);
  for (int64_t m = 0; m < grid.M; ++m) {
    for (int64_t k = 0; k < grid.K; ++k) {
      Tensor& t = pieces[grid.index(m, k)];
      if (!t.defined()) {  // no gradient reached this piece
        t = at::zeros(grid.piece_sizes(st.input_sizes, m, k),
                      at::TensorOptions().device(d0).dtype(dtype));
      }
    }
  }
  return grid.assemble(pieces);
}

}  // namespace

BackwardResult backward_pass(RunState& st, const OptTensor& grad_output,
                             const std::vector<OptTensor>& grad_h_n,
                             const std::vector<OptTensor>& grad_c_n) {
  const Stages& stages = *st.stages;
  const ItemGrid& grid = st.grid;
  const int64_t S = stages.size(), K = grid.K, M = grid.M, L = stages.num_lstm_layers();
  const int64_t U = stages.num_units();

  PassPlan plan;
  // What enters: the gradient of the output's items (of a loss: each item's
  // sum gets the gradient of the mean or sum), or, from the next process,
  // those gradients (all receives posted ahead, in the order they are used).
  if (st.links.next) {
    plan.from = st.links.next.get();
    plan.receive_sizes = st.out_sizes;
    plan.receive_options = st.out_options;
  } else {
    Tensor g_out;
    if (grad_output.has_value() && grad_output->defined()) {
      g_out = to_device(*grad_output, stages.device(S - 1));
    }
    if (!g_out.defined()) {
      plan.enter.resize(grid.count());
    } else if (stages.loss()) {
      for (int64_t i = 0; i < grid.count(); ++i) plan.enter.push_back(g_out / st.loss_divisor);
    } else {
      plan.enter = grid.scatter(g_out);
    }
  }
  // What leaves: the input's gradient, or it goes to the previous process.
  if (st.links.prev) plan.to = st.links.prev.get();
  // What carries over: the gradient of each layer's state, from that of the
  // final state to that of the initial one.
  std::vector<c10::Device> layer_devices;
  for (int64_t l = 0; l < L; ++l) layer_devices.push_back(stages.layer_device(l));
  const std::vector<OptTensor> gh_parts = grid.scatter_rows(grad_h_n, layer_devices);
  const std::vector<OptTensor> gc_parts = grid.scatter_rows(grad_c_n, layer_devices);
  std::vector<OptTensor> gh0(L * M), gc0(L * M);
  // Parameter gradients per unit, from the pieces every item leaves, once
  // per unit after its stage's last item.
  std::vector<std::vector<Tensor>> acc(U);
  std::vector<Pieces> pieces(U);
  for (int64_t u = 0; u < U; ++u) {
    acc[u].resize(st.params[u].size());
    pieces[u].assign(M, std::vector<Piece>(K));
  }
  WeightTasks weights(stages, st.params);
  st.backward_done = true;
  BackwardShared shared{st, weights, pieces, acc, gh_parts, gc_parts, gh0, gc0};
  plan.work = [&](int s, std::vector<TraceEvent>& trace) {
    return std::make_unique<BackwardWork>(shared, s, trace);
  };
  PassResult done = run(Direction::Backward, stages, grid, plan);
  st.saved.clear();
  st.trace->set(std::move(done.trace), /*forward=*/false);

  at::AutoDispatchBelowADInplaceOrView below;
  c10::AutoGradMode no_grad(false);
  BackwardResult r;
  if (!st.index_input && !st.links.prev) r.grad_input = gather_input_grad(st, done.leave);
  r.grad_h0 = grid.gather_rows(gh0);
  r.grad_c0 = grid.gather_rows(gc0);
  for (auto& a : acc) {
    std::vector<OptTensor> g;
    for (auto& t : a) g.push_back(t.defined() ? OptTensor(t) : std::nullopt);
    r.grad_params.push_back(std::move(g));
  }
  st.params.clear();
  return r;
}

}  // namespace pipelstm::pipeline
