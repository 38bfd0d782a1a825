#include "graph_replay_cuda.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "../graph_captures.h"
#include "../log_sink.h"
#include "../settings.h"

namespace pipelstm {
namespace cuda {
namespace {

// Keys kept at once (each with up to three captures, graph_captures.h),
// least recently used dropped first. Each graph holds its body's outputs
// and intermediates in a private memory pool, so the cache is bounded by
// count and by the device memory its graphs reserved, at most
// 1/kGraphMemoryShare of the device's (unbounded, the pools of many sizes
// fill the device: docs/design/cuda.md). The count fits a deep layer
// wavefront's keys (each layer's chunk shapes on its own stream, forward,
// and backward once for each capture of the forward, which lent it its
// output and workspace): fewer, and every call would capture anew and drop
// a graph (a device synchronisation).
constexpr size_t kMaxKeys = 128;
constexpr int64_t kGraphMemoryShare = 8;

// PIPELSTM_CUDA_GRAPHS=1: every call; 0: none; auto (or unset): the op's
// choice (settings.h).
bool graphs_requested(bool by_default) {
  return settings::cuda_graphs().value_or(by_default);  // read per call: cheap beside a launch
}

// Where a replay's lent outputs are let go on a stream other than the one
// the graph replays on (autograd lets a gradient go on the stream of the
// node that consumed it): an event there, which the next replay waits
// for, as the allocator's record_stream makes a reuse of its memory wait.
class ReturnEvents {
 public:
  explicit ReturnEvents(const at::cuda::CUDAStream& replay) : replay_(replay) {}
  ReturnEvents(const ReturnEvents&) = delete;
  ReturnEvents& operator=(const ReturnEvents&) = delete;
  ~ReturnEvents() {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  }

  // From a lent storage's deleter, on the thread letting it go.
  void note_return() noexcept {
    try {
      const c10::cuda::CUDAGuard guard(replay_.device_index());
      const at::cuda::CUDAStream current = at::cuda::getCurrentCUDAStream(replay_.device_index());
      if (current == replay_) return;  // in the replay's own order already
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      cudaEvent_t event = nullptr;
      if (cudaStreamIsCapturing(current.stream(), &status) != cudaSuccess ||
          status != cudaStreamCaptureStatusNone ||
          cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
      }
      if (cudaEventRecord(event, current.stream()) != cudaSuccess) {
        (void)cudaEventDestroy(event);
        (void)cudaGetLastError();
        return;
      }
      const std::lock_guard<std::mutex> lock(mutex_);
      events_.push_back(event);
    } catch (...) {
    }
  }

  // Before a replay, on the replay stream.
  void order_replay() {
    std::vector<cudaEvent_t> events;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      events.swap(events_);
    }
    cudaError_t err = cudaSuccess;
    for (cudaEvent_t e : events) {  // every one destroyed, even after an error
      if (err == cudaSuccess) err = cudaStreamWaitEvent(replay_.stream(), e, 0);
      (void)cudaEventDestroy(e);
    }
    C10_CUDA_CHECK(err);
  }

 private:
  const at::cuda::CUDAStream replay_;
  std::mutex mutex_;
  std::vector<cudaEvent_t> events_;
};

struct CudaGraph {
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::shared_ptr<ReturnEvents> returns;  // shared with the lent storages' deleters

  void replay() {
    returns->order_replay();
    graph->replay();
  }
};

using Captures = GraphCaptures<CudaGraph>;

struct Entry {
  std::mutex mutex;  // one call at a time picks and replays the key's captures
  bool warmed_up = false;
  bool uncapturable = false;  // its first capture failed: always eager
  bool more_captures = true;  // a further capture failed: none made again
  c10::DeviceIndex device = 0;
  Captures captures;
  std::atomic<int64_t> bytes{0};  // device memory its captures hold

  // Dropped from the cache: a replay may still be running, and the graphs'
  // memory pools go back to the allocator with them (outputs still lent
  // keep their blocks until they are gone).
  ~Entry() {
    if (captures.empty()) return;
    note_graph_memory(-bytes.load());
    const c10::cuda::CUDAGuard guard(device);
    (void)cudaDeviceSynchronize();  // an error here would be a sticky one, raised by the next call
  }
};

class GraphCache {
 public:
  std::shared_ptr<Entry> get(const std::vector<int64_t>& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->first == key) {
        entries_.splice(entries_.begin(), entries_, it);
        return entries_.front().second;
      }
    }
    entries_.emplace_front(key, std::make_shared<Entry>());
    // A dropped entry lives on while a call still holds it.
    if (entries_.size() > kMaxKeys) entries_.pop_back();
    return entries_.front().second;
  }

  // Drops the least recently used graphs, never the newest, while they
  // hold more than `limit` bytes.
  void trim(int64_t limit) {
    std::vector<std::shared_ptr<Entry>> dropped;  // destroyed (a device sync each) outside the lock
    {
      std::lock_guard<std::mutex> lock(mutex_);
      int64_t bytes = 0;
      for (const auto& e : entries_) bytes += e.second->bytes.load();
      while (entries_.size() > 1 && bytes > limit) {
        bytes -= entries_.back().second->bytes.load();
        dropped.push_back(std::move(entries_.back().second));
        entries_.pop_back();
      }
    }
  }

 private:
  std::mutex mutex_;
  std::list<std::pair<std::vector<int64_t>, std::shared_ptr<Entry>>> entries_;
};

// The device memory a graph's private pool holds: the segments torch's
// caching allocator made for it. (The rise of the allocator's reserved
// total over the capture undercounts it: to make room the allocator may
// free cached blocks meanwhile, and the graph cache then grew past its
// bound until the device ran out of memory.)
int64_t pool_bytes(const c10::MempoolId_t& pool) {
  int64_t bytes = 0;
  const auto snapshot = c10::cuda::CUDACachingAllocator::snapshot(pool, /*include_traces=*/false);
  for (const auto& segment : snapshot.segments) {
    if (segment.owner_private_pool_id == pool) bytes += static_cast<int64_t>(segment.total_size);
  }
  return bytes;
}

GraphCache& cache() {
  static auto* c = new GraphCache();  // never destroyed: graphs may outlive static teardown
  return *c;
}

// Streams only captures use: one for each stream graphs are replayed on
// (the caller's current stream, which is part of the cache's key), made on
// first use and kept. Not torch's pool: it hands its streams out in turn, so
// a pool stream may be another thread's current stream (a pipeline
// stage's), whose launches would then meet this capture (on an H200 they
// were refused: cudaErrorStreamCaptureUnsupported; docs/design/cuda.md). And not
// one stream for every capture: cuBLAS gives each stream a workspace of its
// own and a captured GEMM keeps the capture stream's, so two graphs
// replayed at once on two streams (a layer wavefront's) must not have been
// captured on one stream; graphs replayed on one stream run one after
// another and may share it.
class CaptureStreams {
 public:
  struct Slot {
    std::mutex capturing;  // one capture at a time on a stream
    cudaStream_t stream = nullptr;
  };

  Slot& slot_for(const at::cuda::CUDAStream& replay) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = slots_[{replay.device_index(), replay.stream()}];
    if (!slot) {
      slot = std::make_unique<Slot>();
      // The caller's CUDAGuard has made the device current.
      C10_CUDA_CHECK(cudaStreamCreateWithFlags(&slot->stream, cudaStreamNonBlocking));
    }
    return *slot;
  }

 private:
  std::mutex mutex_;
  // Never destroyed, nor their streams: kept for the next capture.
  std::map<std::pair<c10::DeviceIndex, cudaStream_t>, std::unique_ptr<Slot>> slots_;
};

CaptureStreams& capture_streams() {
  static auto* s = new CaptureStreams();  // never destroyed, like the cache
  return *s;
}

// The capture stream of graphs replayed on `replay`, held until the
// capture is over (or fails).
class CaptureStreamLease {
 public:
  explicit CaptureStreamLease(const at::cuda::CUDAStream& replay)
      : slot_(capture_streams().slot_for(replay)),
        lock_(slot_.capturing),
        stream_(at::cuda::getStreamFromExternal(slot_.stream, replay.device_index())) {}
  CaptureStreamLease(const CaptureStreamLease&) = delete;
  CaptureStreamLease& operator=(const CaptureStreamLease&) = delete;
  const at::cuda::CUDAStream& stream() const { return stream_; }

 private:
  CaptureStreams::Slot& slot_;
  std::unique_lock<std::mutex> lock_;
  at::cuda::CUDAStream stream_;
};

// Captures body(c.inputs) into c.graph on a stream of its own (capture
// needs a stream other than the default one), ordered after and before the
// current stream's work.
void capture(Captures::Capture& e, const GraphBody& body, const at::cuda::CUDAStream& current) {
  const CaptureStreamLease lease(current);
  const at::cuda::CUDAStream& side = lease.stream();
  at::cuda::CUDAEvent ready;
  ready.record(current);
  ready.block(side);
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    // Thread-local: the pipeline's stages launch work from other threads
    // while one of them captures.
    graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      e.outputs = body(e.inputs);
    } catch (...) {
      try {
        graph->capture_end();
      } catch (...) {
      }
      e.outputs.clear();
      throw;
    }
    graph->capture_end();
  }
  at::cuda::CUDAEvent done;
  done.record(side);
  done.block(current);
  auto returns = std::make_shared<ReturnEvents>(current);
  e.graph = std::make_unique<CudaGraph>(CudaGraph{std::move(graph), returns});
  e.lent = LentBuffers([returns] { returns->note_return(); });
}

}  // namespace

std::optional<std::vector<at::Tensor>> run_as_graph(const std::vector<int64_t>& op_key,
                                                    const std::vector<at::Tensor>& inputs,
                                                    const GraphBody& body, bool by_default) {
  if (!graphs_allowed_on_this_thread() || !graphs_requested(by_default) || inputs.empty()) {
    return std::nullopt;
  }
  const c10::Device device = inputs.front().device();
  for (const auto& t : inputs) {
    if (t.device() != device) return std::nullopt;
  }
  const c10::cuda::CUDAGuard guard(device);
  const at::cuda::CUDAStream current = at::cuda::getCurrentCUDAStream();
  // Inside the caller's own capture (torch.cuda.graph), the step loop's
  // launches become part of that graph: nothing to add, and a capture
  // cannot nest.
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
    return std::nullopt;
  }
  std::vector<int64_t> key = op_key;
  key.push_back(device.index());
  key.push_back(static_cast<int64_t>(current.id()));
  // The settings that pick cuBLAS's kernels at capture: a replay after the
  // user changed one would run the old choice.
  const auto& ctx = at::globalContext();
  key.push_back(ctx.allowTF32CuBLAS());
  key.push_back(ctx.allowTF32CuDNN(at::Float32Op::RNN));  // the layers' GEMMs follow it (layer_gemm.h)
  key.push_back(static_cast<int64_t>(ctx.float32MatmulPrecision()));
  key.push_back(static_cast<int64_t>(ctx.allowFP16ReductionCuBLAS()));
  key.push_back(static_cast<int64_t>(ctx.allowBF16ReductionCuBLAS()));
  key.push_back(ctx.deterministicAlgorithms());
  const std::shared_ptr<Entry> entry = cache().get(key);
  std::unique_lock<std::mutex> lock(entry->mutex);
  if (!entry->warmed_up || entry->uncapturable) {
    entry->warmed_up = true;  // this call runs eagerly: cuBLAS and the kernels initialise outside a capture
    return std::nullopt;
  }
  entry->device = device.index();
  std::optional<Captures::Run> run;
  bool capture_failed = false;  // an error of a replay itself is raised
  try {
    run = entry->captures.run(inputs, [&](Captures::Capture& c) {
      capture_failed = true;
      capture(c, body, current);
      capture_failed = false;
    }, entry->more_captures);
  } catch (const std::exception& e) {
    if (!capture_failed) throw;
    // Something in the body cannot be captured (say, a launch kind this
    // driver does not record, or no memory for another pool): this call
    // runs its step loop, and the key makes no capture again.
    (void)cudaGetLastError();  // a capture error is not sticky: clear it
    const bool first = entry->captures.empty();
    entry->uncapturable = first;
    entry->more_captures = false;
    const std::string what = first ? "; these calls run eagerly from now on ("
                                   : "; these calls run eagerly while its other captures' outputs are held (";
    TORCH_WARN("pipelstm: a layer op's time loop could not be captured as a CUDA graph", what, e.what(), ")");
    const std::string message =
        std::string("CUDA graph: capture failed on cuda:") + std::to_string(device.index()) + what + e.what() + ")";
    lock.unlock();  // the sink takes the GIL (log_sink.h)
    log_message(LogLevel::kWarning, message);
    return std::nullopt;
  }
  if (!run) return std::nullopt;  // every capture's outputs held, and no more are made
  const bool captured = run->captured != nullptr;
  if (captured) {
    const int64_t bytes = pool_bytes(run->captured->graph->graph->pool());
    entry->bytes += bytes;
    note_graph_memory(bytes);
    cache().trim(static_cast<int64_t>(at::cuda::getDeviceProperties(device.index())->totalGlobalMem) /
                 kGraphMemoryShare);
    note_graph_capture();
  }
  note_graph_replay();
  lock.unlock();  // the sink takes the GIL (log_sink.h)
  if (captured) {
    log_message(LogLevel::kInfo, "CUDA graph: captured a layer op's time loop on cuda:" +
                                     std::to_string(device.index()) + "; later calls like it replay it");
  }
  return std::move(run->outputs);
}

}  // namespace cuda
}  // namespace pipelstm
