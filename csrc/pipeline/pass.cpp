#include "pass.h"

#include <chrono>
#include <exception>
#include <utility>

#include "engine.h"
#include "profile_range.h"
#include "streams.h"
#include "workers.h"

namespace pipelstm::pipeline {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

PassIO::PassIO(Direction direction, int64_t stages, const ItemGrid& grid)
    : direction(direction),
      traffic(direction == Direction::Forward ? Traffic::Activations : Traffic::Gradients),
      S(stages),
      channel(stages + 1),
      recvs(grid.count()),
      traces(stages) {
  for (auto& c : channel) c = std::vector<Slot>(grid.count());
}

void PassIO::post_receives(const ItemGrid& grid, const std::vector<std::vector<int64_t>>& sizes,
                           const at::TensorOptions& options) {
  for (const Item it : item_order(direction, grid.K, grid.M)) {
    const int64_t i = grid.index(it);
    recvs[i] = from->post_recv(traffic, it.m, it.k, grid.K, sizes[i], options);
  }
}

std::vector<TraceEvent> PassIO::all_traces() const {
  std::vector<TraceEvent> all;
  for (const auto& t : traces) all.insert(all.end(), t.begin(), t.end());
  return all;
}

void run_pass(const Engine& engine, Sync& sync, PassIO& io, const ItemGrid& grid,
              const std::function<std::unique_ptr<StageWork>(int)>& make_work) {
  const auto& stages = engine.stages();
  const int64_t S = io.S;
  const bool forward = io.direction == Direction::Forward;
  const char* phase = forward ? "forward" : "backward";
  run_workers(engine, sync, [&](int s) {
    const StageSpec& stage = stages[s];
    const int64_t first = forward ? 0 : S - 1, last = forward ? S - 1 : 0;
    const int64_t neighbour = forward ? s + 1 : s - 1;
    const c10::Device out_device =
        neighbour >= 0 && neighbour < S ? stages[neighbour].device : stage.device;
    std::vector<Slot>& inbox = io.channel[forward ? s : s + 1];
    std::vector<Slot>& outbox = io.channel[forward ? s + 1 : s];
    const bool receives = io.from != nullptr && s == first;
    const bool sends = io.to != nullptr && s == last;
    Courier courier(stage.device);
    std::unique_ptr<StageWork> work = make_work(s);
    auto& trace = io.traces[s];
    const ProfileRange pass_range({phase, s});
    for (const Item it : item_order(io.direction, grid.K, grid.M)) {
      const int64_t i = grid.index(it);
      Slot& in = inbox[i];
      if (!receives && !sync.wait(in)) return;
      int64_t unit = -1;
      try {
        const ProfileRange item_range({phase, s, nullptr, -1, it.m, it.k});
        Tensor x;
        if (receives) {
          const ProfileRange recv_range({"receive", s, nullptr, -1, it.m, it.k});
          x = io.from->wait_recv(*io.recvs[i], io.traffic);
          io.recvs[i].reset();
        } else {
          acquire(in);
          x = in.value;
          in.value = Tensor();  // the stage owns it now
        }
        x = work->run(it, std::move(x), unit);
        unit = -1;
        if (sends) {
          const ProfileRange send_range({"send", s, nullptr, -1, it.m, it.k});
          io.to->send(io.traffic, it.m, it.k, grid.K, work->for_remote(it, std::move(x)));
          continue;
        }
        const int64_t t1 = now_ns();
        const ProfileRange transfer_range({"transfer", s, nullptr, -1, it.m, it.k});
        Courier::Delivery out = courier.send(x, out_device);
        if (out.copied) {
          trace.push_back({s, "transfer", static_cast<int>(it.m), static_cast<int>(it.k), t1, now_ns()});
        }
        sync.put(outbox[i], std::move(out.value), std::move(out.ready));
      } catch (const std::exception& e) {
        const int64_t first_unit = engine.first_unit(s);
        sync.fail(describe_failure(engine, s, unit >= 0 ? &stage.units[unit] : nullptr,
                                   unit >= 0 ? first_unit + unit : -1, phase, it.m, it.k, e));
        return;
      }
    }
    if (!work->finish()) return;
    if (sends) {
      try {
        io.to->wait_sends(io.traffic);
      } catch (const std::exception& e) {
        sync.fail("pipelstm.Pipeline: " + engine.stage_label(s) + " " + e.what());
      }
    }
  });
}

}  // namespace pipelstm::pipeline
