// Links from a pipeline's first and last local stage to the stages in other
// processes: torch.distributed point-to-point operations on a c10d process
// group (gloo on the CPU, NCCL on GPUs; GPU tensors over gloo through a
// host copy), posted ahead and waited on with a timeout, so that a dead or
// stopped peer ends in an error naming it instead of a hang.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace pipelstm::pipeline {

// A stage in another process.
struct RemoteSpec {
  std::string group_name;  // the c10d group (torch.distributed ProcessGroup.group_name)
  int peer = -1;           // the peer's rank in that group
  std::string peer_name;   // for messages, e.g. "stage 0 (rank 0)"
};

// What a pass exchanges with one peer.
enum class Traffic { Activations = 0, Gradients = 1 };

// One posted receive or send.
struct Transfer {
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor buffer;  // on the host where the link stages through it
  c10::Device device = c10::Device(c10::DeviceType::CPU);  // where a received value goes
  int64_t m = 0, k = 0;
  bool done = false;
};

class RemoteLink {
 public:
  RemoteLink(const RemoteSpec& spec, std::chrono::milliseconds timeout);

  // Posts the receive of (m, k) into a new buffer (`like`'s options).
  std::shared_ptr<Transfer> post_recv(Traffic traffic, int64_t m, int64_t k, int64_t chunks,
                                      at::IntArrayRef sizes, const at::TensorOptions& like);
  // Waits for a posted receive; raises naming the peer and what was awaited
  // (the caller adds which stage was waiting).
  at::Tensor wait_recv(Transfer& t, Traffic traffic);
  // Sends (m, k) without waiting; wait_sends() waits for all of them.
  void send(Traffic traffic, int64_t m, int64_t k, int64_t chunks, const at::Tensor& value);
  void wait_sends(Traffic traffic);
  // Cancels every pending operation (another stage of the pass failed).
  void abort_all() noexcept;
  const RemoteSpec& spec() const { return spec_; }

 private:
  std::string describe(Traffic traffic, const Transfer& t, bool sending,
                       const std::exception& e) const;
  // Whether tensors on `device` go through a host copy (a gloo group).
  bool through_host(c10::DeviceType device) const;

  RemoteSpec spec_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::vector<std::shared_ptr<Transfer>> pending_recvs_, pending_sends_;
};

}  // namespace pipelstm::pipeline
