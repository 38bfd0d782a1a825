#include "streams.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include "../settings.h"

namespace pipelstm::pipeline {

// A point in a host copy stream's queue.
struct HostEvent {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;  // what the stream's work raised before this point

  void set(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      error = std::move(e);
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    if (error) std::rethrow_exception(error);
  }
};

// The CPU's stand-in for a copy stream: a thread that runs the copies queued
// on it in order, each `delay` after it was queued.
class HostQueue {
 public:
  explicit HostQueue(std::chrono::microseconds delay)
      : delay_(delay), thread_([this] { serve(); }) {}
  ~HostQueue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();  // after the queued work: slots may still wait on it
  }

  Tensor copy(const Tensor& x, const c10::Device& to) {
    TORCH_CHECK(to.is_cpu(), "pipelstm: the host copy stream copies into host memory only");
    Tensor y = at::empty_like(x, x.options().device(to));
    // Unwritten memory reads as NaN: a consumer that did not wait shows.
    if (y.is_floating_point()) y.fill_(std::numeric_limits<float>::quiet_NaN());
    const auto due = std::chrono::steady_clock::now() + delay_;
    push([x, y, due]() mutable {
      std::this_thread::sleep_until(due);
      y.copy_(x);
    });
    return y;
  }

  std::shared_ptr<HostEvent> record() {
    auto event = std::make_shared<HostEvent>();
    push([this, event] { event->set(error_); });
    return event;
  }

 private:
  void push(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(work));
    }
    cv_.notify_all();
  }

  void serve() {
    c10::AutoGradMode no_grad(false);
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        work();
      } catch (...) {
        if (!error_) error_ = std::current_exception();  // read by this thread only
      }
    }
  }

  const std::chrono::microseconds delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the rest is built
};

namespace {

// PIPELSTM_HOST_COPY_STREAM: the delay of the host copy thread, if on.
std::optional<std::chrono::microseconds> host_copy_delay() { return settings::host_copy_stream(); }

}  // namespace

void Event::block(const Stream& stream) const {
  if (host_) host_->wait();
  if (!device_.has_value()) return;
  if (stream.device_stream_.has_value()) {
    device_->block(*stream.device_stream_);
  } else {
    device_->synchronize();  // the host's stream is this thread
  }
}

Stream Stream::current(const c10::Device& device) {
  Stream s(device);
  if (!device.is_cpu()) {
    s.device_stream_ = c10::impl::VirtualGuardImpl(device.type()).getStream(device);
  }
  return s;
}

Stream Stream::for_copies(const c10::Device& device) {
  Stream s(device);
  if (!device.is_cpu()) {
    s.device_stream_ = c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device);
  } else if (const auto delay = host_copy_delay()) {
    s.host_ = std::make_shared<HostQueue>(*delay);
  }
  return s;
}

Event Stream::record() const {
  Event e;
  if (device_stream_.has_value()) {
    e.device_.emplace(device_.type());
    e.device_->record(*device_stream_);
  } else if (host_) {
    e.host_ = host_->record();
  }
  return e;
}

Tensor Stream::copy(const Tensor& x, const c10::Device& to) const {
  if (host_) return host_->copy(x, to);
  if (!device_stream_.has_value()) return to_device(x, to);
  Tensor y;
  {
    c10::StreamGuard on_this_stream(*device_stream_);
    y = to_device(x, to);  // into host memory it waits for the copy
  }
  uses(x);  // x came from another stream: its memory stays until the copy is done
  return y;
}

void Stream::uses(const Tensor& t) const {
  if (device_stream_.has_value() && t.defined()) {
    c10::impl::VirtualGuardImpl(device_.type())
        .recordDataPtrOnStream(t.storage().data_ptr(), *device_stream_);
  }
}

namespace {

// `device` may leave its index out ("cuda": the current one).
bool on_device(const c10::Stream& stream, const c10::Device& device) {
  return stream.device_type() == device.type() &&
         (!device.has_index() || stream.device_index() == device.index());
}

}  // namespace

std::optional<c10::Stream> StageStreams::get(size_t s, const c10::Device& device) {
  if (device.is_cpu()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  if (!streams_[s].has_value() || !on_device(*streams_[s], device)) {
    streams_[s] = c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device);
  }
  return streams_[s];
}

StreamScope::StreamScope(const c10::Device& device, const std::optional<c10::Stream>& stream) {
  if (!device.is_cpu()) {
    TORCH_INTERNAL_ASSERT(stream.has_value() && on_device(*stream, device));
    guard_.emplace(*stream);
  }
}

Tensor to_device(const Tensor& t, const c10::Device& device) {
  if (!t.defined() || t.device() == device) return t;
  return t.to(device, /*non_blocking=*/!device.is_cpu());
}

Courier::Courier(const c10::Device& from)
    : from_(from),
      copies_(Stream::for_copies(from)),
      copy_all_(from.is_cpu() && copies_.asynchronous()) {}

Courier::Delivery Courier::send(const Tensor& x, const c10::Device& to) {
  if (!x.defined()) return {x, Event(), false};
  if (to == from_ && !copy_all_) return {x, Stream::current(from_).record(), false};
  // The host copy thread copies into host memory only; into an accelerator
  // the CPU copies as it does without it.
  const Stream via = copy_all_ && !to.is_cpu() ? Stream::current(from_) : copies_;
  Stream::current(from_).record().block(via);  // the copy starts after the compute
  Tensor y = via.copy(x, to);
  // A synchronous copy stream (the CPU's) queued a copy into an accelerator
  // on that device's current stream.
  Event ready = via.asynchronous() ? via.record() : Stream::current(to).record();
  return {std::move(y), std::move(ready), true};
}

}  // namespace pipelstm::pipeline
