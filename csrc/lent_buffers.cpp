#include "lent_buffers.h"

#include <ATen/ATen.h>
#include <c10/core/Storage.h>

#include <algorithm>

namespace pipelstm {
namespace {

// The lent storage's context: the buffer's own storage, held until the
// last tensor lent from it is gone.
void release_buffer(void* keep) { delete static_cast<c10::Storage*>(keep); }

}  // namespace

std::vector<at::Tensor> LentBuffers::lend(const std::vector<at::Tensor>& buffers) {
  lent_.clear();
  std::vector<at::Tensor> out;
  out.reserve(buffers.size());
  for (const auto& b : buffers) {
    if (!b.defined()) {
      out.emplace_back();
      continue;
    }
    const c10::Storage& own = b.storage();
    c10::DataPtr alias(own.data_ptr().get(), new c10::Storage(own), &release_buffer, own.device());
    auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                                         own.sym_nbytes(), std::move(alias),
                                                         /*allocator=*/nullptr, /*resizable=*/false);
    lent_.emplace_back(storage);
    out.push_back(at::empty({0}, b.options()).set_(c10::Storage(std::move(storage)), b.storage_offset(),
                                                   b.sizes(), b.strides()));
  }
  return out;
}

bool LentBuffers::is_lent(const at::Tensor& t) {
  return t.defined() && t.has_storage() && t.storage().data_ptr().get_deleter() == &release_buffer;
}

bool LentBuffers::returned() const {
  return std::all_of(lent_.begin(), lent_.end(), [](const auto& s) { return s.expired(); });
}

}  // namespace pipelstm
