#include "huge_pages.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace pipelstm {
namespace cpu {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kMinBytes = size_t{32} << 20;

#if defined(__linux__) && defined(MADV_HUGEPAGE)
struct Mapping {
  void* base;
  size_t length;
};

void unmap(void* ctx) {
  auto* m = static_cast<Mapping*>(ctx);
  munmap(m->base, m->length);
  delete m;
}
#endif

class HugePageAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (n >= kMinBytes) {
      const size_t length = n + kHugePage;  // room to align the start
      void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (base != MAP_FAILED) {
        const auto start = (reinterpret_cast<uintptr_t>(base) + kHugePage - 1) & ~(kHugePage - 1);
        void* data = reinterpret_cast<void*>(start);
        madvise(data, n, MADV_HUGEPAGE);  // a hint: without THP, plain pages
        return {data, new Mapping{base, length}, &unmap, c10::Device(c10::DeviceType::CPU)};
      }
    }
#endif
    return c10::GetCPUAllocator()->allocate(n);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

HugePageAllocator& allocator() {
  static HugePageAllocator a;
  return a;
}

}  // namespace

at::Tensor empty_huge(at::IntArrayRef sizes, const at::TensorOptions& options) {
  TORCH_INTERNAL_ASSERT(options.device().is_cpu());
  return at::detail::empty_generic(sizes, &allocator(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   c10::typeMetaToScalarType(options.dtype()), std::nullopt);
}

at::Tensor empty_buffer(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return options.device().is_cpu() ? empty_huge(sizes, options) : at::empty(sizes, options);
}

}  // namespace cpu
}  // namespace pipelstm
