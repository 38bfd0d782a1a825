# Decides whether the CUDA kernels are built (PIPELSTM_WITH_CUDA):
#   off  never;  auto  when torch was built with CUDA and nvcc is found;
#   on   must build, or stop with the reason.
set(PIPELSTM_WITH_CUDA OFF)
if(PIPELSTM_CUDA STREQUAL "off")
  message(STATUS "pipelstm: CUDA kernels off (PIPELSTM_CUDA=off)")
  return()
endif()
if(NOT PIPELSTM_CUDA MATCHES "^(auto|on)$")
  message(FATAL_ERROR "pipelstm: PIPELSTM_CUDA must be auto, on or off, got '${PIPELSTM_CUDA}'")
endif()

include(CheckLanguage)
if(TORCH_CUDA_VERSION)
  check_language(CUDA)
endif()

set(_why "")
if(NOT TORCH_CUDA_VERSION)
  set(_why "the installed torch is a CPU-only build (torch.version.cuda is None)")
elseif(NOT CMAKE_CUDA_COMPILER)
  set(_why "torch was built with CUDA ${TORCH_CUDA_VERSION} but no CUDA compiler (nvcc) was found")
endif()

if(_why)
  if(PIPELSTM_CUDA STREQUAL "on")
    message(FATAL_ERROR "pipelstm: PIPELSTM_CUDA=on, but ${_why}.")
  endif()
  message(STATUS "pipelstm: CPU-only build: ${_why}")
  return()
endif()

set(PIPELSTM_WITH_CUDA ON)
enable_language(CUDA)
message(STATUS "pipelstm: CUDA kernels on (torch CUDA ${TORCH_CUDA_VERSION}, nvcc ${CMAKE_CUDA_COMPILER_VERSION})")
