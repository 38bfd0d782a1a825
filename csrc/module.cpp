// The Python extension module pipelstm._C. Importing it loads the op
// registrations; the few functions here describe the build.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include <atomic>
#include <memory>

#include "cpu/cpu_identity.h"
#include "cpu/cpu_path.h"
#include "cpu/fma_peak.h"
#include "cpu/gemm_cpu.h"
#include "cpu/huge_pages.h"
#include "cpu/row_split.h"
#include "cpu/step_kernels.h"
#include "backend.h"
#include "column_major_gemm.h"
#include "graph_replay.h"
#include "graph_rule.h"
#include "layer_gemm.h"
#include "lent_buffers.h"
#include "log_sink.h"
#include "persistent_rule.h"
#include "settings.h"

namespace pipelstm {
bool built_with_cuda();
const char* built_torch_version();
void init_graph_stand_in(pybind11::module_& m);
namespace pipeline {
void init_bindings(pybind11::module_& m);
}
}

namespace {

namespace py = pybind11;

const char* source_name(pipelstm::settings::Source s) {
  switch (s) {
    case pipelstm::settings::Source::kPython: return "python";
    case pipelstm::settings::Source::kEnvironment: return "env";
    case pipelstm::settings::Source::kDefault: break;
  }
  return "default";
}

// The C++ side's log messages, to logging.getLogger("pipelstm") (log_sink.h).
void log_to_python(pipelstm::LogLevel level, const std::string& message) {
  if (!Py_IsInitialized()) return;  // a message at exit
  py::gil_scoped_acquire gil;
  try {
    py::module_::import("logging").attr("getLogger")("pipelstm").attr("log")(static_cast<int>(level), message);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("pipelstm: logging a message from C++");
  }
}

// A LentBuffers whose on_return counts its calls (tests).
struct CountedLender {
  std::shared_ptr<std::atomic<int64_t>> calls = std::make_shared<std::atomic<int64_t>>(0);
  pipelstm::LentBuffers lender{[c = calls] { c->fetch_add(1); }};
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "pipelstm native library: fused LSTM ops (torch.ops.pipelstm.*)";
  m.def("built_with_cuda", &pipelstm::built_with_cuda,
        "Whether the CUDA kernels were compiled into this build.");
  m.def("_built_torch_version", &pipelstm::built_torch_version,
        "The version of the torch headers this build was compiled against (major.minor.patch).");
  m.def("cpu_isa", [] { return pipelstm::cpu::kernels_for_cap(pipelstm::settings::cpu_isa()).isa; },
        "The instruction set of the fused CPU kernels: avx512, avx2 or generic (the widest this "
        "CPU runs, capped by PIPELSTM_CPU_ISA); before the first call that runs them, the one it "
        "will choose.");
  m.def("_cpu_identity", [] {
    const auto& id = pipelstm::cpu::cpu_identity();
    return py::dict(py::arg("vendor") = id.vendor, py::arg("family") = id.family, py::arg("model") = id.model,
                    py::arg("microarchitecture") = id.microarchitecture,
                    py::arg("vector_datapath_bits") = id.vector_datapath_bits,
                    py::arg("l2_bytes") = id.l2_bytes);
  }, "This CPU: vendor, family, model, microarchitecture class, FMA datapath width, L2 per core "
     "(cpu/cpu_identity.h).");
  m.def("_cpu_chosen_paths", [] {
    py::list out;
    for (const auto& c : pipelstm::cpu::chosen_paths()) {
      py::dict seconds;
      for (const auto& [name, s] : c.seconds) seconds[py::str(name)] = s;
      py::dict trials;
      for (size_t i = 0; i < c.trials.size(); ++i) trials[py::str(c.seconds[i].first)] = c.trials[i];
      out.append(py::dict(py::arg("shape") = c.shape, py::arg("path") = c.path, py::arg("seconds") = seconds,
                          py::arg("trials") = trials, py::arg("from_cache") = c.from_cache));
    }
    return out;
  }, "The CPU paths chosen by timing so far (cpu/cpu_path.h).");
  m.def("_cpu_last_row_blocks", &pipelstm::cpu::last_row_blocks,
        "The blocks of rows the last float32 layer loop on this thread split its steps into "
        "(1: panels, or one thread), for tests.");
  m.def("_cpu_forget_chosen_paths", &pipelstm::cpu::forget_chosen_paths,
        "Forgets the CPU paths chosen by timing, and their trials (tests).");
  m.def("_cpu_isa_chosen", &pipelstm::settings::cpu_isa_frozen,
        "Whether a call has chosen the CPU kernels (the ISA cap is then fixed for the process).");
  m.def("_switch_names", &pipelstm::settings::names,
        "Every run-time switch, by its environment variable (settings.h).");
  m.def("_get_switch", [](const std::string& name) {
    const auto r = pipelstm::settings::read(name);
    return py::make_tuple(r.value, source_name(r.source));
  }, py::arg("name"),
        "(value, source) of a switch: its canonical value, and where it came from: python, env "
        "or default. Raises if the variable holds a value the switch does not take.");
  m.def("_set_switch", &pipelstm::settings::set, py::arg("name"), py::arg("value"),
        "Sets a switch from Python (None: clears it; the variable or the default applies again). "
        "Raises ValueError for a value the switch does not take.");
  m.def("_switch_allowed", &pipelstm::settings::allowed, py::arg("name"),
        "The values a switch takes, in words.");
  m.def("_buffer_cache_stats", [] {
    const auto s = pipelstm::cpu::buffer_cache_stats();
    py::dict d;
    d["kept_bytes"] = s.kept_bytes;
    d["kept_mappings"] = s.kept_mappings;
    d["in_use_bytes"] = s.in_use_bytes;
    d["mapped_bytes"] = s.mapped_bytes;
    d["peak_mapped_bytes"] = s.peak_mapped_bytes;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    return d;
  }, "The CPU buffer cache's counters (cpu/huge_pages.h).");
  m.def("_empty_buffer_cache", &pipelstm::cpu::empty_buffer_cache,
        "Unmaps every freed buffer the CPU buffer cache keeps; returns the bytes unmapped.");
  pipelstm::set_log_sink(&log_to_python);
  m.def("_log", [](int level, const std::string& message) {
    pipelstm::log_message(static_cast<pipelstm::LogLevel>(level), message);
  }, py::arg("level"), py::arg("message"), py::call_guard<py::gil_scoped_release>(),
        "Sends a message through the C++ side's log sink, without the GIL (tests).");
  m.def("cpu_gemm", &pipelstm::cpu::gemm_backend,
        "What runs a layer's whole-batch CPU float32 GEMMs of 4 rows and more: own (the "
        "fused kernels' packed-panel GEMM) or aten (at::mm); PIPELSTM_CPU_GEMM picks "
        "(cpu/gemm_cpu.h).");
  m.def("_layer_mm_out", &pipelstm::cpu::layer_mm_out, pybind11::arg("out"), pybind11::arg("a"),
        pybind11::arg("b"), pybind11::arg("accumulate") = false,
        "out = a @ b (out += a @ b with accumulate) as a layer runs its whole-batch GEMMs "
        "(cpu/gemm_cpu.h), for tests and measurements.");
  m.def("_linear", &pipelstm::backend::linear, pybind11::arg("x"), pybind11::arg("weight"),
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
  m.def("_graph_memory", &pipelstm::graph_memory,
        "Bytes of device memory the layer ops' cached CUDA graphs hold now (graph_replay.h).");
  py::class_<CountedLender>(m, "_LentBuffers",
                            "Buffers handed out without a copy, whether all that was lent is let go, "
                            "and how often its on_return was called (lent_buffers.h; tests).")
      .def(py::init<>())
      .def("lend", [](CountedLender& l, const std::vector<at::Tensor>& b) { return l.lender.lend(b); },
           py::arg("buffers"))
      .def("returned", [](const CountedLender& l) { return l.lender.returned(); })
      .def("on_return_calls", [](const CountedLender& l) { return l.calls->load(); });
  m.def("_is_lent", &pipelstm::LentBuffers::is_lent, py::arg("tensor"),
        "Whether `tensor` is (a view of) a layer op's CUDA graph output handed out without a copy, "
        "which the graph replays over once nothing holds it (lent_buffers.h).");
  m.def("_layer_gemm_tf32", [](const std::string& device, at::ScalarType dtype) {
    return pipelstm::layer_gemm_tf32(c10::Device(device).type(), dtype);
  }, pybind11::arg("device"), pybind11::arg("dtype"),
        "Whether an LSTM layer's GEMMs of `dtype` on `device` (a device type such as 'cuda') "
        "use TF32: float32 on CUDA while torch.backends.cudnn.allow_tf32 allows it (layer_gemm.h).");
  m.def("_graph_pays", &pipelstm::graph_pays, pybind11::arg("dtype"), pybind11::arg("tf32"),
        pybind11::arg("batch"), pybind11::arg("hidden"),
        "Whether a CUDA layer call of these sizes replays its time loop as a graph where "
        "PIPELSTM_CUDA_GRAPHS is unset (graph_rule.h); tf32: its float32 GEMMs run as TF32.");
  m.def("_use_persistent", &pipelstm::use_persistent, pybind11::arg("dtype"), pybind11::arg("steps"),
        pybind11::arg("batch"), pybind11::arg("hidden"),
        "Whether a CUDA layer call of these sizes tries the persistent kernels: PIPELSTM_PERSISTENT "
        "where set, else the measured rule (persistent_rule.h).");
  m.def("_column_major_gemm", [](int64_t M, int64_t N, int64_t K, std::vector<int64_t> out,
                                 std::vector<int64_t> a, std::vector<int64_t> b) -> pybind11::object {
    // Strides in; the cuBLAS call for out = a @ b out, or None where an operand must be copied.
    const auto lo = pipelstm::blas_layout(M, N, out[0], out[1]);
    const auto la = pipelstm::blas_layout(M, K, a[0], a[1]);
    const auto lb = pipelstm::blas_layout(K, N, b[0], b[1]);
    if (!lo || !lo->row_major || !la || !lb) return pybind11::none();
    const auto g = pipelstm::column_major_gemm(M, N, K, *lo, *la, *lb);
    return pybind11::make_tuple(g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldc);
  }, "The column-major (cuBLAS) call a CUDA layer GEMM makes for out = a @ b of these "
     "strides (column_major_gemm.h; tests).");
  pipelstm::init_graph_stand_in(m);
  pipelstm::pipeline::init_bindings(m);
}
