#include "huge_pages.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>

#include "../settings.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace pipelstm {
namespace cpu {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kMinBytes = size_t{1} << 20;  // huge_pages.h says why
constexpr size_t kMinSmallBytes = size_t{64} << 10;  // plain pages, kept too (huge_pages.h)
constexpr size_t kPage = size_t{4} << 10;
// Requests cut from a larger kept mapping, and the least left of it kept:
// the huge-page sizes (small ones would pin a large mapping in pieces).
constexpr size_t kMinSplitBytes = kMinBytes;

#if defined(__linux__) && defined(MADV_HUGEPAGE)
struct Mapping {
  void* base;
  size_t length;
  void* origin;  // the base of the mmap it is (a piece of)
};

// Freed mappings kept for the next call, newest first, up to a byte cap
// (PIPELSTM_BUFFER_CACHE_MB, default 1024; 0 keeps none). A kept mapping's
// pages are already faulted in, so a layer called again (every training or
// inference step) writes its workspace without faulting.
//
// Like torch's CUDA caching allocator, a large request that no kept mapping
// fits is cut from the front of a larger one, and a freed mapping is joined
// with kept neighbours: a phase whose buffers differ in size from the last
// one's (a pipeline stage's backward after its forward) reuses the pages
// already resident instead of mapping more beside them, and the next phase
// finds its large buffers whole again. Cuts are made only when a fresh
// mapping would raise the peak. Only pieces of one mapping are
// joined: two mappings the kernel placed side by side, joined, would move
// the next buffer's 2 MiB-aligned start onto pages never touched (the
// alignment slack) and fault them in.
class MappingCache {
 public:
  // A kept mapping that fits `length` bytes: with less than a quarter of
  // them (at least 1 MiB) left over for a large request, less than twice
  // them for a small one. Else, for a large request, the front of the
  // smallest kept mapping that holds it (the rest stays kept), where that
  // one is less than twice its size or a fresh mapping would raise the
  // peak; else none. A large request in a mapping up to twice its size
  // held the rest resident for as long as it lived: at the full size of
  // bench distributed with 2 micro-batches, each item's log-softmax (20
  // MiB) sat in a 41 MiB mapping of the decoder's weight gradient, and the
  // last stage's resident set rose 1202 MiB in a step instead of 851.
  Mapping* take(size_t length) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto best = kept_.end();
    const bool large = length >= kMinSplitBytes;
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      const size_t have = (*it)->length;
      if (have < length) continue;
      const bool fits = large ? have - length < std::max(kMinSplitBytes, length / 4) : have < 2 * length;
      if (fits) {
        Mapping* m = *it;
        kept_.erase(it);
        bytes_ -= m->length;
        ++hits_;
        return m;
      }
      if (best == kept_.end() || have < (*best)->length) best = it;
    }
    if (!large || best == kept_.end()) return miss();
    // A mapping of twice the request or more is cut only where a fresh
    // mapping would take the process past the most it has mapped: under
    // that, a fresh one costs no peak, and cutting whole buffers that later
    // calls want again would (their pieces, held by tensors that live on,
    // keep them from joining again). A smaller one is cut in any case:
    // taken whole, its rest would stay resident unused.
    if (mapped_ + length <= peak_ && (*best)->length >= 2 * length) return miss();
    ++hits_;
    Mapping* rest = *best;
    const size_t cut = (length + kPage - 1) & ~(kPage - 1);
    if (rest->length - cut < kMinSplitBytes) {  // too little left to keep: take it whole
      kept_.erase(best);
      bytes_ -= rest->length;
      return rest;
    }
    auto* front = new Mapping{rest->base, cut, rest->origin};
    rest->base = static_cast<char*>(rest->base) + cut;
    rest->length -= cut;
    bytes_ -= cut;
    return front;
  }

  void give(Mapping* m) {
    const size_t cap = cap_bytes();
    std::deque<Mapping*> drop;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (m->length <= cap) merge_neighbours(m);
      if (m->length <= cap) {
        kept_.push_front(m);
        bytes_ += m->length;
      } else {
        drop.push_back(m);
      }
      while (bytes_ > cap) {
        drop.push_back(kept_.back());
        bytes_ -= kept_.back()->length;
        kept_.pop_back();
      }
      for (const Mapping* d : drop) mapped_ -= d->length;
    }
    for (Mapping* d : drop) {
      munmap(d->base, d->length);
      delete d;
    }
  }

  // A fresh mmap of `length` bytes, now in use.
  void mapped(size_t length) {
    std::lock_guard<std::mutex> lock(mutex_);
    mapped_ += length;
    peak_ = std::max(peak_, mapped_);
  }

  BufferCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto i = [](size_t v) { return static_cast<int64_t>(v); };
    return {i(bytes_), i(kept_.size()), i(mapped_ - bytes_), i(mapped_), i(peak_), i(hits_), i(misses_)};
  }

  // Unmaps every kept mapping; returns their bytes.
  int64_t empty() {
    std::deque<Mapping*> drop;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      drop.swap(kept_);
      mapped_ -= bytes_;
      bytes_ = 0;
    }
    int64_t released = 0;
    for (Mapping* d : drop) {
      released += static_cast<int64_t>(d->length);
      munmap(d->base, d->length);
      delete d;
    }
    return released;
  }

 private:
  Mapping* miss() {
    ++misses_;
    return nullptr;
  }

  // Joins m with the kept pieces of its mapping that end where it starts or
  // start where it ends, taking them out of the cache.
  void merge_neighbours(Mapping* m) {
    for (auto it = kept_.begin(); it != kept_.end();) {
      Mapping* k = *it;
      char* const k_end = static_cast<char*>(k->base) + k->length;
      char* const m_end = static_cast<char*>(m->base) + m->length;
      if (k->origin == m->origin && (k_end == m->base || m_end == k->base)) {
        if (k_end == m->base) m->base = k->base;
        m->length += k->length;
        bytes_ -= k->length;
        delete k;
        kept_.erase(it);
        it = kept_.begin();  // m grew: its new ends may meet another
      } else {
        ++it;
      }
    }
  }

  // Read per free: cheap beside munmap. A free cannot raise: a bad value
  // keeps nothing (allocate() has raised on it already).
  static size_t cap_bytes() { return settings::buffer_cache_bytes_or_none(); }

  std::mutex mutex_;
  std::deque<Mapping*> kept_;
  size_t bytes_ = 0;  // kept
  size_t mapped_ = 0, peak_ = 0;  // mapped (in use or kept), now and at most
  size_t hits_ = 0, misses_ = 0;  // requests served by a kept mapping (whole or cut), or not
};

MappingCache& cache() {
  static auto* c = new MappingCache();  // never destroyed: frees may come at exit
  return *c;
}

void unmap(void* ctx) { cache().give(static_cast<Mapping*>(ctx)); }
#endif

void* align(void* base) {
  return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) &
                                 ~(kHugePage - 1));
}

c10::Device cpu_device() { return c10::Device(c10::DeviceType::CPU); }

class HugePageAllocator final : public c10::Allocator {
 public:
  explicit HugePageAllocator(size_t min_bytes) : min_bytes_(min_bytes) {}

  c10::DataPtr allocate(size_t n) override {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (n >= kMinSmallBytes) {
      // From min_bytes_ 2 MiB-aligned on huge pages (room to align the
      // start), below on plain pages. A kept mapping serves requests of
      // more than half its length only, so the two kinds never mix.
      const bool huge = n >= min_bytes_;
      const size_t length = huge ? n + kHugePage : (n + kPage - 1) & ~(kPage - 1);
      (void)settings::buffer_cache_bytes();  // raises on a bad PIPELSTM_BUFFER_CACHE_MB (a free cannot)
      Mapping* m = cache().take(length);
      if (m == nullptr) {
        void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base != MAP_FAILED) {
          // a hint: without THP, plain pages
          if (huge) madvise(align(base), length - kHugePage, MADV_HUGEPAGE);
          m = new Mapping{base, length, base};
          cache().mapped(length);
        }
      }
      if (m != nullptr) return {huge ? align(m->base) : m->base, m, &unmap, cpu_device()};
    }
#endif
    return c10::GetCPUAllocator()->allocate(n);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  size_t min_bytes_;
};

HugePageAllocator& allocator() {
  static HugePageAllocator buffers(kMinBytes);
  return buffers;
}

}  // namespace

at::Tensor empty_huge(at::IntArrayRef sizes, const at::TensorOptions& options) {
  TORCH_INTERNAL_ASSERT(options.device().is_cpu());
  return at::detail::empty_generic(sizes, &allocator(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   c10::typeMetaToScalarType(options.dtype()), std::nullopt);
}

BufferCacheStats buffer_cache_stats() {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  return cache().stats();
#else
  return {};
#endif
}

int64_t empty_buffer_cache() {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  return cache().empty();
#else
  return 0;
#endif
}

}  // namespace cpu
}  // namespace pipelstm
