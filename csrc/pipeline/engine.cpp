// The pipeline engine (see engine.h and docs/pipeline.md): a forward pass
// and its backward, each one run_pass (pass.h) over the stages in the
// schedule's order (schedule.h). This file holds what each pass computes
// per item (ForwardWork, BackwardWork) and what it sets up before and
// assembles after.
#include "engine.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <memory>
#include <sstream>
#include <unordered_set>
#include <utility>

#include "../layer_geometry.h"
#include "items.h"
#include "pass.h"
#include "schedule.h"
#include "streams.h"
#include "units.h"
#include "profile_range.h"
#include "weight_tasks.h"
#include "workers.h"

namespace pipelstm::pipeline {

// Everything one forward pass keeps for its backward.
struct RunState {
  std::shared_ptr<Engine> engine;
  ItemGrid grid;
  bool training = false;
  bool index_input = false;
  double loss_divisor = 1.0;  // the counted targets, for a mean loss
  c10::Device input_device{c10::kCPU};
  std::vector<int64_t> input_sizes;
  at::TensorOptions input_options;
  std::vector<UnitParams> params;
  // saved[s][grid.index(m, k)]: what stage s kept of item (m, k).
  std::vector<std::vector<SavedItem>> saved;
  int64_t saved_bytes = 0;
  std::vector<OptTensor> h0_given, c0_given;  // to shape the gradients
  std::vector<Tensor> h0_parts, c0_parts;     // [layer * M + m]
  Tensor output;                 // until Run::take_outputs
  std::vector<Tensor> h_n, c_n;  // per LSTM layer, until Run::take_outputs
  bool outputs_taken = false;
  // With a next process: the shape and options of each item's output (the
  // gradients that come back have them).
  std::vector<std::vector<int64_t>> out_sizes;
  at::TensorOptions out_options;
  bool kept = false;
  bool backward_done = false;
};

Engine::Engine(std::vector<StageSpec> stages) : stages_(std::move(stages)) {
  TORCH_CHECK(!stages_.empty(), "pipelstm.Pipeline: at least one stage is needed");
  for (const auto& st : stages_) {
    TORCH_CHECK(!st.units.empty(), "pipelstm.Pipeline: every stage needs at least one unit");
    first_unit_.push_back(num_units_);
    for (const auto& u : st.units) {
      TORCH_CHECK(loss_ == nullptr, "pipelstm.Pipeline: the loss must be the last unit");
      if (u.kind == UnitKind::CrossEntropy) loss_ = &u;
      ++num_units_;
      if (u.kind == UnitKind::Lstm) {
        TORCH_CHECK(u.state_index == num_lstm_,
                    "pipelstm.Pipeline: LSTM layers must be numbered in order");
        ++num_lstm_;
      }
    }
  }
}

void Engine::connect(const std::optional<RemoteSpec>& prev, const std::optional<RemoteSpec>& next,
                     double timeout_s, int64_t first_stage, const std::string& process) {
  TORCH_CHECK(timeout_s > 0, "pipelstm: timeout must be positive, got ", timeout_s);
  first_stage_ = first_stage;
  process_ = process;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
  prev_ = prev ? std::make_shared<RemoteLink>(*prev, timeout) : nullptr;
  next_ = next ? std::make_shared<RemoteLink>(*next, timeout) : nullptr;
}

std::string Engine::stage_label(int64_t s) const {
  std::ostringstream os;
  os << "stage " << first_stage_ + s << " (" << stages_[s].device;
  if (!process_.empty()) os << ", " << process_;
  os << ")";
  return os.str();
}

std::vector<TraceEvent> Engine::trace() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<TraceEvent> all = forward_trace_;
  all.insert(all.end(), backward_trace_.begin(), backward_trace_.end());
  return all;
}

void Engine::set_trace(std::vector<TraceEvent> events, bool forward) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (forward) {
    forward_trace_ = std::move(events);
    backward_trace_.clear();
  } else {
    backward_trace_ = std::move(events);
  }
}

void Engine::inject_fault(int64_t unit, const std::string& phase, int64_t m, int64_t k) {
  TORCH_CHECK(phase == "forward" || phase == "backward", "phase must be forward or backward");
  std::lock_guard<std::mutex> lock(mutex_);
  faults_.push_back({unit, phase, m, k});
}

void Engine::clear_faults() {
  std::lock_guard<std::mutex> lock(mutex_);
  faults_.clear();
}

std::vector<Engine::Fault> Engine::faults() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return faults_;
}

namespace {

void check_fault(const std::vector<Engine::Fault>& faults, int64_t unit, const char* phase,
                 int64_t m, int64_t k) {
  for (const auto& f : faults) {
    TORCH_CHECK(!(f.unit == unit && f.phase == phase && f.m == m && f.k == k),
                "injected fault (testing)");
  }
}

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

// The recurrent state a stage carries from chunk to chunk, per (unit,
// micro-batch): (h, c) forward, their gradients backward. Only its LSTM
// units have any; the per-layer vectors are indexed [layer * M + m].
template <typename T>
class CarriedState {
 public:
  CarriedState(const StageSpec& stage, int64_t M, const std::vector<T>& h_by_layer,
               const std::vector<T>& c_by_layer)
      : stage_(stage), M_(M), h_(stage.units.size() * M), c_(stage.units.size() * M) {
    for_each_layer([&](int64_t j, int64_t l) {
      for (int64_t m = 0; m < M_; ++m) {
        h_[j * M_ + m] = h_by_layer[l * M_ + m];
        c_[j * M_ + m] = c_by_layer[l * M_ + m];
      }
    });
  }

  T& h(int64_t j, int64_t m) { return h_[j * M_ + m]; }
  T& c(int64_t j, int64_t m) { return c_[j * M_ + m]; }

  // Micro-batch m's state of every LSTM unit, into the per-layer vectors.
  void store(int64_t m, std::vector<T>& h_by_layer, std::vector<T>& c_by_layer) const {
    for_each_layer([&](int64_t j, int64_t l) {
      h_by_layer[l * M_ + m] = h_[j * M_ + m];
      c_by_layer[l * M_ + m] = c_[j * M_ + m];
    });
  }

 private:
  template <typename F>
  void for_each_layer(F f) const {
    for (size_t j = 0; j < stage_.units.size(); ++j) {
      const UnitSpec& u = stage_.units[j];
      if (u.kind == UnitKind::Lstm) f(static_cast<int64_t>(j), u.state_index);
    }
  }

  const StageSpec& stage_;
  int64_t M_;
  std::vector<T> h_, c_;
};

// Stage s's forward: each item through its units, the hidden state of each
// LSTM layer carried per micro-batch from one chunk to the next.
class ForwardWork final : public StageWork {
 public:
  struct Shared {
    RunState& st;
    const std::vector<Engine::Fault>& faults;
    const std::vector<Tensor>& targets;  // per item, with a loss
    uint64_t pass_seed;
    bool keep;
    Checkpoint checkpoint;
    std::vector<Tensor>& h_final;  // [layer * M + m]
    std::vector<Tensor>& c_final;
  };

  ForwardWork(const Engine& engine, Shared& sh, int s, std::vector<TraceEvent>& trace)
      : sh_(sh), stage_(engine.stages()[s]), s_(s), first_unit_(engine.first_unit(s)),
        n_units_(static_cast<int64_t>(stage_.units.size())), trace_(trace),
        state_(stage_, sh.st.grid.M, sh.st.h0_parts, sh.st.c0_parts) {}

  Tensor run(Item it, Tensor x, int64_t& j) override {
    RunState& st = sh_.st;
    const ItemGrid& grid = st.grid;
    const int64_t m = it.m, t0 = now_ns();
    SavedItem& item = st.saved[s_][grid.index(it)];
    item.units.resize(n_units_);
    item.recompute = sh_.keep && recomputes(sh_.checkpoint, it, grid.K, grid.M);
    if (item.recompute) item.input = x;
    for (j = 0; j < n_units_; ++j) {
      const int64_t gu = first_unit_ + j;
      check_fault(sh_.faults, gu, "forward", m, it.k);
      const ProfileRange range({"forward", s_, &stage_.units[j], gu, m, it.k});
      x = unit_forward(stage_.units[j], st.params[gu], x, st.training, sh_.keep, state_.h(j, m),
                       state_.c(j, m), item.units[j], dropout_seed(sh_.pass_seed, gu, m, it.k),
                       sh_.targets[grid.index(it)]);
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
  Shared& sh_;
  const StageSpec& stage_;
  int s_;
  int64_t first_unit_, n_units_;
  std::vector<TraceEvent>& trace_;
  CarriedState<Tensor> state_;
};

// Stage s's backward: each item's data gradients through its units in
// reverse (replaying a recomputed item's forward first), the gradient of
// each LSTM layer's state carried per micro-batch from one chunk to the
// one before; then the parameter gradients as tasks (weight_tasks.h).
class BackwardWork final : public StageWork {
 public:
  struct Shared {
    RunState& st;
    const std::vector<Engine::Fault>& faults;
    Sync& sync;
    WeightTasks& weights;
    std::vector<Pieces>& pieces;                  // per unit
    std::vector<std::vector<Tensor>>& acc;        // per unit, its parameter gradients
    const std::vector<const UnitSpec*>& unit_at;  // per global unit
    const std::vector<OptTensor>& gh_parts;       // [layer * M + m]
    const std::vector<OptTensor>& gc_parts;
    std::vector<OptTensor>& gh0;                  // [layer * M + m]
    std::vector<OptTensor>& gc0;
  };

  BackwardWork(const Engine& engine, Shared& sh, int s, std::vector<TraceEvent>& trace)
      : engine_(engine), sh_(sh), stage_(engine.stages()[s]), s_(s),
        first_unit_(engine.first_unit(s)), n_units_(static_cast<int64_t>(stage_.units.size())),
        trace_(trace), grads_(stage_, sh.st.grid.M, sh.gh_parts, sh.gc_parts) {}

  Tensor run(Item it, Tensor g, int64_t& j) override {
    RunState& st = sh_.st;
    const int64_t m = it.m, k = it.k;
    SavedItem& item = st.saved[s_][st.grid.index(it)];
    if (item.recompute) {
      const int64_t tr = now_ns();
      const ProfileRange range({"recompute", s_, nullptr, -1, m, k});
      replay(stage_.units, st.params, first_unit_, st.training, item);
      trace_.push_back({s_, "recompute", static_cast<int>(m), static_cast<int>(k), tr, now_ns()});
    }
    const int64_t t0 = now_ns();
    for (j = n_units_ - 1; j >= 0; --j) {
      const int64_t gu = first_unit_ + j;
      check_fault(sh_.faults, gu, "backward", m, k);
      const ProfileRange range({"backward", s_, &stage_.units[j], gu, m, k});
      g = unit_backward_data(stage_.units[j], st.params[gu], g, item.units[j], grads_.h(j, m),
                             grads_.c(j, m), sh_.pieces[gu][m][k]);
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
  bool finish() override {
    sh_.weights.mark_ready(sh_.sync, s_);
    for (;;) {
      const auto [owner, gu] = sh_.weights.claim(sh_.sync, s_);
      if (owner < 0) return true;
      const UnitSpec& unit = *sh_.unit_at[gu];
      const int64_t t0 = now_ns();
      try {
        const ProfileRange range({"weights", s_, &unit, gu});
        unit_weight_grads(unit, sh_.st.params[gu], sh_.pieces[gu], sh_.acc[gu]);
        sh_.pieces[gu].clear();
      } catch (const std::exception& e) {
        sh_.sync.fail(describe_failure(engine_, owner, &unit, gu, "parameter gradients", -1, -1, e));
        return false;
      }
      trace_.push_back({s_, "weights", -1, -1, t0, now_ns()});
    }
  }

 private:
  const Engine& engine_;
  Shared& sh_;
  const StageSpec& stage_;
  int s_;
  int64_t first_unit_, n_units_;
  std::vector<TraceEvent>& trace_;
  CarriedState<OptTensor> grads_;  // of the state carried from chunk k+1
};

std::vector<RemoteLink*> links_of(const Engine& engine) {
  std::vector<RemoteLink*> links;
  for (const auto* link : {&engine.prev_link(), &engine.next_link()}) {
    if (*link) links.push_back(link->get());
  }
  return links;
}

}  // namespace

std::shared_ptr<Run> Engine::forward(const Tensor& input, const std::vector<OptTensor>& h0,
                                     const std::vector<OptTensor>& c0,
                                     const std::vector<UnitParams>& params, int64_t chunks,
                                     int64_t micro_batches, bool training,
                                     bool keep_for_backward, Checkpoint checkpoint,
                                     const OptTensor& target) {
  const int64_t S = static_cast<int64_t>(stages_.size());
  TORCH_CHECK(static_cast<int64_t>(params.size()) == num_units_, "pipelstm.Pipeline: expected ",
              num_units_, " parameter lists, got ", params.size());
  TORCH_CHECK(static_cast<int64_t>(h0.size()) == num_lstm_ &&
                  static_cast<int64_t>(c0.size()) == num_lstm_,
              "pipelstm.Pipeline: expected an initial state for each of the ", num_lstm_,
              " LSTM layers");
  TORCH_CHECK(input.dim() >= 2, "pipelstm.Pipeline: expected input of shape [T, B, ...], got ",
              input.sizes());
  TORCH_CHECK(chunks > 0 && micro_batches > 0,
              "pipelstm.Pipeline: chunks and micro_batches must be positive");
  const int64_t T = input.size(0), B = input.size(1);
  TORCH_CHECK(T > 0 && B > 0, "pipelstm.Pipeline: expected a non-empty input, got ",
              input.sizes());

  auto st = std::make_shared<RunState>();
  st->engine = shared_from_this();
  st->grid = ItemGrid(T, B, chunks, micro_batches);
  const ItemGrid& grid = st->grid;
  const int64_t M = grid.M;
  st->training = training;
  st->kept = keep_for_backward;
  st->index_input = !at::isFloatingType(input.scalar_type());
  st->input_device = input.device();
  st->input_sizes = input.sizes().vec();
  st->input_options = input.options();
  // The loss's targets, per item, on the last stage's device.
  std::vector<Tensor> targets(grid.count());
  TORCH_CHECK(target.has_value() == (loss_ != nullptr),
              loss_ ? "pipelstm.Pipeline: this pipeline ends in a loss; pass the targets"
                    : "pipelstm.Pipeline: targets given, but this pipeline has no loss");
  if (loss_) {
    TORCH_CHECK(!next_, "pipelstm.Pipeline: the loss must be on the last process's last stage");
    TORCH_CHECK(target->dim() == 2 && target->size(0) == T && target->size(1) == B,
                "pipelstm.Pipeline: expected target of shape [", T, ", ", B,
                "] (the input's time and batch sizes), got ", target->sizes());
    TORCH_CHECK(target->scalar_type() == at::kLong,
                "pipelstm.Pipeline: expected target of dtype torch.int64 (class indices), got ",
                target->scalar_type());
    const Tensor t = to_device(*target, stages_.back().device);
    if (loss_->mean) st->loss_divisor = static_cast<double>(t.ne(loss_->ignore_index).sum().item<int64_t>());
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < grid.K; ++k) targets[grid.index(m, k)] = grid.piece(t, m, k);
    }
  }
  st->params = params;
  st->h0_given = h0;
  st->c0_given = c0;
  st->saved.assign(S, std::vector<SavedItem>(grid.count()));

  // Initial states, split by micro-batch, on the device of their layer.
  st->h0_parts.resize(num_lstm_ * M);
  st->c0_parts.resize(num_lstm_ * M);
  for (int64_t s = 0; s < S; ++s) {
    const StageSpec& stage = stages_[s];
    for (size_t j = 0; j < stage.units.size(); ++j) {
      const UnitSpec& u = stage.units[j];
      if (u.kind != UnitKind::Lstm) continue;
      const int64_t l = u.state_index;
      const UnitParams& p = params[first_unit_[s] + static_cast<int64_t>(j)];
      const Tensor& w_ih = need(p[0], u, "w_ih");
      const LayerGeometry g = LayerGeometry::of(w_ih, need(p[1], u, "w_hh"), p[4]);
      for (int64_t m = 0; m < M; ++m) {
        auto part = [&](const OptTensor& given, int64_t width) {
          if (given.has_value()) return to_device(grid.rows(*given, m), stage.device).contiguous();
          return at::zeros({grid.b_sizes[m], width}, w_ih.options().device(stage.device));
        };
        st->h0_parts[l * M + m] = part(h0[l], g.out);
        st->c0_parts[l * M + m] = part(c0[l], g.hidden);
      }
    }
  }

  PassIO io(Direction::Forward, S, grid);
  // The input: local, or received from the previous process (`input` then
  // only gives the shape and dtype, e.g. a meta tensor), all receives
  // posted ahead.
  if (prev_) {
    TORCH_CHECK(at::isFloatingType(input.scalar_type()),
                "pipelstm.Pipeline: activations from another process must be floating point");
    std::vector<std::vector<int64_t>> sizes(grid.count());
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < grid.K; ++k) {
        sizes[grid.index(m, k)] = grid.piece_sizes(input.sizes().vec(), m, k);
      }
    }
    io.from = prev_.get();
    io.post_receives(grid, sizes, input.options().device(stages_[0].device));
  } else {
    const Tensor x_in = to_device(input, stages_[0].device);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < grid.K; ++k) {
        Slot& slot = io.entry()[grid.index(m, k)];
        slot.value = grid.piece(x_in, m, k);
        slot.ready = true;
      }
    }
  }
  if (next_) {
    io.to = next_.get();
    st->out_sizes.resize(grid.count());
  }
  // One draw from the default generator per pass (so torch.manual_seed
  // governs the dropout masks), whatever the units.
  uint64_t pass_seed = 0;
  if (training) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    pass_seed = gen.get<at::CPUGeneratorImpl>()->random64();
  }
  std::vector<Tensor> h_final(num_lstm_ * M), c_final(num_lstm_ * M);
  const auto faults = this->faults();
  ForwardWork::Shared shared{*st, faults, targets, pass_seed, keep_for_backward, checkpoint,
                             h_final, c_final};
  Sync sync(links_of(*this));
  run_pass(*this, sync, io, grid, [&](int s) {
    return std::make_unique<ForwardWork>(*this, shared, s, io.traces[s]);
  });
  set_trace(io.all_traces(), /*forward=*/true);

  // Assemble: time chunks along dim 0, then micro-batches along dim 1 (with
  // a next process, which has the output, an empty placeholder).
  std::vector<Tensor> items;  // the outputs of items (m, k) at grid.index(m, k)
  if (!next_) {
    for (Slot& slot : io.exit()) {
      acquire(slot);
      items.push_back(slot.value);
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView below;
    c10::AutoGradMode no_grad(false);
    if (next_) {
      st->output = at::empty({0}, st->out_options);
    } else if (loss_) {  // the items' loss sums, in a fixed order
      Tensor total = items[0].clone();
      for (size_t i = 1; i < items.size(); ++i) total.add_(items[i]);
      st->output = total.div_(st->loss_divisor);
    } else {
      st->output = grid.assemble(items);
    }
    for (int64_t l = 0; l < num_lstm_; ++l) {
      st->h_n.push_back(grid.join_rows({h_final.begin() + l * M, h_final.begin() + (l + 1) * M}));
      st->c_n.push_back(grid.join_rows({c_final.begin() + l * M, c_final.begin() + (l + 1) * M}));
    }
  }
  if (keep_for_backward) {
    st->saved_bytes = storage_bytes(st->saved);
  } else {
    st->saved.clear();
    st->params.clear();
  }
  return std::make_shared<Run>(st);
}

RunOutputs Run::take_outputs() {
  RunState& st = *state_;
  TORCH_CHECK(!st.outputs_taken, "pipelstm.Pipeline: the outputs of a pass are handed over once");
  st.outputs_taken = true;
  return RunOutputs{std::move(st.output), std::move(st.h_n), std::move(st.c_n)};
}
int64_t Run::saved_bytes() const { return state_->saved_bytes; }

BackwardResult Run::backward(const OptTensor& grad_output, const std::vector<OptTensor>& grad_h_n,
                             const std::vector<OptTensor>& grad_c_n) {
  RunState& st = *state_;
  TORCH_CHECK(st.kept, "pipelstm.Pipeline: this forward pass kept nothing for backward");
  TORCH_CHECK(!st.backward_done,
              "pipelstm.Pipeline: backward through the same pipelined forward twice is not "
              "supported (its saved activations are freed after the first backward)");
  Engine& engine = *st.engine;
  const auto& stages = engine.stages();
  const ItemGrid& grid = st.grid;
  const int64_t S = static_cast<int64_t>(stages.size()), K = grid.K, M = grid.M;
  const int64_t L = engine.num_lstm_layers();
  TORCH_CHECK(static_cast<int64_t>(grad_h_n.size()) == L &&
                  static_cast<int64_t>(grad_c_n.size()) == L,
              "pipelstm.Pipeline: expected a (possibly None) gradient for each LSTM layer's state");

  // Per LSTM layer and micro-batch: the gradient of the final state.
  std::vector<OptTensor> gh_parts(L * M), gc_parts(L * M);
  std::vector<c10::Device> layer_device(L, c10::Device(c10::kCPU));
  for (const auto& stage : stages) {
    for (const auto& u : stage.units) {
      if (u.kind == UnitKind::Lstm) layer_device[u.state_index] = stage.device;
    }
  }
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t m = 0; m < M; ++m) {
      if (grad_h_n[l].has_value() && grad_h_n[l]->defined()) {
        gh_parts[l * M + m] = to_device(grid.rows(*grad_h_n[l], m), layer_device[l]);
      }
      if (grad_c_n[l].has_value() && grad_c_n[l]->defined()) {
        gc_parts[l * M + m] = to_device(grid.rows(*grad_c_n[l], m), layer_device[l]);
      }
    }
  }

  PassIO io(Direction::Backward, S, grid);
  // The gradient of the output: given, or received from the next process
  // (all receives posted ahead, in the order they are used).
  const auto& next = engine.next_link();
  const auto& prev = engine.prev_link();
  if (next) {
    io.from = next.get();
    io.post_receives(grid, st.out_sizes, st.out_options);
  } else {
    Tensor g_out;
    if (grad_output.has_value() && grad_output->defined()) g_out = to_device(*grad_output, stages.back().device);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) {
        Slot& slot = io.entry()[grid.index(m, k)];
        if (g_out.defined()) {
          // A loss: each item's sum gets the gradient of the mean or sum.
          slot.value = engine.loss() ? g_out / st.loss_divisor : grid.piece(g_out, m, k);
        }
        slot.ready = true;
      }
    }
  }
  if (prev) io.to = prev.get();
  // Parameter gradients per unit, from the pieces every item leaves, once
  // per unit after its stage's last item.
  std::vector<std::vector<Tensor>> acc(engine.num_units());
  std::vector<Pieces> pieces(engine.num_units());
  std::vector<const UnitSpec*> unit_at(engine.num_units());
  std::vector<int64_t> first_unit(S);
  for (int64_t u = 0; u < engine.num_units(); ++u) {
    acc[u].resize(st.params[u].size());
    pieces[u].assign(M, std::vector<Piece>(K));
  }
  for (int64_t s = 0; s < S; ++s) {
    first_unit[s] = engine.first_unit(s);
    for (size_t j = 0; j < stages[s].units.size(); ++j) {
      unit_at[first_unit[s] + j] = &stages[s].units[j];
    }
  }
  WeightTasks weights(stages, first_unit, st.params);
  std::vector<OptTensor> gh0(L * M), gc0(L * M);
  const auto faults = engine.faults();
  Sync sync(links_of(engine));
  st.backward_done = true;
  BackwardWork::Shared shared{st,       faults,   sync, weights, pieces, acc,
                              unit_at,  gh_parts, gc_parts, gh0, gc0};
  run_pass(engine, sync, io, grid, [&](int s) {
    return std::make_unique<BackwardWork>(engine, shared, s, io.traces[s]);
  });
  st.saved.clear();
  engine.set_trace(io.all_traces(), /*forward=*/false);

  at::AutoDispatchBelowADInplaceOrView below;
  c10::AutoGradMode no_grad(false);
  BackwardResult r;
  if (!st.index_input && !prev) {
    const c10::Device d0 = stages[0].device;
    bool any = false;
    at::ScalarType dtype = at::kFloat;
    for (auto& slot : io.exit()) {
      acquire(slot);
      if (slot.value.defined()) {
        any = true;
        dtype = slot.value.scalar_type();
      }
    }
    if (any) {
      std::vector<Tensor> pieces_in(grid.count());
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t k = 0; k < K; ++k) {
          Tensor t = io.exit()[grid.index(m, k)].value;
          if (!t.defined()) {  // no gradient reached this piece
            t = at::zeros(grid.piece_sizes(st.input_sizes, m, k),
                          at::TensorOptions().device(d0).dtype(dtype));
          }
          pieces_in[grid.index(m, k)] = t;
        }
      }
      r.grad_input = grid.assemble(pieces_in);
    }
  }
  for (int64_t l = 0; l < L; ++l) {
    auto gather = [&](std::vector<OptTensor>& parts) -> OptTensor {
      std::vector<Tensor> ts;
      for (int64_t m = 0; m < M; ++m) {
        if (!parts[l * M + m].has_value()) return std::nullopt;
        ts.push_back(*parts[l * M + m]);
      }
      return grid.join_rows(ts);
    };
    r.grad_h0.push_back(gather(gh0));
    r.grad_c0.push_back(gather(gc0));
  }
  for (auto& a : acc) {
    std::vector<OptTensor> g;
    for (auto& t : a) g.push_back(t.defined() ? OptTensor(t) : std::nullopt);
    r.grad_params.push_back(std::move(g));
  }
  st.params.clear();
  return r;
}

}  // namespace pipelstm::pipeline
