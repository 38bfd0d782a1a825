#include "fault_hook.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

namespace pipelstm::pipeline::testing {
namespace {

struct Fault {
  int64_t unit;
  Direction direction;
  int64_t m, k;
};

std::mutex mu;
std::vector<Fault> faults;
std::atomic<bool> any{false};

}  // namespace

void inject_fault(int64_t unit, const char* phase, int64_t m, int64_t k) {
  const std::string p = phase;
  TORCH_CHECK(p == "forward" || p == "backward", "phase must be forward or backward");
  std::lock_guard<std::mutex> lock(mu);
  faults.push_back({unit, p == "forward" ? Direction::Forward : Direction::Backward, m, k});
  any.store(true, std::memory_order_relaxed);
}

void clear_faults() {
  std::lock_guard<std::mutex> lock(mu);
  faults.clear();
  any.store(false, std::memory_order_relaxed);
}

void check_fault(int64_t unit, Direction direction, Item item) {
  if (!any.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& f : faults) {
    TORCH_CHECK(!(f.unit == unit && f.direction == direction && f.m == item.m && f.k == item.k),
                "injected fault (testing)");
  }
}

}  // namespace pipelstm::pipeline::testing
