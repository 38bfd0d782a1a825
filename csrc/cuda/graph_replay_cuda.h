// The CUDA graphs of the layer ops (graph_replay.h describes the scheme):
// captures an op's body once per key and replays it. Compiled only in a CUDA
// build.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "../graph_replay.h"

namespace pipelstm {
namespace cuda {

// The body's outputs, run as a graph, or nullopt where this call runs
// eagerly (warm-up, capture impossible, graphs off, not allowed on this
// thread): then the caller runs body(inputs) itself. `by_default`: whether
// to graph the call when PIPELSTM_CUDA_GRAPHS is unset. Every input must be
// on one CUDA device.
std::optional<std::vector<at::Tensor>> run_as_graph(const std::vector<int64_t>& key,
                                                    const std::vector<at::Tensor>& inputs,
                                                    const GraphBody& body, bool by_default);

}  // namespace cuda
}  // namespace pipelstm
