// A layer op's time loop replayed as a captured graph: the parts every
// build has (the thread switch, the counts, the key). The CUDA backend
// captures and replays (cuda/graph_replay_cuda.h). The loop launches a GEMM and a
// pointwise kernel per step, and at small sizes the host time of those
// launches, not the arithmetic, is the op's time: a graph launches them all
// at once.
//
// The op hands over its body as a function of the tensors that change from
// call to call (`inputs`: the sequence, the states, the output gradients);
// everything else the body reads (the weights) it reads in place, so their
// addresses, like every shape and flag the body's launches depend on, are
// part of the `key` the op builds. A graph is captured on the second call
// with a key (the first one runs eagerly: it is the warm-up that
// initialises cuBLAS outside the capture) and replayed from then on: the
// inputs are copied into the graph's own, the graph is replayed on the
// current stream, and its outputs are handed out as they are, not copied
// (lent_buffers.h). A graph is replayed again only once nothing the caller
// kept of its outputs is left, so a key may hold a second capture, for the
// loop whose last outputs are still held at the next call, and a third that
// hands out copies, for a call while both are out. Weights updated in place
// (an optimizer step) are read afresh by each replay; a weight replaced by
// another tensor has another address, hence another key.
//
// PIPELSTM_CUDA_GRAPHS=1 graphs every call, =0 none; unset, the op says per
// call (`by_default`): where its launches, not its arithmetic, set the time.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace pipelstm {

using GraphBody = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// While alive, the layer ops called on this thread run their step loop,
// whatever PIPELSTM_CUDA_GRAPHS says. The pipeline's stage threads hold one:
// they launch on one device at once, and a capture among them failed on an
// H200 (cudaErrorStreamCaptureUnsupported in the stage beside it;
// tests/gpu/test_gpu_stack.py). Captures now run on streams of their own
// (graph_replay_cuda.cpp), the likely fix; this guard stays until a GPU run
// shows stages graphing safely.
class NoGraphsOnThisThread {
 public:
  NoGraphsOnThisThread();
  ~NoGraphsOnThisThread();
  NoGraphsOnThisThread(const NoGraphsOnThisThread&) = delete;
  NoGraphsOnThisThread& operator=(const NoGraphsOnThisThread&) = delete;

 private:
  bool saved_;
};

// Whether the layer ops called on this thread may run as graphs (no
// NoGraphsOnThisThread alive on it).
bool graphs_allowed_on_this_thread();

// How many graphs this process captured and replayed (for tests and
// benchmarks: pipelstm._C._graph_counts()); runners count through note_*.
struct GraphCounts {
  int64_t captures = 0, replays = 0;
};
GraphCounts graph_counts();
void note_graph_capture();
void note_graph_replay();

// Device memory the cached graphs hold now, in bytes (what their captures
// reserved; pipelstm._C._graph_memory()); runners add a graph's when they
// capture it and take it off when they drop it.
int64_t graph_memory();
void note_graph_memory(int64_t delta);

// Adds a tensor's dtype, sizes and strides to a key, and its address when
// the body reads it in place (an undefined tensor adds a marker).
void add_to_key(std::vector<int64_t>& key, const at::Tensor& t, bool in_place);

}  // namespace pipelstm
