// What the stage threads of one pass share: the slots that hand a tensor
// from one stage to the next, and the first error, which wakes every waiting
// thread and cancels the pending operations on links to other processes.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "remote.h"
#include "streams.h"

namespace pipelstm::pipeline {

using at::Tensor;

// A tensor handed from one stage to the next; `event` marks when it is
// ready on the stream that made it (streams.h).
struct Slot {
  Tensor value;
  bool ready = false;
  Event event;
};

// Before using a slot's tensor on this thread's current stream: its event
// blocks that stream, and the caching allocator learns that the stream uses
// the tensor's memory.
inline void acquire(Slot& slot) {
  if (!slot.value.defined()) return;
  const Stream stream = Stream::current(slot.value.device());
  slot.event.block(stream);
  stream.uses(slot.value);
}

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

  explicit Sync(std::vector<RemoteLink*> remote) : links(std::move(remote)) {}
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

  void put(Slot& slot, Tensor value, Event event) {
    {
      std::lock_guard<std::mutex> lock(mu);
      slot.value = std::move(value);
      slot.event = std::move(event);
      slot.ready = true;
    }
    cv.notify_all();
  }
};

}  // namespace pipelstm::pipeline
