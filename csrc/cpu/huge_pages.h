// Large CPU buffers on transparent huge pages.
//
// A layer allocates its workspace, outputs and gradients afresh on every
// call (autograd keeps them), and a fresh buffer costs a page fault per
// 4 KiB on first touch, which is slow on virtual machines (docs/cpu.md,
// "Memory"). Buffers of 1 MiB and more are therefore mapped 2 MiB-aligned
// with MADV_HUGEPAGE (512 times fewer faults for each whole 2 MiB; with THP
// in madvise mode, a buffer under 2 MiB gets none, only the cache below),
// and freed ones are kept for the next call of about their size, up to
// PIPELSTM_BUFFER_CACHE_MB, so repeated calls do not fault at all; where a
// fresh mapping would raise the peak, a large request is cut from a larger
// kept one, whose pieces join again when freed. glibc's heap does not
// reliably keep such buffers: with other allocations between our calls it
// trims or maps afresh, and without the cache a fresh huge-page mapping per
// call would zero each 2 MiB page again. Buffers from 64 KiB to 1 MiB are
// mapped on plain pages and kept the same way: the pipeline's stage
// threads, started for each pass, would each free into a glibc arena that
// is trimmed and faulted in again on the next step. Smaller buffers, and
// systems without MADV_HUGEPAGE, get torch's ordinary CPU allocation.
// Packed weights (the recurrent weights, read whole at every time step,
// and the panels of a layer's GEMMs) go the same way: on huge pages they
// stay within the TLB's reach, and through the cache they do not fault
// either. The tensors are ordinary CPU tensors (resizable; freed when the
// last reference goes).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace pipelstm {
namespace cpu {

// An uninitialised CPU tensor: from 1 MiB on huge pages, from 64 KiB on
// plain pages, through the cache.
at::Tensor empty_huge(at::IntArrayRef sizes, const at::TensorOptions& options);

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
