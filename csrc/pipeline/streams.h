// How a tensor made on one stage's device becomes safe to use on another's:
// streams (ordered queues of device work), events (points in a stream's
// queue), and the courier that copies on a stream of its own so that the
// next item's compute overlaps this item's transfer.
//
// The CPU has a stand-in for each, as torchgpipe's stream.py has, so that
// the same code runs on every device: the compute stream of a CPU stage is
// its own thread (work is done when queued, an event is done when recorded,
// and waiting on an event waits on the host). The CPU copy stream is
// normally the same plain synchronous copy; with PIPELSTM_HOST_COPY_STREAM
// set (a number of microseconds, 0 included) every hand-over between CPU
// stages goes through a courier whose copy stream is a thread of its own,
// which runs its copies in order, that long after they are queued, into
// NaN-filled memory. A missing wait then gives a wrong answer on any
// machine, so the tests catch it in CI.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace pipelstm::pipeline {

using at::Tensor;

class HostQueue;
struct HostEvent;
class Stream;

// A point in a stream's queue: done once everything queued on that stream
// before it is done. Default-constructed: done already.
class Event {
 public:
  Event() = default;
  // Later work on `stream` starts after this point: on an accelerator the
  // device waits; on the CPU, whose compute stream is the calling thread,
  // the thread does. Raises what a host copy stream's work raised.
  void block(const Stream& stream) const;

 private:
  friend class Stream;
  std::optional<c10::Event> device_;
  std::shared_ptr<HostEvent> host_;
};

// An ordered queue of work on one device.
class Stream {
 public:
  // The stream this thread queues its work for `device` on.
  static Stream current(const c10::Device& device);
  // A fresh stream for copies: one from the accelerator's pool, or on the
  // CPU the thread that is the copy stream (see above), or, without
  // PIPELSTM_HOST_COPY_STREAM, the calling thread.
  static Stream for_copies(const c10::Device& device);

  // Whether work queued on this stream can still be running when queueing
  // returns (an accelerator, or the CPU copy thread).
  bool asynchronous() const { return device_stream_.has_value() || host_ != nullptr; }
  // The point after everything queued so far.
  Event record() const;
  // Copies `x` to `to` on this stream; the result is ready at the next
  // record(). `x`'s memory is kept until the copy has read it.
  Tensor copy(const Tensor& x, const c10::Device& to) const;
  // Tells the caching allocator that work queued on this stream uses `t`'s
  // memory (which another stream allocated).
  void uses(const Tensor& t) const;

 private:
  explicit Stream(const c10::Device& device) : device_(device) {}
  friend class Event;
  c10::Device device_;
  std::optional<c10::Stream> device_stream_;
  std::shared_ptr<HostQueue> host_;
};

// The compute streams of an engine's stages: one per stage on an
// accelerator, taken from its pool at the first pass and kept for the
// engine's life. A stage's forward and backward then queue on one stream,
// so what the forward made and the backward reads and frees stays in that
// stream's order for the caching allocator (with a fresh pool stream per
// pass, a saved tensor was freed while another stream still read it).
class StageStreams {
 public:
  explicit StageStreams(size_t stages) : streams_(stages) {}
  // Stage s's stream on `device`; nullopt on the CPU (its stream is the
  // worker thread).
  std::optional<c10::Stream> get(size_t s, const c10::Device& device);

 private:
  std::mutex mu_;
  std::vector<std::optional<c10::Stream>> streams_;
};

// For its lifetime, this thread queues the work of `device` on `stream`
// (the stage's, StageStreams; on the CPU, nullopt: the thread itself).
class StreamScope {
 public:
  StreamScope(const c10::Device& device, const std::optional<c10::Stream>& stream);

 private:
  std::optional<c10::StreamGuard> guard_;
};

// `t` on `device`: non-blocking only into an accelerator (its stream orders
// the copy); into host memory the copy has finished when this returns.
Tensor to_device(const Tensor& t, const c10::Device& device);

// Hands a stage's results to the neighbouring stage. To another device (or
// between CPU stages with PIPELSTM_HOST_COPY_STREAM set) the copy runs on a
// copy stream of the stage's own, after a point on its compute stream; the
// event returned marks the copy done. Otherwise `x` is passed on as it is,
// with the point after the compute that made it.
class Courier {
 public:
  explicit Courier(const c10::Device& from);
  struct Delivery {
    Tensor value;
    Event ready;
    bool copied = false;
  };
  Delivery send(const Tensor& x, const c10::Device& to);

 private:
  c10::Device from_;
  Stream copies_;
  bool copy_all_;  // CPU to CPU too: the host copy thread is on
};

}  // namespace pipelstm::pipeline
