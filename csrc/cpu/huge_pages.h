// Large CPU buffers on transparent huge pages.
//
// A layer allocates its workspace, outputs and gradients afresh on every
// call (autograd keeps them), and a fresh buffer costs a page fault per
// 4 KiB on first touch. On virtual machines those faults are slow (on the
// development VM a GEMM writing a fresh buffer of tens of MiB was visibly
// slower than one writing a reused buffer, and not on huge pages; see
// docs/cpu.md, "Memory"). Buffers of 1 MiB and more are therefore mapped
// 2 MiB-aligned with MADV_HUGEPAGE (512 times fewer faults for each whole
// 2 MiB; with THP in madvise mode, a buffer under 2 MiB gets none, only
// the cache below), and freed ones are kept for the next call of about
// their size, up to PIPELSTM_BUFFER_CACHE_MB (docs/cpu.md), so repeated
// calls do not fault at all; where a fresh mapping would raise the peak, a
// large request is cut from a larger kept one, whose pieces join again
// when freed. glibc's heap, which served buffers below
// 32 MiB before, does not reliably keep them: with nn.LSTM's calls
// between ours (a bench, or any model with other layers), glibc trimmed
// or mapped afresh and one
// forward in three at H=256 B=32 T=128 (2 threads, 20 MiB of workspace)
// took 17-20 ms instead of 11 (faults). Without the cache a fresh
// huge-page mapping per call (zeroing each 2 MiB page) made the forward at
// H=64 B=32 T=128 twice as slow with a 4 MiB bound (bench grid,
// docs/cpu.md). Buffers from 64 KiB to 1 MiB are mapped on plain pages and
// kept the same way: glibc serves them from its arenas, and the pipeline's
// stage threads, started for each pass, each free into an arena that glibc
// trims (madvise) and faults in again on the next step (bench pipeline's
// small model, 2 stages, K = 8: a step of 0.056-0.058 s in a process of
// its own against 0.048 with glibc's thresholds raised; 0.048-0.052 with
// these kept). Smaller buffers, and systems without MADV_HUGEPAGE, get
// torch's ordinary CPU allocation. Packed weights (the recurrent weights,
// read whole at every time step, and the panels of a layer's GEMMs) go the
// same way: on huge pages they stay within the TLB's reach, and through
// the cache they do not fault either (docs/cpu.md, "Memory"). The tensors
// are ordinary CPU tensors (resizable; freed when the last reference goes).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace pipelstm {
namespace cpu {

// An uninitialised CPU tensor: from 1 MiB on huge pages, from 64 KiB on
// plain pages, through the cache.
at::Tensor empty_huge(at::IntArrayRef sizes, const at::TensorOptions& options);

// empty_huge on the CPU, at::empty elsewhere.
at::Tensor empty_buffer(at::IntArrayRef sizes, const at::TensorOptions& options);

// The cache of freed buffers and the mappings behind empty_huge
// (pipelstm.memory_stats()). Bytes are whole mappings, alignment room
// included. Zero where buffers are not mapped (no MADV_HUGEPAGE).
struct BufferCacheStats {
  int64_t kept_bytes = 0, kept_mappings = 0;  // freed, kept for the next request
  int64_t in_use_bytes = 0;                   // held by tensors
  int64_t mapped_bytes = 0, peak_mapped_bytes = 0;  // in use or kept: now, and the most so far
  int64_t hits = 0, misses = 0;  // requests served by a kept mapping (whole or cut), or mapped afresh
};
BufferCacheStats buffer_cache_stats();

// Unmaps every kept buffer (pipelstm.empty_cache()); buffers in use stay
// mapped. Returns the bytes unmapped.
int64_t empty_buffer_cache();

}  // namespace cpu
}  // namespace pipelstm
