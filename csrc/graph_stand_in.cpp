// A CPU stand-in for a captured graph, so that the tests run the choice of
// graph_captures.h (tests/test_graph_captures.py): its replay runs the body
// again and writes the results over the outputs its capture made, as a
// CUDA graph's replay overwrites its buffers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include <memory>
#include <vector>

#include "graph_captures.h"

namespace pipelstm {
namespace {

namespace py = pybind11;

struct StandInGraph {
  py::function body;
  const std::vector<at::Tensor>* inputs;  // its capture's
  std::vector<at::Tensor>* outputs;

  void replay() {
    const auto fresh = body(*inputs).cast<std::vector<at::Tensor>>();
    for (size_t i = 0; i < outputs->size(); ++i) (*outputs)[i].copy_(fresh[i]);
  }
};

using StandInCaptures = GraphCaptures<StandInGraph>;

}  // namespace

void init_graph_stand_in(py::module_& m) {
  py::class_<StandInCaptures>(m, "_StandInGraphCaptures",
                              "One graph key's captures over a CPU stand-in for a graph "
                              "(graph_captures.h; tests).")
      .def(py::init<>())
      .def("run", [](StandInCaptures& captures, const std::vector<at::Tensor>& inputs, py::function body,
                     bool may_capture) {
        auto run = captures.run(inputs, [&](StandInCaptures::Capture& c) {
          c.outputs = body(c.inputs).cast<std::vector<at::Tensor>>();
          c.graph = std::make_unique<StandInGraph>(StandInGraph{body, &c.inputs, &c.outputs});
        }, may_capture);
        if (!run) return py::object(py::none());
        return py::object(py::make_tuple(run->outputs, run->captured != nullptr));
      }, py::arg("inputs"), py::arg("body"), py::arg("may_capture") = true,
      "(body(inputs) as a replay gives it, whether this call captured), or None where it "
      "needs a capture and may_capture is false.");
}

}  // namespace pipelstm
