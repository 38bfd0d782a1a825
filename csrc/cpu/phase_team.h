// Runs a time loop's phases in order on a few threads, with one spin
// barrier between phases instead of a fork and join per step.
//
// Phase s is split into chunks(s) pieces that may run at once; no piece of
// phase s starts before every piece of phase s-1 is done. Pieces are claimed,
// not assigned: each thread first claims the chunks of its own index (so a
// thread keeps working on the same weight panels, in its own cache), then
// any left over. A thread the runtime did not start, or started late, only
// means that the others claim its chunks: nothing ever waits for a thread,
// only for claimed work, so the loop cannot deadlock whatever the thread
// pool does.
#pragma once

#include <ATen/Parallel.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace pipelstm {
namespace cpu {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#endif
}

// The chunk c of n items split in `chunks`: [begin, end).
inline std::pair<int64_t, int64_t> chunk_range(int64_t n, int64_t chunks, int64_t c) {
  return {n * c / chunks, n * (c + 1) / chunks};
}

// chunks(s) -> int64_t (1 <= chunks(s) <= threads); piece(s, c, chunks(s)).
template <typename Chunks, typename Piece>
void run_phases(int64_t phases, int threads, Chunks&& chunks, Piece&& piece) {
  if (threads <= 1 || at::in_parallel_region()) {
    for (int64_t s = 0; s < phases; ++s) {
      const int64_t n = chunks(s);
      for (int64_t c = 0; c < n; ++c) piece(s, c, n);
    }
    return;
  }
  // Pieces done by the end of each phase.
  std::vector<int64_t> done_by(phases);
  int64_t total = 0;
  for (int64_t s = 0; s < phases; ++s) done_by[s] = total += chunks(s);
  std::vector<std::atomic<int64_t>> claimed(threads);  // the last phase each chunk ran in
  for (auto& c : claimed) c.store(-1, std::memory_order_relaxed);
  std::atomic<int64_t> done{0};

  at::parallel_for(0, threads, 1, [&](int64_t own_begin, int64_t own_end) {
    for (int64_t s = 0; s < phases; ++s) {
      const int64_t n = chunks(s);
      auto try_run = [&](int64_t c) {
        int64_t last = claimed[c].load(std::memory_order_relaxed);
        while (last < s) {
          if (claimed[c].compare_exchange_weak(last, s, std::memory_order_acq_rel)) {
            piece(s, c, n);
            done.fetch_add(1, std::memory_order_acq_rel);
            return;
          }
        }
      };
      for (int64_t c = own_begin; c < own_end && c < n; ++c) try_run(c);
      for (int64_t c = 0; c < n; ++c) try_run(c);
      for (int spins = 0; done.load(std::memory_order_acquire) < done_by[s]; ++spins) {
        if (spins < 4096) {
          cpu_relax();
        } else {
          std::this_thread::yield();  // more threads than cores: let the worker run
        }
      }
    }
  });
}

}  // namespace cpu
}  // namespace pipelstm
