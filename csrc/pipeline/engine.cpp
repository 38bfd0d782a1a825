// The pipeline engine (see engine.h and docs/pipeline.md).
//
// Work items are (micro-batch m, time chunk k). Stage s runs its items in a
// fixed order: forward k = 0..K-1, m = 0..M-1 (the hidden state of each
// micro-batch carries from chunk k-1 to chunk k inside the stage), taking
// each item's input from the slot stage s-1 filled. Backward runs the items
// in the reverse order, the gradient of the hidden state carried from chunk
// k+1 to chunk k. Both dependencies of the wavefront therefore hold: stage s
// starts (m, k) only after stage s-1 finished it (it waits on the slot) and
// after it finished (m, k-1) itself (program order).
#include "engine.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <unordered_set>
#include <utility>

#include "../layer_geometry.h"
#include "units.h"

namespace pipelstm::pipeline {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* kind_name(UnitKind k) {
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

// Sizes of `n` items split into `parts` as torch.tensor_split does: the
// first n % parts get one more.
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

// A tensor handed from one stage to the next. On an accelerator, `event`
// marks when it is ready on the producer's stream.
struct Slot {
  Tensor value;
  bool ready = false;
  std::optional<c10::Event> event;
};

// Shared by the workers of one pass: the slots between stages, and the
// first error (which wakes everyone up).
struct Sync {
  std::mutex mu;
  std::condition_variable cv;
  bool failed = false;
  std::string error;
  // Links to other processes: their pending operations are cancelled on
  // failure, so that no worker stays blocked in a wait.
  std::vector<RemoteLink*> links;

  explicit Sync(const Engine& engine) {
    for (const auto* link : {&engine.prev_link(), &engine.next_link()}) {
      if (*link) links.push_back(link->get());
    }
  }
  ~Sync() {
    for (auto* link : links) link->abort_all();
  }

  void fail(const std::string& msg) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (failed) return;
      failed = true;
      error = msg;
    }
    cv.notify_all();
    for (auto* link : links) link->abort_all();
  }

  // Waits until `slot` is ready; false if the pass failed meanwhile.
  bool wait(Slot& slot) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return slot.ready || failed; });
    return slot.ready && !failed;
  }

  void put(Slot& slot, Tensor value, std::optional<c10::Event> event) {
    {
      std::lock_guard<std::mutex> lock(mu);
      slot.value = std::move(value);
      slot.event = std::move(event);
      slot.ready = true;
    }
    cv.notify_all();
  }
};

// Makes `t` (produced on this thread's current stream of `device`) safe to
// use from another stream: an event to wait on.
std::optional<c10::Event> ready_event(const c10::Device& device) {
  if (device.is_cpu()) return std::nullopt;
  c10::impl::VirtualGuardImpl impl(device.type());
  c10::Event ev(device.type());
  ev.record(impl.getStream(device));
  return ev;
}

// Before using a slot's tensor on this thread's current stream.
void acquire(Slot& slot) {
  if (!slot.event.has_value() || !slot.value.defined()) return;
  const c10::Device device = slot.value.device();
  c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream stream = impl.getStream(device);
  slot.event->block(stream);
  impl.recordDataPtrOnStream(slot.value.storage().data_ptr(), stream);
}

Tensor to_device(const Tensor& t, const c10::Device& device) {
  if (!t.defined() || t.device() == device) return t;
  // Non-blocking only into an accelerator (its stream orders the copy);
  // into host memory the copy must have finished before the CPU reads it.
  return t.to(device, /*non_blocking=*/!device.is_cpu());
}

// Hands a stage's results to the neighbouring stage on another device. From
// an accelerator the copy runs on a copy stream of the stage's own, after an
// event on its compute stream, so that computing the next item overlaps the
// transfer of this one; the returned event marks the copy done.
class Courier {
 public:
  explicit Courier(const c10::Device& from) : from_(from) {
    if (!from.is_cpu()) {
      copy_stream_ = c10::impl::VirtualGuardImpl(from.type()).getStreamFromGlobalPool(from);
    }
  }

  std::pair<Tensor, std::optional<c10::Event>> send(const Tensor& x, const c10::Device& to) {
    if (!copy_stream_.has_value() || !x.defined()) {  // from host memory: as before
      Tensor y = to_device(x, to);
      return {y, ready_event(to)};
    }
    c10::impl::VirtualGuardImpl impl(from_.type());
    c10::Event computed(from_.type());
    computed.record(impl.getStream(from_));
    computed.block(*copy_stream_);
    Tensor y;
    {
      c10::StreamGuard on_copy_stream(*copy_stream_);
      y = to_device(x, to);  // into host memory it waits for the copy
      // x came from the compute stream: its memory stays until the copy is done.
      impl.recordDataPtrOnStream(x.storage().data_ptr(), *copy_stream_);
    }
    if (to.is_cpu()) return {y, std::nullopt};
    c10::Event copied(from_.type());
    copied.record(*copy_stream_);
    return {y, std::move(copied)};
  }

 private:
  c10::Device from_;
  std::optional<c10::Stream> copy_stream_;
};

// What one worker thread holds for its whole pass.
class WorkerScope {
 public:
  WorkerScope(const at::ThreadLocalState& tls, const StageSpec& stage) : tls_guard_(tls) {
    at::internal::lazy_init_num_threads();
    if (stage.threads > 0) at::set_num_threads(stage.threads);
    if (!stage.device.is_cpu()) {
      c10::impl::VirtualGuardImpl impl(stage.device.type());
      stream_guard_.emplace(impl.getStreamFromGlobalPool(stage.device));
    }
  }

 private:
  at::ThreadLocalStateGuard tls_guard_;
  // The pass computes its own gradients: no autograd graph, no autocast.
  c10::AutoGradMode no_grad_{false};
  at::AutoDispatchBelowADInplaceOrView below_autograd_;
  std::optional<c10::StreamGuard> stream_guard_;
};

// Runs body(s) on one thread per stage and joins them all. The first
// exception (each body names its stage and unit) is rethrown here.
template <typename Body>
void run_workers(const Engine& engine, Sync& sync, Body body) {
  const std::vector<StageSpec>& stages = engine.stages();
  const at::ThreadLocalState tls;
  const int caller_threads = at::get_num_threads();
  std::vector<std::thread> threads;
  threads.reserve(stages.size());
  for (size_t s = 0; s < stages.size(); ++s) {
    threads.emplace_back([&, s] {
      try {
        WorkerScope scope(tls, stages[s]);
        body(static_cast<int>(s));
      } catch (const std::exception& e) {
        sync.fail("pipelstm.Pipeline: " + engine.stage_label(static_cast<int64_t>(s)) + ": " + e.what());
      } catch (...) {
        sync.fail("pipelstm.Pipeline: " + engine.stage_label(static_cast<int64_t>(s)) + ": unknown exception");
      }
    });
  }
  for (auto& t : threads) t.join();
  // at::set_num_threads in a worker also sets the process-wide default that
  // new threads start from; put the caller's back.
  for (const auto& st : stages) {
    if (st.threads > 0) {
      at::set_num_threads(caller_threads);
      break;
    }
  }
  if (sync.failed) throw std::runtime_error(sync.error);
}

std::string describe_failure(const Engine& engine, int s, const UnitSpec* unit,
                             int64_t unit_index, const char* phase, int64_t m, int64_t k,
                             const std::exception& e) {
  std::ostringstream os;
  os << "pipelstm.Pipeline: " << engine.stage_label(s);
  if (unit != nullptr) {
    os << ", unit " << unit_index << " '" << unit->name << "' (" << kind_name(unit->kind) << ")";
  }
  os << ", " << phase;
  if (m >= 0) os << " of micro-batch " << m << ", chunk " << k;
  os << " failed: ";
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) {
    os << ce->what_without_backtrace();
  } else {
    os << e.what();
  }
  return os.str();
}

// The parameter gradients ("W") of a backward pass: one task per unit with
// parameters, ready once its stage has run its last backward item. A stage
// done with its items runs its own tasks, then those of other stages on the
// same CPU with the same thread budget (a task's result does not depend on
// which of them computes it), so a lighter stage helps a heavier one.
class WeightTasks {
 public:
  WeightTasks(const std::vector<StageSpec>& stages, const std::vector<int64_t>& first_unit,
              const std::vector<UnitParams>& params)
      : tasks_(stages.size()), next_(stages.size(), 0), ready_(stages.size(), false) {
    for (size_t s = 0; s < stages.size(); ++s) {
      for (int64_t j = static_cast<int64_t>(stages[s].units.size()) - 1; j >= 0; --j) {
        const int64_t gu = first_unit[s] + j;
        for (const auto& t : params[gu]) {
          if (t.has_value()) {
            tasks_[s].push_back(gu);
            break;
          }
        }
      }
      group_.push_back(stages[s].device.is_cpu() ? stages[s].threads : -1 - static_cast<int>(s));
    }
  }

  void mark_ready(Sync& sync, int s) {
    {
      std::lock_guard<std::mutex> lock(sync.mu);
      ready_[s] = true;
    }
    sync.cv.notify_all();
  }

  // The next task stage `s` may run, {owner stage, unit}; waits while one
  // may still become ready; {-1, -1} when none is left or the pass failed.
  std::pair<int, int64_t> claim(Sync& sync, int s) {
    std::pair<int, int64_t> got{-1, -1};
    auto take = [&](int o) {
      if (!ready_[o] || next_[o] >= tasks_[o].size()) return false;
      got = {o, tasks_[o][next_[o]++]};
      return true;
    };
    std::unique_lock<std::mutex> lock(sync.mu);
    sync.cv.wait(lock, [&] {
      if (sync.failed || take(s)) return true;
      bool pending = false;
      for (int o = 0; o < static_cast<int>(tasks_.size()); ++o) {
        if (o == s || group_[o] != group_[s]) continue;
        if (take(o)) return true;
        pending = pending || next_[o] < tasks_[o].size();
      }
      return !pending;
    });
    return sync.failed ? std::pair<int, int64_t>{-1, -1} : got;
  }

 private:
  std::vector<std::vector<int64_t>> tasks_;  // per stage, its units with parameters, last first
  std::vector<size_t> next_;
  std::vector<bool> ready_;
  std::vector<int> group_;  // stages that run each other's tasks
};

bool recomputes(Checkpoint policy, int64_t m, int64_t k, int64_t M, int64_t K) {
  switch (policy) {
    case Checkpoint::Never: return false;
    case Checkpoint::Always: return true;
    case Checkpoint::ExceptLast: return !(m == M - 1 && k == K - 1);
  }
  return false;
}

}  // namespace

// Everything one forward pass keeps for its backward.
struct RunState {
  std::shared_ptr<Engine> engine;
  int64_t K = 1, M = 1;
  std::vector<int64_t> t_sizes, b_sizes;
  bool training = false;
  bool index_input = false;
  double loss_divisor = 1.0;  // the counted targets, for a mean loss
  c10::Device input_device{c10::kCPU};
  std::vector<int64_t> input_sizes;
  at::TensorOptions input_options;
  std::vector<UnitParams> params;
  std::vector<int64_t> first_unit;  // per stage, global index of its first unit
  // saved[s][m * K + k]: what stage s kept of item (m, k).
  std::vector<std::vector<SavedItem>> saved;
  int64_t saved_bytes = 0;
  std::vector<OptTensor> h0_given, c0_given;  // to shape the gradients
  std::vector<Tensor> h0_parts, c0_parts;     // [layer * M + m]
  Tensor output;
  std::vector<Tensor> h_n, c_n;
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
  st->K = std::min(chunks, T);
  st->M = std::min(micro_batches, B);
  const int64_t K = st->K, M = st->M;
  st->t_sizes = split_sizes(T, K);
  st->b_sizes = split_sizes(B, M);
  const auto t_off = offsets_of(st->t_sizes), b_off = offsets_of(st->b_sizes);
  st->training = training;
  st->kept = keep_for_backward;
  st->index_input = !at::isFloatingType(input.scalar_type());
  st->input_device = input.device();
  st->input_sizes = input.sizes().vec();
  st->input_options = input.options();
  // The loss's targets, per item, on the last stage's device.
  std::vector<Tensor> targets(M * K);
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
      for (int64_t k = 0; k < K; ++k) {
        targets[m * K + k] = t.narrow(0, t_off[k], st->t_sizes[k]).narrow(1, b_off[m], st->b_sizes[m]);
      }
    }
  }
  st->params = params;
  st->h0_given = h0;
  st->c0_given = c0;
  st->saved.assign(S, std::vector<SavedItem>(M * K));
  int64_t u0 = 0;
  for (const auto& stage : stages_) {
    st->first_unit.push_back(u0);
    u0 += static_cast<int64_t>(stage.units.size());
  }

  // Initial states, split by micro-batch, on the device of their layer.
  st->h0_parts.resize(num_lstm_ * M);
  st->c0_parts.resize(num_lstm_ * M);
  for (const auto& stage : stages_) {
    for (const auto& u : stage.units) {
      if (u.kind != UnitKind::Lstm) continue;
      const int64_t l = u.state_index;
      const UnitParams& p = params[st->first_unit[&stage - stages_.data()] +
                                   (&u - stage.units.data())];
      const Tensor& w_ih = need(p[0], u, "w_ih");
      const LayerGeometry g = LayerGeometry::of(w_ih, need(p[1], u, "w_hh"), p[4]);
      const int64_t H = g.hidden, P = g.out;
      for (int64_t m = 0; m < M; ++m) {
        auto part = [&](const OptTensor& given, int64_t width) {
          if (given.has_value()) {
            return to_device(given->narrow(0, b_off[m], st->b_sizes[m]), stage.device)
                .contiguous();
          }
          return at::zeros({st->b_sizes[m], width}, w_ih.options().device(stage.device));
        };
        st->h0_parts[l * M + m] = part(h0[l], P);
        st->c0_parts[l * M + m] = part(c0[l], H);
      }
    }
  }

  // Slots: channel s feeds stage s; channel S is the output.
  std::vector<std::vector<Slot>> channel(S + 1);
  for (auto& c : channel) c = std::vector<Slot>(M * K);
  // The input: local, or received from the previous process (`input` then
  // only gives the shape and dtype, e.g. a meta tensor), all receives
  // posted ahead.
  std::vector<std::shared_ptr<Transfer>> recvs(M * K);
  if (prev_) {
    TORCH_CHECK(at::isFloatingType(input.scalar_type()),
                "pipelstm.Pipeline: activations from another process must be floating point");
    const auto options = input.options().device(stages_[0].device);
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t m = 0; m < M; ++m) {
        std::vector<int64_t> sizes = input.sizes().vec();
        sizes[0] = st->t_sizes[k];
        sizes[1] = st->b_sizes[m];
        recvs[m * K + k] = prev_->post_recv(Traffic::Activations, m, k, K, sizes, options);
      }
    }
  } else {
    const Tensor x_in = to_device(input, stages_[0].device);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) {
        Slot& slot = channel[0][m * K + k];
        slot.value = x_in.narrow(0, t_off[k], st->t_sizes[k]).narrow(1, b_off[m], st->b_sizes[m]);
        slot.ready = true;
      }
    }
  }
  if (next_) st->out_sizes.resize(M * K);
  // One draw from the default generator per pass (so torch.manual_seed
  // governs the dropout masks), whatever the units.
  uint64_t pass_seed = 0;
  if (training) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    pass_seed = gen.get<at::CPUGeneratorImpl>()->random64();
  }
  std::vector<Tensor> h_final(num_lstm_ * M), c_final(num_lstm_ * M);
  std::vector<std::vector<TraceEvent>> traces(S);
  const auto faults = this->faults();
  Sync sync(*this);

  run_workers(*this, sync, [&](int s) {
    const StageSpec& stage = stages_[s];
    const int64_t n_units = static_cast<int64_t>(stage.units.size());
    const c10::Device next_device = s + 1 < S ? stages_[s + 1].device : stage.device;
    Courier courier(stage.device);
    // Carried hidden state per (unit, micro-batch).
    std::vector<Tensor> h(n_units * M), c(n_units * M);
    for (int64_t j = 0; j < n_units; ++j) {
      const auto& u = stage.units[j];
      if (u.kind != UnitKind::Lstm) continue;
      for (int64_t m = 0; m < M; ++m) {
        h[j * M + m] = st->h0_parts[u.state_index * M + m];
        c[j * M + m] = st->c0_parts[u.state_index * M + m];
      }
    }
    const bool from_prev = s == 0 && prev_, to_next = s == S - 1 && next_;
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t m = 0; m < M; ++m) {
        Slot& in = channel[s][m * K + k];
        if (!from_prev && !sync.wait(in)) return;
        int64_t j = -1;
        try {
          Tensor x;
          if (from_prev) {
            x = prev_->wait_recv(*recvs[m * K + k], Traffic::Activations);
            recvs[m * K + k].reset();
          } else {
            acquire(in);
            x = in.value;
            in.value = Tensor();  // the stage owns it now
          }
          const int64_t t0 = now_ns();
          SavedItem& item = st->saved[s][m * K + k];
          item.units.resize(n_units);
          item.recompute = keep_for_backward && recomputes(checkpoint, m, k, M, K);
          if (item.recompute) item.input = x;
          for (j = 0; j < n_units; ++j) {
            const int64_t gu = st->first_unit[s] + j;
            check_fault(faults, gu, "forward", m, k);
            x = unit_forward(stage.units[j], params[gu], x, training, keep_for_backward,
                             h[j * M + m], c[j * M + m], item.units[j],
                             dropout_seed(pass_seed, gu, m, k), targets[m * K + k]);
            if (item.recompute) keep_for_replay(stage.units[j], item.units[j]);
          }
          j = -1;
          traces[s].push_back({s, "forward", static_cast<int>(m), static_cast<int>(k), t0, now_ns()});
          if (k == K - 1) {
            for (int64_t jj = 0; jj < n_units; ++jj) {
              const auto& u = stage.units[jj];
              if (u.kind != UnitKind::Lstm) continue;
              h_final[u.state_index * M + m] = h[jj * M + m];
              c_final[u.state_index * M + m] = c[jj * M + m];
            }
          }
          if (to_next) {
            st->out_sizes[m * K + k] = x.sizes().vec();
            if (m == 0 && k == 0) st->out_options = x.options();
            next_->send(Traffic::Activations, m, k, K, x);
            continue;
          }
          std::optional<c10::Event> ready;
          if (next_device != stage.device) {
            const int64_t t1 = now_ns();
            std::tie(x, ready) = courier.send(x, next_device);
            traces[s].push_back({s, "transfer", static_cast<int>(m), static_cast<int>(k), t1, now_ns()});
          } else {
            ready = ready_event(next_device);
          }
          sync.put(channel[s + 1][m * K + k], std::move(x), std::move(ready));
        } catch (const std::exception& e) {
          sync.fail(describe_failure(*this, s, j >= 0 ? &stage.units[j] : nullptr,
                                     j >= 0 ? st->first_unit[s] + j : -1, "forward", m, k, e));
          return;
        }
      }
    }
    if (to_next) {
      try {
        next_->wait_sends(Traffic::Activations);
      } catch (const std::exception& e) {
        sync.fail("pipelstm.Pipeline: " + stage_label(s) + " " + e.what());
      }
    }
  });

  std::vector<TraceEvent> all;
  for (auto& t : traces) all.insert(all.end(), t.begin(), t.end());
  set_trace(std::move(all), /*forward=*/true);

  // Assemble: time chunks along dim 0, then micro-batches along dim 1 (with
  // a next process, which has the output, an empty placeholder).
  const c10::Device out_device = stages_.back().device;
  std::vector<Tensor> items;  // the outputs of items (m, k) at m * K + k
  for (int64_t i = 0; i < (next_ ? 0 : M * K); ++i) {
    Slot& slot = channel[S][i];
    if (slot.event.has_value()) slot.event->block(c10::impl::VirtualGuardImpl(out_device.type()).getStream(out_device));
    items.push_back(slot.value);
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
      std::vector<Tensor> per_m;
      for (int64_t m = 0; m < M; ++m) {
        const std::vector<Tensor> per_k(items.begin() + m * K, items.begin() + (m + 1) * K);
        per_m.push_back(K == 1 ? per_k[0] : at::cat(per_k, 0));
      }
      st->output = M == 1 ? per_m[0] : at::cat(per_m, 1);
    }
    for (int64_t l = 0; l < num_lstm_; ++l) {
      std::vector<Tensor> hs(h_final.begin() + l * M, h_final.begin() + (l + 1) * M);
      std::vector<Tensor> cs(c_final.begin() + l * M, c_final.begin() + (l + 1) * M);
      st->h_n.push_back(M == 1 ? hs[0] : at::cat(hs, 0));
      st->c_n.push_back(M == 1 ? cs[0] : at::cat(cs, 0));
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

Tensor Run::output() const { return state_->output; }
std::vector<Tensor> Run::h_n() const { return state_->h_n; }
std::vector<Tensor> Run::c_n() const { return state_->c_n; }
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
  const int64_t S = static_cast<int64_t>(stages.size()), K = st.K, M = st.M;
  const int64_t L = engine.num_lstm_layers();
  TORCH_CHECK(static_cast<int64_t>(grad_h_n.size()) == L &&
                  static_cast<int64_t>(grad_c_n.size()) == L,
              "pipelstm.Pipeline: expected a (possibly None) gradient for each LSTM layer's state");
  const auto t_off = offsets_of(st.t_sizes), b_off = offsets_of(st.b_sizes);

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
        gh_parts[l * M + m] = to_device(grad_h_n[l]->narrow(0, b_off[m], st.b_sizes[m]), layer_device[l]);
      }
      if (grad_c_n[l].has_value() && grad_c_n[l]->defined()) {
        gc_parts[l * M + m] = to_device(grad_c_n[l]->narrow(0, b_off[m], st.b_sizes[m]), layer_device[l]);
      }
    }
  }

  std::vector<std::vector<Slot>> channel(S + 1);
  for (auto& c : channel) c = std::vector<Slot>(M * K);
  // The gradient of the output: given, or received from the next process
  // (all receives posted ahead, in the order they are used).
  const auto& next = engine.next_link();
  const auto& prev = engine.prev_link();
  std::vector<std::shared_ptr<Transfer>> recvs(M * K);
  if (next) {
    for (int64_t k = K - 1; k >= 0; --k) {
      for (int64_t m = M - 1; m >= 0; --m) {
        recvs[m * K + k] = next->post_recv(Traffic::Gradients, m, k, K, st.out_sizes[m * K + k],
                                           st.out_options);
      }
    }
  } else {
    Tensor g_out;
    if (grad_output.has_value() && grad_output->defined()) g_out = to_device(*grad_output, stages.back().device);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) {
        Slot& slot = channel[S][m * K + k];
        if (g_out.defined()) {
          // A loss: each item's sum gets the gradient of the mean or sum.
          slot.value = engine.loss() ? g_out / st.loss_divisor
                                     : g_out.narrow(0, t_off[k], st.t_sizes[k]).narrow(1, b_off[m], st.b_sizes[m]);
        }
        slot.ready = true;
      }
    }
  }
  // Parameter gradients per unit, from the pieces every item leaves, once
  // per unit after its stage's last item.
  std::vector<std::vector<Tensor>> acc(engine.num_units());
  std::vector<Pieces> pieces(engine.num_units());
  std::vector<const UnitSpec*> unit_at(engine.num_units());
  for (int64_t u = 0; u < engine.num_units(); ++u) {
    acc[u].resize(st.params[u].size());
    pieces[u].assign(M, std::vector<Piece>(K));
  }
  for (int64_t s = 0; s < S; ++s) {
    for (size_t j = 0; j < stages[s].units.size(); ++j) {
      unit_at[st.first_unit[s] + j] = &stages[s].units[j];
    }
  }
  WeightTasks weights(stages, st.first_unit, st.params);
  std::vector<OptTensor> gh0(L * M), gc0(L * M);
  std::vector<std::vector<TraceEvent>> traces(S);
  const auto faults = engine.faults();
  Sync sync(engine);
  st.backward_done = true;

  run_workers(engine, sync, [&](int s) {
    const StageSpec& stage = stages[s];
    const int64_t n_units = static_cast<int64_t>(stage.units.size());
    const c10::Device prev_device = s > 0 ? stages[s - 1].device : st.input_device;
    Courier courier(stage.device);
    std::vector<OptTensor> gh(n_units * M), gc(n_units * M);
    for (int64_t j = 0; j < n_units; ++j) {
      const auto& u = stage.units[j];
      if (u.kind != UnitKind::Lstm) continue;
      for (int64_t m = 0; m < M; ++m) {
        gh[j * M + m] = gh_parts[u.state_index * M + m];
        gc[j * M + m] = gc_parts[u.state_index * M + m];
      }
    }
    const bool from_next = s == S - 1 && next, to_prev = s == 0 && prev;
    for (int64_t k = K - 1; k >= 0; --k) {
      for (int64_t m = M - 1; m >= 0; --m) {
        Slot& in = channel[s + 1][m * K + k];
        if (!from_next && !sync.wait(in)) return;
        int64_t j = -1;
        try {
          Tensor g;
          if (from_next) {
            g = next->wait_recv(*recvs[m * K + k], Traffic::Gradients);
            recvs[m * K + k].reset();
          } else {
            acquire(in);
            g = in.value;
            in.value = Tensor();
          }
          SavedItem& item = st.saved[s][m * K + k];
          if (item.recompute) {
            const int64_t tr = now_ns();
            replay(stage.units, st.params, st.first_unit[s], st.training, item);
            traces[s].push_back({s, "recompute", static_cast<int>(m), static_cast<int>(k), tr, now_ns()});
          }
          const int64_t t0 = now_ns();
          for (j = n_units - 1; j >= 0; --j) {
            const int64_t gu = st.first_unit[s] + j;
            check_fault(faults, gu, "backward", m, k);
            g = unit_backward_data(stage.units[j], st.params[gu], g, item.units[j], gh[j * M + m],
                                   gc[j * M + m], pieces[gu][m][k]);
            item.units[j].clear();  // free activations as soon as they are used
          }
          j = -1;
          traces[s].push_back({s, "backward", static_cast<int>(m), static_cast<int>(k), t0, now_ns()});
          if (k == 0) {
            for (int64_t jj = 0; jj < n_units; ++jj) {
              const auto& u = stage.units[jj];
              if (u.kind != UnitKind::Lstm) continue;
              gh0[u.state_index * M + m] = gh[jj * M + m];
              gc0[u.state_index * M + m] = gc[jj * M + m];
            }
          }
          if (to_prev) {
            // The previous process waits for every piece: send zeros where
            // no gradient reached the input.
            if (!g.defined()) {
              std::vector<int64_t> shape = st.input_sizes;
              shape[0] = st.t_sizes[k];
              shape[1] = st.b_sizes[m];
              g = at::zeros(shape, st.input_options.device(stage.device));
            }
            prev->send(Traffic::Gradients, m, k, K, g);
            continue;
          }
          std::optional<c10::Event> ready;
          if (s > 0 && g.defined() && prev_device != stage.device) {
            const int64_t t1 = now_ns();
            std::tie(g, ready) = courier.send(g, prev_device);
            traces[s].push_back({s, "transfer", static_cast<int>(m), static_cast<int>(k), t1, now_ns()});
          } else {
            ready = ready_event(s > 0 ? prev_device : stage.device);
          }
          sync.put(channel[s][m * K + k], std::move(g), std::move(ready));
        } catch (const std::exception& e) {
          sync.fail(describe_failure(engine, s, j >= 0 ? &stage.units[j] : nullptr,
                                     j >= 0 ? st.first_unit[s] + j : -1, "backward", m, k, e));
          return;
        }
      }
    }
    // The parameter gradients, while the last sends are in flight.
    weights.mark_ready(sync, s);
    for (;;) {
      const auto [owner, gu] = weights.claim(sync, s);
      if (owner < 0) break;
      const UnitSpec& unit = *unit_at[gu];
      const int64_t t0 = now_ns();
      try {
        unit_weight_grads(unit, st.params[gu], pieces[gu], acc[gu]);
        pieces[gu].clear();
      } catch (const std::exception& e) {
        sync.fail(describe_failure(engine, owner, &unit, gu, "parameter gradients", -1, -1, e));
        return;
      }
      traces[s].push_back({s, "weights", -1, -1, t0, now_ns()});
    }
    if (to_prev) {
      try {
        prev->wait_sends(Traffic::Gradients);
      } catch (const std::exception& e) {
        sync.fail("pipelstm.Pipeline: " + engine.stage_label(s) + " " + e.what());
      }
    }
  });
  st.saved.clear();

  std::vector<TraceEvent> all;
  for (auto& t : traces) all.insert(all.end(), t.begin(), t.end());
  engine.set_trace(std::move(all), /*forward=*/false);

  at::AutoDispatchBelowADInplaceOrView below;
  c10::AutoGradMode no_grad(false);
  BackwardResult r;
  if (!st.index_input && !prev) {
    const c10::Device d0 = stages[0].device;
    bool any = false;
    at::ScalarType dtype = at::kFloat;
    for (auto& slot : channel[0]) {
      if (slot.event.has_value()) {
        slot.event->block(c10::impl::VirtualGuardImpl(d0.type()).getStream(d0));
      }
      if (slot.value.defined()) {
        any = true;
        dtype = slot.value.scalar_type();
      }
    }
    if (any) {
      std::vector<Tensor> per_m;
      for (int64_t m = 0; m < M; ++m) {
        std::vector<Tensor> per_k;
        for (int64_t k = 0; k < K; ++k) {
          Tensor t = channel[0][m * K + k].value;
          if (!t.defined()) {  // no gradient reached this piece
            std::vector<int64_t> shape = st.input_sizes;
            shape[0] = st.t_sizes[k];
            shape[1] = st.b_sizes[m];
            t = at::zeros(shape, at::TensorOptions().device(d0).dtype(dtype));
          }
          per_k.push_back(t);
        }
        per_m.push_back(K == 1 ? per_k[0] : at::cat(per_k, 0));
      }
      r.grad_input = M == 1 ? per_m[0] : at::cat(per_m, 1);
    }
  }
  for (int64_t l = 0; l < L; ++l) {
    auto gather = [&](std::vector<OptTensor>& parts) -> OptTensor {
      std::vector<Tensor> ts;
      for (int64_t m = 0; m < M; ++m) {
        if (!parts[l * M + m].has_value()) return std::nullopt;
        ts.push_back(*parts[l * M + m]);
      }
      return M == 1 ? ts[0] : at::cat(ts, 0);
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
