#include "lent_buffers.h"

#include <ATen/ATen.h>
#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>

namespace pipelstm {
namespace {

// A lent storage's memory: the buffer's own storage, held until the memory
// is let go (the DataPtr destroyed, wherever torch has moved it: the lent
// StorageImpl itself may go first).
struct Loan {
  c10::Storage buffer;
  std::shared_ptr<std::atomic<int64_t>> out;
  LentBuffers::OnReturn on_return;
};

void release_loan(void* ctx) {
  const auto* loan = static_cast<Loan*>(ctx);
  if (loan->on_return) loan->on_return();
  loan->out->fetch_sub(1, std::memory_order_acq_rel);  // after on_return: returned() then sees its effect
  delete loan;
}

}  // namespace

LentBuffers::LentBuffers(OnReturn on_return)
    : out_(std::make_shared<std::atomic<int64_t>>(0)), on_return_(std::move(on_return)) {}

std::vector<at::Tensor> LentBuffers::lend(const std::vector<at::Tensor>& buffers) {
  std::vector<at::Tensor> lent;
  lent.reserve(buffers.size());
  for (const auto& b : buffers) {
    if (!b.defined()) {
      lent.emplace_back();
      continue;
    }
    const c10::Storage& own = b.storage();
    out_->fetch_add(1, std::memory_order_acq_rel);
    c10::DataPtr alias(own.data_ptr().get(), new Loan{own, out_, on_return_}, &release_loan, own.device());
    auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                                         own.sym_nbytes(), std::move(alias),
                                                         /*allocator=*/nullptr, /*resizable=*/false);
    lent.push_back(at::empty({0}, b.options()).set_(c10::Storage(std::move(storage)), b.storage_offset(),
                                                    b.sizes(), b.strides()));
  }
  return lent;
}

bool LentBuffers::returned() const { return out_->load(std::memory_order_acquire) == 0; }

bool LentBuffers::is_lent(const at::Tensor& t) {
  return t.defined() && t.has_storage() && t.storage().data_ptr().get_deleter() == &release_loan;
}

}  // namespace pipelstm
