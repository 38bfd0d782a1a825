#include "graph_replay.h"

#include <atomic>

namespace pipelstm {
namespace {

std::atomic<int64_t> captures{0}, replays{0}, memory{0};
thread_local bool no_graphs = false;

}  // namespace

GraphCounts graph_counts() { return {captures.load(), replays.load()}; }
void note_graph_capture() { captures.fetch_add(1); }
void note_graph_replay() { replays.fetch_add(1); }
int64_t graph_memory() { return memory.load(); }
void note_graph_memory(int64_t delta) { memory.fetch_add(delta); }

NoGraphsOnThisThread::NoGraphsOnThisThread() : saved_(no_graphs) { no_graphs = true; }
NoGraphsOnThisThread::~NoGraphsOnThisThread() { no_graphs = saved_; }

bool graphs_allowed_on_this_thread() { return !no_graphs; }

void add_to_key(std::vector<int64_t>& key, const at::Tensor& t, bool in_place) {
  if (!t.defined()) {
    key.push_back(-1);
    return;
  }
  if (in_place) key.push_back(reinterpret_cast<int64_t>(t.const_data_ptr()));
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) {
    key.push_back(t.size(d));
    key.push_back(t.stride(d));
  }
}

}  // namespace pipelstm
