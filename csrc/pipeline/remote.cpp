// Point-to-point links to stages in other processes (see remote.h).
#include "remote.h"

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

#include "streams.h"

namespace pipelstm::pipeline {

namespace {

// Every (traffic, micro-batch, chunk) of a pass has its own tag, so a pass
// can post all its receives ahead; passes follow each other in the same
// order on both ends, and messages with the same tag arrive in order.
int tag_of(Traffic traffic, int64_t m, int64_t k, int64_t chunks) {
  const int64_t item = m * chunks + k;
  TORCH_CHECK(item < (int64_t{1} << 24), "pipelstm: too many pipeline work items (", item, ")");
  return static_cast<int>((static_cast<int64_t>(traffic) << 24) | item);
}

const char* traffic_name(Traffic traffic) {
  return traffic == Traffic::Activations ? "activations" : "gradients";
}

std::string reason(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

}  // namespace

RemoteLink::RemoteLink(const RemoteSpec& spec, std::chrono::milliseconds timeout)
    : spec_(spec), timeout_(timeout) {
  group_ = c10d::resolve_process_group(spec.group_name);
  TORCH_CHECK(spec.peer >= 0 && spec.peer < group_->getSize(), "pipelstm: peer rank ", spec.peer,
              " is not in process group '", spec.group_name, "' of size ", group_->getSize());
  TORCH_CHECK(spec.peer != group_->getRank(), "pipelstm: a stage cannot be its own peer");
}

// E.g. "timed out after 30 s waiting for the activations of micro-batch 0,
// chunk 2 from stage 0 (rank 0); is it alive? (<the backend's words>)".
std::string RemoteLink::describe(Traffic traffic, const Transfer& t, bool sending,
                                 const std::exception& e) const {
  const std::string why = reason(e);
  const bool timed_out = why.find("imed out") != std::string::npos;
  std::ostringstream os;
  if (timed_out) {
    os << "timed out after " << timeout_.count() / 1000.0 << " s ";
  } else {
    os << "failed ";
  }
  os << (sending ? "sending the " : "waiting for the ") << traffic_name(traffic)
     << " of micro-batch " << t.m << ", chunk " << t.k << (sending ? " to " : " from ")
     << spec_.peer_name << (timed_out ? "; is it alive? (" : " (") << why << ")";
  return os.str();
}

// gloo's point-to-point operations take the tensor's address as host
// memory: a GPU tensor goes through a host copy (two processes sharing one
// GPU, where NCCL refuses a second rank on the same device). A group with no
// backend for the device is staged too.
bool RemoteLink::through_host(c10::DeviceType device) const {
  if (device == c10::DeviceType::CPU) return false;
  try {
    return group_->getBackend(device)->getBackendName() == "gloo";
  } catch (const std::exception&) {
    return true;
  }
}

std::shared_ptr<Transfer> RemoteLink::post_recv(Traffic traffic, int64_t m, int64_t k,
                                                int64_t chunks, at::IntArrayRef sizes,
                                                const at::TensorOptions& like) {
  auto t = std::make_shared<Transfer>();
  t->m = m;
  t->k = k;
  t->device = like.device();
  t->buffer = at::empty(sizes, through_host(t->device.type()) ? like.device(at::kCPU) : like);
  std::vector<at::Tensor> tensors{t->buffer};
  t->work = group_->recv(tensors, spec_.peer, tag_of(traffic, m, k, chunks));
  std::lock_guard<std::mutex> lock(mu_);
  pending_recvs_.push_back(t);
  return t;
}

at::Tensor RemoteLink::wait_recv(Transfer& t, Traffic traffic) {
  bool ok = false;
  try {
    ok = t.work->wait(timeout_);
  } catch (const std::exception& e) {
    throw std::runtime_error(describe(traffic, t, /*sending=*/false, e));
  }
  if (!ok) throw std::runtime_error(describe(traffic, t, false, std::runtime_error("cancelled")));
  t.done = true;
  if (t.buffer.device() != t.device) return t.buffer.to(t.device);
  // Received in place on the device, into memory the caller's stream
  // allocated: this thread's stream uses it now.
  Stream::current(t.device).uses(t.buffer);
  return t.buffer;
}

void RemoteLink::send(Traffic traffic, int64_t m, int64_t k, int64_t chunks,
                      const at::Tensor& value) {
  auto t = std::make_shared<Transfer>();
  t->m = m;
  t->k = k;
  // The host copy waits for the value on its stream before the send is posted.
  t->buffer = through_host(value.device().type()) ? value.to(at::kCPU).contiguous() : value.contiguous();
  std::vector<at::Tensor> tensors{t->buffer};
  t->work = group_->send(tensors, spec_.peer, tag_of(traffic, m, k, chunks));
  std::lock_guard<std::mutex> lock(mu_);
  pending_sends_.push_back(std::move(t));
}

void RemoteLink::wait_sends(Traffic traffic) {
  std::vector<std::shared_ptr<Transfer>> sends;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sends.swap(pending_sends_);
  }
  for (auto& t : sends) {
    bool ok = false;
    try {
      ok = t->work->wait(timeout_);
    } catch (const std::exception& e) {
      throw std::runtime_error(describe(traffic, *t, /*sending=*/true, e));
    }
    if (!ok) throw std::runtime_error(describe(traffic, *t, true, std::runtime_error("cancelled")));
    t->done = true;
  }
}

void RemoteLink::abort_all() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto* list : {&pending_recvs_, &pending_sends_}) {
    for (auto& t : *list) {
      if (t->done) continue;
      try {
        t->work->abort();
      } catch (...) {  // a backend without abort: the wait's timeout ends it
      }
    }
    list->clear();
  }
}

}  // namespace pipelstm::pipeline
