// The captures of one graph key (graph_replay.h) and which one a call
// replays. A lending capture hands out its own outputs (lent_buffers.h)
// and is replayed again only once they are all gone; a copying one hands
// out copies, so it can always be replayed. A call replays a lending
// capture whose outputs are back; else it captures another lending one,
// up to kLendingCaptures (two serve a loop whose last outputs are still
// held at the next call: `out = lstm(x)` rebinds `out` after the call);
// else it replays the key's copying capture, captured on first need.
// Device-neutral over `Graph` (anything with replay(), held by
// std::unique_ptr), so that a CPU stand-in tests the choice
// (tests/test_graph_captures.py); the CUDA runner is cuda/graph_replay_cuda.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "lent_buffers.h"

namespace pipelstm {

template <class Graph>
class GraphCaptures {
 public:
  static constexpr size_t kLendingCaptures = 2;

  struct Capture {
    std::unique_ptr<Graph> graph;
    std::vector<at::Tensor> inputs, outputs;  // the graph's own
    bool lends = true;
    LentBuffers lent;
  };

  struct Run {
    std::vector<at::Tensor> outputs;  // to hand out
    Capture* captured = nullptr;      // the capture this call made, if it made one
  };

  // Replays a capture for `inputs`, first capturing one where none may be
  // replayed: `capture(c)` fills c.graph and c.outputs (and may set c.lent)
  // from c.inputs, copies of `inputs`. A capture that throws, or whose
  // first replay throws, leaves the captures as they were. nullopt: none
  // may be replayed and `may_capture` is false.
  template <class CaptureFn>
  std::optional<Run> run(const std::vector<at::Tensor>& inputs, CaptureFn&& capture, bool may_capture) {
    bool lends = true;
    Capture* c = replayable(lends);
    std::unique_ptr<Capture> fresh;
    if (c == nullptr) {
      if (!may_capture) return std::nullopt;
      fresh = std::make_unique<Capture>();
      fresh->lends = lends;
      for (const auto& t : inputs) fresh->inputs.push_back(t.clone());
      capture(*fresh);
      c = fresh.get();
    } else {
      for (size_t i = 0; i < inputs.size(); ++i) c->inputs[i].copy_(inputs[i]);
    }
    c->graph->replay();
    Run run;
    if (fresh) {
      run.captured = c;
      captures_.push_back(std::move(fresh));
    }
    if (c->lends) {
      run.outputs = c->lent.lend(c->outputs);
    } else {
      run.outputs.reserve(c->outputs.size());
      for (const auto& t : c->outputs) run.outputs.push_back(t.defined() ? t.clone() : t);
    }
    return run;
  }

  bool empty() const { return captures_.empty(); }

 private:
  // A capture this call may replay, or nullptr where a new one must be
  // captured; `lends` then says which kind.
  Capture* replayable(bool& lends) {
    size_t lending = 0;
    Capture* copying = nullptr;
    for (const auto& c : captures_) {
      if (!c->lends) {
        copying = c.get();
      } else if (c->lent.returned()) {
        return c.get();
      } else {
        ++lending;
      }
    }
    lends = lending < kLendingCaptures;
    return lends ? nullptr : copying;
  }

  std::vector<std::unique_ptr<Capture>> captures_;
};

}  // namespace pipelstm
