#include "weight_tasks.h"

namespace pipelstm::pipeline {

WeightTasks::WeightTasks(const Stages& stages, const std::vector<UnitParams>& params)
    : tasks_(stages.size()), next_(stages.size(), 0), ready_(stages.size(), false) {
  for (int64_t s = 0; s < stages.size(); ++s) {
    for (int64_t j = static_cast<int64_t>(stages[s].units.size()) - 1; j >= 0; --j) {
      const int64_t gu = stages.first_unit(s) + j;
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

void WeightTasks::mark_ready(Sync& sync, int s) {
  {
    std::lock_guard<std::mutex> lock(sync.mu);
    ready_[s] = true;
  }
  sync.cv.notify_all();
}

std::pair<int, int64_t> WeightTasks::claim(Sync& sync, int s) {
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

}  // namespace pipelstm::pipeline
