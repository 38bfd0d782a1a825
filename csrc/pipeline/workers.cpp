#include "workers.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <exception>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "../graph_replay.h"
#include "streams.h"

namespace pipelstm::pipeline {
namespace {

// What one worker thread holds for its whole pass.
class WorkerScope {
 public:
  WorkerScope(const at::ThreadLocalState& tls, const StageSpec& stage,
              const std::optional<c10::Stream>& stream)
      : tls_guard_(tls), streams_(stage.device, stream) {
    at::internal::lazy_init_num_threads();
    if (stage.threads > 0) at::set_num_threads(stage.threads);
  }

 private:
  at::ThreadLocalStateGuard tls_guard_;
  // The pass computes its own gradients: no autograd graph, no autocast.
  c10::AutoGradMode no_grad_{false};
  at::AutoDispatchBelowADInplaceOrView below_autograd_;
  NoGraphsOnThisThread no_graphs_;  // stages launch on one device at once (graph_replay.h)
  StreamScope streams_;  // the stage's compute stream
};

}  // namespace

void run_workers(const Stages& stages, Sync& sync, const std::function<void(int)>& body) {
  const at::ThreadLocalState tls;
  const int caller_threads = at::get_num_threads();
  // The stages' streams start after what the caller queued before the pass
  // (its inputs; its optimizer's updates of the weights), and the caller's
  // streams go on after all the stages queued (the weight gradients, last;
  // the memory freed in the pass). Each is one event per stage; on the CPU
  // they are done when recorded.
  std::vector<Event> pass_start(stages.size()), pass_end(stages.size());
  for (int64_t s = 0; s < stages.size(); ++s) pass_start[s] = Stream::current(stages.device(s)).record();
  std::vector<std::thread> threads;
  threads.reserve(stages.size());
  for (int64_t s = 0; s < stages.size(); ++s) {
    threads.emplace_back([&, s] {
      try {
        WorkerScope scope(tls, stages[s], stages.stream(s));
        const Stream own = Stream::current(stages.device(s));
        pass_start[s].block(own);
        std::exception_ptr error;
        try {
          body(static_cast<int>(s));
        } catch (...) {
          error = std::current_exception();
        }
        try {
          pass_end[s] = own.record();  // also after a failure: the caller frees what was queued
        } catch (...) {
          if (!error) error = std::current_exception();  // else a sticky device error: the body's says more
        }
        if (error) std::rethrow_exception(error);
      } catch (const std::exception& e) {
        sync.fail("pipelstm.Pipeline: " + stages.label(s) + ": " + e.what());
      } catch (...) {
        sync.fail("pipelstm.Pipeline: " + stages.label(s) + ": unknown exception");
      }
    });
  }
  for (auto& t : threads) t.join();
  try {
    for (int64_t s = 0; s < stages.size(); ++s) pass_end[s].block(Stream::current(stages.device(s)));
  } catch (...) {
    if (!sync.failed) throw;  // else the stage's own error, below
  }
  // at::set_num_threads in a worker also sets the process-wide default that
  // new threads start from; put the caller's back.
  for (const auto& st : stages.specs()) {
    if (st.threads > 0) {
      at::set_num_threads(caller_threads);
      break;
    }
  }
  if (sync.failed) throw std::runtime_error(sync.error);
}

std::string describe_failure(const Stages& stages, int s, const UnitSpec* unit,
                             int64_t unit_index, const char* phase, int64_t m, int64_t k,
                             const std::exception& e) {
  std::ostringstream os;
  os << "pipelstm.Pipeline: " << stages.label(s);
  if (unit != nullptr) {
    os << ", unit " << unit_index << " '" << unit->name << "' (" << unit_kind_name(unit->kind) << ")";
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

}  // namespace pipelstm::pipeline
