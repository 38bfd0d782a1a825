#include "streams.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace pipelstm::pipeline {

std::optional<c10::Event> ready_event(const c10::Device& device) {
  if (device.is_cpu()) return std::nullopt;
  c10::impl::VirtualGuardImpl impl(device.type());
  c10::Event ev(device.type());
  ev.record(impl.getStream(device));
  return ev;
}

void acquire(Slot& slot) {
  if (!slot.event.has_value() || !slot.value.defined()) return;
  const c10::Device device = slot.value.device();
  c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream stream = impl.getStream(device);
  slot.event->block(stream);
  impl.recordDataPtrOnStream(slot.value.storage().data_ptr(), stream);
}

Tensor to_device(const Tensor& t, const c10::Device& device) {
  if (!t.defined() || t.device() == device) return t;
  return t.to(device, /*non_blocking=*/!device.is_cpu());
}

Courier::Courier(const c10::Device& from) : from_(from) {
  if (!from.is_cpu()) {
    copy_stream_ = c10::impl::VirtualGuardImpl(from.type()).getStreamFromGlobalPool(from);
  }
}

std::pair<Tensor, std::optional<c10::Event>> Courier::send(const Tensor& x, const c10::Device& to) {
  if (!copy_stream_.has_value() || !x.defined()) {  // from host memory: a plain copy
    Tensor y = to_device(x, to);
    return {y, ready_event(to)};
  }
  c10::impl::VirtualGuardImpl impl(from_.type());
  c10::Event computed(from_.type());
  computed.record(impl.getStream(from_));
  computed.block(*copy_stream_);
  Tensor y;
  {
    c10::StreamGuard on_copy_stream(*copy_stream_);
    y = to_device(x, to);  // into host memory it waits for the copy
    // x came from the compute stream: its memory stays until the copy is done.
    impl.recordDataPtrOnStream(x.storage().data_ptr(), *copy_stream_);
  }
  if (to.is_cpu()) return {y, std::nullopt};
  c10::Event copied(from_.type());
  copied.record(*copy_stream_);
  return {y, std::move(copied)};
}

}  // namespace pipelstm::pipeline
