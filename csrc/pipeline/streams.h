// How a tensor made on one stage's device becomes safe to use on another's:
// events on the producer's stream, non-blocking copies, and the courier
// that copies on a stream of its own so that the next item's compute
// overlaps this item's transfer. On the CPU all of this reduces to plain
// (synchronous) copies and no events.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <optional>
#include <utility>

#include "sync.h"

namespace pipelstm::pipeline {

// An event marking that what this thread's current stream of `device` has
// queued so far is done; none on the CPU.
std::optional<c10::Event> ready_event(const c10::Device& device);

// Before using a slot's tensor on this thread's current stream: waits on
// its event (on the stream, not the host) and tells the caching allocator
// that the stream uses its memory.
void acquire(Slot& slot);

// `t` on `device`: non-blocking only into an accelerator (its stream orders
// the copy); into host memory the copy has finished when this returns.
Tensor to_device(const Tensor& t, const c10::Device& device);

// Hands a stage's results to the neighbouring stage on another device. From
// an accelerator the copy runs on a copy stream of the stage's own, after an
// event on its compute stream; the returned event marks the copy done.
class Courier {
 public:
  explicit Courier(const c10::Device& from);
  std::pair<Tensor, std::optional<c10::Event>> send(const Tensor& x, const c10::Device& to);

 private:
  c10::Device from_;
  std::optional<c10::Stream> copy_stream_;
};

}  // namespace pipelstm::pipeline
