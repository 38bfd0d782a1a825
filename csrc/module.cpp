// The Python extension module pipelstm._C. Importing it loads the op
// registrations; the few functions here describe the build.
#include <pybind11/pybind11.h>
#include <torch/python.h>

#include "cpu/fma_peak.h"
#include "cpu/gemm_cpu.h"
#include "cpu/huge_pages.h"
#include "graph_replay.h"

namespace pipelstm {
bool built_with_cuda();
namespace cpu {
const char* fused_loops_isa();
}
namespace pipeline {
void init_bindings(pybind11::module_& m);
}
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "pipelstm native library: fused LSTM ops (torch.ops.pipelstm.*)";
  m.def("built_with_cuda", &pipelstm::built_with_cuda,
        "Whether the CUDA kernels were compiled into this build.");
  m.def("cpu_isa", &pipelstm::cpu::fused_loops_isa,
        "The instruction set of the fused CPU kernels in use: avx512, avx2 or generic "
        "(the widest this CPU runs, capped by PIPELSTM_CPU_ISA).");
  m.def("cpu_gemm", &pipelstm::cpu::gemm_backend,
        "What runs a layer's whole-batch CPU float32 GEMMs of 4 rows and more: own (the "
        "fused kernels' packed-panel GEMM) or aten (at::mm); PIPELSTM_CPU_GEMM picks "
        "(cpu/gemm_cpu.h).");
  m.def("_layer_mm_out", &pipelstm::cpu::layer_mm_out, pybind11::arg("out"), pybind11::arg("a"),
        pybind11::arg("b"), pybind11::arg("accumulate") = false,
        "out = a @ b (out += a @ b with accumulate) as a layer runs its whole-batch GEMMs "
        "(cpu/gemm_cpu.h), for tests and measurements.");
  m.def("_linear", &pipelstm::cpu::linear, pybind11::arg("x"), pybind11::arg("weight"),
        pybind11::arg("bias") = pybind11::none(),
        "x @ weight.t() + bias as the pipeline's Linear units run it (cpu/gemm_cpu.h), for tests.");
  m.def("_fma_loop_seconds", &pipelstm::cpu::fma_loop_seconds, pybind11::arg("threads"),
        pybind11::arg("iterations"), pybind11::call_guard<pybind11::gil_scoped_release>(),
        "Wall seconds for `threads` threads to run the fused kernels' register-only FMA loop "
        "(cpu/fma_peak.h), for python -m pipelstm.bench peak.");
  m.def("_fma_loop_flop", &pipelstm::cpu::fma_loop_flop, pybind11::arg("iterations"),
        "The FLOP of one thread's FMA loop of `iterations`.");
  m.def("_fma_loop_sum", &pipelstm::cpu::fma_loop_sum, pybind11::arg("iterations"), pybind11::arg("a"),
        pybind11::arg("b"), "The FMA loop's sum of its chains (tests).");
  m.def("_empty_buffer", [](int64_t numel) {
    return pipelstm::cpu::empty_huge({numel}, at::TensorOptions().dtype(at::kFloat));
  }, pybind11::arg("numel"),
        "An uninitialised float32 CPU buffer through the huge-page allocator and its cache "
        "(cpu/huge_pages.h; tests).");
  m.def("_graph_counts", [] {
    const auto c = pipelstm::graph_counts();
    return pybind11::make_tuple(c.captures, c.replays);
  }, "(captures, replays) of the layer ops' CUDA graphs in this process (graph_replay.h).");
  pipelstm::pipeline::init_bindings(m);
}
