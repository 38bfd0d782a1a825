// Buffers one owner keeps and writes again and again (a captured CUDA
// graph's outputs), handed out without a copy: each lent tensor reads the
// buffer's memory through a storage of its own, and the owner writes the
// buffers again only once every tensor lent from them is gone (no tensor,
// view, saved tensor or storage reference of them left), which returned()
// says. A lent storage keeps the buffer's memory allocated while it lives
// (the owner may drop its buffers first) and cannot be resized: a resize
// would move it off the buffer. Device-neutral, so that a CPU build tests it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <vector>

namespace pipelstm {

class LentBuffers {
 public:
  // Tensors over `buffers`' memory, with their sizes, strides and offsets
  // (an undefined buffer gives an undefined tensor); forgets what it lent
  // before, which the caller has seen returned().
  std::vector<at::Tensor> lend(const std::vector<at::Tensor>& buffers);

  // Whether every tensor lent so far is gone, so the buffers may be
  // written again.
  bool returned() const;

  // Whether `t` is a tensor some LentBuffers lent (or a view of one): its
  // memory is a buffer's, whose address recurs from call to call.
  static bool is_lent(const at::Tensor& t);

 private:
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> lent_;
};

}  // namespace pipelstm
