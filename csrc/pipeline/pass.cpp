#include "pass.h"

#include <chrono>
#include <exception>
#include <utility>

#include "profile_range.h"
#include "streams.h"
#include "workers.h"

namespace pipelstm::pipeline {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

PassResult run(Direction direction, const Stages& stages, const ItemGrid& grid, PassPlan& plan) {
  const int64_t S = stages.size();
  const bool forward = direction == Direction::Forward;
  const char* phase = forward ? "forward" : "backward";
  const Traffic traffic = forward ? Traffic::Activations : Traffic::Gradients;
  // channel[c] holds one slot per item: forward, channel s feeds stage s and
  // channel S receives what leaves; backward, channel s+1 feeds stage s and
  // channel 0 receives what leaves.
  std::vector<std::vector<Slot>> channel(S + 1);
  for (auto& c : channel) c = std::vector<Slot>(grid.count());  // Slot is move-only
  std::vector<Slot>& entry = channel[forward ? 0 : S];
  std::vector<Slot>& exit = channel[forward ? S : 0];
  std::vector<std::shared_ptr<Transfer>> recvs(grid.count());
  if (plan.from != nullptr) {
    for (const Item it : item_order(direction, grid.K, grid.M)) {
      const int64_t i = grid.index(it);
      recvs[i] = plan.from->post_recv(traffic, it.m, it.k, grid.K, plan.receive_sizes[i],
                                      plan.receive_options);
    }
  } else {
    for (int64_t i = 0; i < grid.count(); ++i) {
      entry[i].value = std::move(plan.enter[i]);
      entry[i].ready = true;
    }
  }
  std::vector<RemoteLink*> links;
  for (RemoteLink* link : {plan.from, plan.to}) {
    if (link != nullptr) links.push_back(link);
  }
  Sync sync(std::move(links));
  std::vector<std::vector<TraceEvent>> traces(S);

  run_workers(stages, sync, [&](int s) {
    const StageSpec& stage = stages[s];
    const int64_t first = forward ? 0 : S - 1, last = forward ? S - 1 : 0;
    const int64_t neighbour = forward ? s + 1 : s - 1;
    const c10::Device out_device =
        neighbour >= 0 && neighbour < S ? stages.device(neighbour) : stage.device;
    std::vector<Slot>& inbox = channel[forward ? s : s + 1];
    std::vector<Slot>& outbox = channel[forward ? s + 1 : s];
    const bool receives = plan.from != nullptr && s == first;
    const bool sends = plan.to != nullptr && s == last;
    Courier courier(stage.device);
    auto& trace = traces[s];
    std::unique_ptr<StageWork> work = plan.work(s, trace);
    const ProfileRange pass_range({phase, s});
    for (const Item it : item_order(direction, grid.K, grid.M)) {
      const int64_t i = grid.index(it);
      Slot& in = inbox[i];
      if (!receives && !sync.wait(in)) return;
      int64_t unit = -1;
      try {
        const ProfileRange item_range({phase, s, nullptr, -1, it.m, it.k});
        Tensor x;
        if (receives) {
          const ProfileRange recv_range({"receive", s, nullptr, -1, it.m, it.k});
          x = plan.from->wait_recv(*recvs[i], traffic);
          recvs[i].reset();
        } else {
          acquire(in);
          x = in.value;
          in.value = Tensor();  // the stage owns it now
        }
        x = work->run(it, std::move(x), unit);
        unit = -1;
        if (sends) {
          const ProfileRange send_range({"send", s, nullptr, -1, it.m, it.k});
          plan.to->send(traffic, it.m, it.k, grid.K, work->for_remote(it, std::move(x)));
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
        const int64_t first_unit = stages.first_unit(s);
        sync.fail(describe_failure(stages, s, unit >= 0 ? &stage.units[unit] : nullptr,
                                   unit >= 0 ? first_unit + unit : -1, phase, it.m, it.k, e));
        return;
      }
    }
    if (!work->finish(sync)) return;
    if (sends) {
      try {
        plan.to->wait_sends(traffic);
      } catch (const std::exception& e) {
        sync.fail("pipelstm.Pipeline: " + stages.label(s) + " " + e.what());
      }
    }
  });

  PassResult result;
  for (const auto& t : traces) result.trace.insert(result.trace.end(), t.begin(), t.end());
  if (plan.to == nullptr) {
    for (Slot& slot : exit) {
      acquire(slot);
      result.leave.push_back(std::move(slot.value));
    }
  }
  return result;
}

}  // namespace pipelstm::pipeline
