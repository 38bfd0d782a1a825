// The Python extension module pipelstm._C. Importing it loads the op
// registrations; the few functions here describe the build.
#include <pybind11/pybind11.h>

namespace pipelstm {
bool built_with_cuda();
namespace pipeline {
void init_bindings(pybind11::module_& m);
}
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "pipelstm native library: fused LSTM ops (torch.ops.pipelstm.*)";
  m.def("built_with_cuda", &pipelstm::built_with_cuda,
        "Whether the CUDA kernels were compiled into this build.");
  pipelstm::pipeline::init_bindings(m);
}
