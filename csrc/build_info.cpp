// What this build is: its CUDA kernels, and the torch it was compiled against.
#include <torch/version.h>

namespace pipelstm {

bool built_with_cuda() {
#if defined(PIPELSTM_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

// The version in the headers of the torch this build was compiled against
// (major.minor.patch; the build also records torch.__version__ in
// pipelstm/_build_info.py, which the package checks before loading this).
const char* built_torch_version() { return TORCH_VERSION; }

}  // namespace pipelstm
