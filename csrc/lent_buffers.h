// Buffers one owner keeps and writes again and again (a captured CUDA
// graph's outputs), handed out without a copy: each lent tensor reads the
// buffer's memory through a storage of its own, and the owner writes the
// buffers again only once the memory of every tensor lent from them is let
// go (no tensor, view, saved tensor or storage of them left, and no other
// holder of that storage's memory), which returned() says. A lent storage
// keeps the buffer's memory allocated while it lives (the owner may drop
// its buffers first) and cannot be resized: a resize would move it off the
// buffer. Device-neutral, so that a CPU build tests it.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

namespace pipelstm {

class LentBuffers {
 public:
  // `on_return`: called on the thread that lets a lent tensor's memory go,
  // before returned() can say so, where the owner orders its next write
  // after the work that thread has queued (on CUDA: an event on its current
  // stream); it must not throw.
  using OnReturn = std::function<void()>;
  explicit LentBuffers(OnReturn on_return = {});

  // Tensors over `buffers`' memory, with their sizes, strides and offsets
  // (an undefined buffer gives an undefined tensor). Called once
  // returned() says the last loan is over.
  std::vector<at::Tensor> lend(const std::vector<at::Tensor>& buffers);

  // Whether the memory of every tensor lent so far is let go, so the
  // buffers may be written again.
  bool returned() const;

  // Whether `t` is a tensor some LentBuffers lent (or a view of one): its
  // memory is a buffer's, whose address recurs from call to call.
  static bool is_lent(const at::Tensor& t);

 private:
  std::shared_ptr<std::atomic<int64_t>> out_;  // lent storages' memory not yet let go
  OnReturn on_return_;
};

}  // namespace pipelstm
