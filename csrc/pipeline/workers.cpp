#include "workers.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <sstream>
#include <stdexcept>
#include <thread>

#include "../graph_replay.h"
#include "streams.h"

namespace pipelstm::pipeline {
namespace {

// What one worker thread holds for its whole pass.
class WorkerScope {
 public:
  WorkerScope(const at::ThreadLocalState& tls, const StageSpec& stage)
      : tls_guard_(tls), streams_(stage.device) {
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

void run_workers(const Engine& engine, Sync& sync, const std::function<void(int)>& body) {
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
