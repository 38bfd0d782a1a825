# CUDA for pipelstm. Sets PIPELSTM_WITH_CUDA from PIPELSTM_CUDA:
#   off   never;
#   auto  when torch was built with CUDA and an nvcc of the same major is found;
#   on    must build, or stop with the reason.
#
# Part 1 runs for every CUDA build of torch, PIPELSTM_CUDA=off included:
# torch's own CMake config (find_package(Torch)) needs the toolkit's root,
# an architecture list and the CUDA libraries to configure at all.

set(PIPELSTM_WITH_CUDA OFF)
string(REGEX MATCH "^[0-9]+" _torch_cuda_major "${TORCH_CUDA_VERSION}")

if(TORCH_CUDA_VERSION)
  # The toolkit: CUDA_HOME, else /usr/local/cuda (an nvcc on PATH may be a
  # wrapper script whose folder is not the toolkit's).
  if(NOT CUDA_TOOLKIT_ROOT_DIR)
    if(DEFINED ENV{CUDA_HOME})
      set(CUDA_TOOLKIT_ROOT_DIR "$ENV{CUDA_HOME}" CACHE PATH "CUDA toolkit")
    elseif(EXISTS /usr/local/cuda/bin/nvcc)
      set(CUDA_TOOLKIT_ROOT_DIR /usr/local/cuda CACHE PATH "CUDA toolkit")
    endif()
  endif()
  if(CUDA_TOOLKIT_ROOT_DIR AND NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    set(CMAKE_CUDA_COMPILER "${CUDA_TOOLKIT_ROOT_DIR}/bin/nvcc")
  endif()

  # Architectures: TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX") when set, else the
  # GPUs our users have (A100, A10/3090, L4/4090, H100) and PTX of the newest
  # for anything later. torch's config turns the list into -gencode flags and
  # ignores CMAKE_CUDA_ARCHITECTURES (so that is off); unset, it would probe
  # for a GPU.
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} OR "$ENV{TORCH_CUDA_ARCH_LIST}" STREQUAL "")
    set(ENV{TORCH_CUDA_ARCH_LIST} "8.0;8.6;8.9;9.0+PTX")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES OFF)

  # torch wheels carry the CUDA libraries (cuBLAS, NVRTC, ...) and headers in
  # site-packages/nvidia/cuXY; a system toolkit may have only nvcc and cudart.
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c
            "import importlib.util as u, os; s = u.find_spec('nvidia'); print(os.path.join(list(s.submodule_search_locations)[0], 'cu${_torch_cuda_major}') if s else '')"
    OUTPUT_VARIABLE PIPELSTM_PIP_CUDA OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(PIPELSTM_PIP_CUDA AND EXISTS "${PIPELSTM_PIP_CUDA}/lib")
    find_library(CUDA_nvrtc_LIBRARY NAMES nvrtc libnvrtc.so.${_torch_cuda_major}
                 HINTS "${CUDA_TOOLKIT_ROOT_DIR}/lib64" "${PIPELSTM_PIP_CUDA}/lib")
  endif()
endif()

# Part 2: the decision.
if(PIPELSTM_CUDA STREQUAL "off")
  message(STATUS "pipelstm: CUDA kernels off (PIPELSTM_CUDA=off)")
  return()
endif()
if(NOT PIPELSTM_CUDA MATCHES "^(auto|on)$")
  message(FATAL_ERROR "pipelstm: PIPELSTM_CUDA must be auto, on or off, got '${PIPELSTM_CUDA}'")
endif()

if(NOT TORCH_CUDA_VERSION)
  set(_why "the installed torch is a CPU-only build (torch.version.cuda is None)")
  if(PIPELSTM_CUDA STREQUAL "on")
    message(FATAL_ERROR "pipelstm: PIPELSTM_CUDA=on, but ${_why}.")
  endif()
  message(STATUS "pipelstm: CPU-only build: ${_why}")
  return()
endif()

# The compiler CMake would use: CUDACXX, else the toolkit's, else nvcc on PATH.
if(DEFINED ENV{CUDACXX})
  set(_nvcc "$ENV{CUDACXX}")
elseif(CMAKE_CUDA_COMPILER)
  set(_nvcc "${CMAKE_CUDA_COMPILER}")
else()
  find_program(_nvcc nvcc)
endif()
if(NOT _nvcc OR NOT EXISTS "${_nvcc}")
  set(_why "torch was built with CUDA ${TORCH_CUDA_VERSION} but no CUDA compiler (nvcc) was found; set CUDA_HOME")
  if(PIPELSTM_CUDA STREQUAL "on")
    message(FATAL_ERROR "pipelstm: PIPELSTM_CUDA=on, but ${_why}.")
  endif()
  message(STATUS "pipelstm: CPU-only build: ${_why}")
  return()
endif()

# torch's CUDA major must be nvcc's: kernels built with another major do not
# link against torch's runtime libraries reliably. Checked before CMake
# probes the compiler, so the message names the versions.
execute_process(COMMAND "${_nvcc}" --version OUTPUT_VARIABLE _nvcc_out)
string(REGEX MATCH "release ([0-9]+)\\.([0-9]+)" _ "${_nvcc_out}")
set(_nvcc_major "${CMAKE_MATCH_1}")
set(_nvcc_version "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
if(NOT _nvcc_major STREQUAL _torch_cuda_major)
  message(FATAL_ERROR
    "pipelstm: torch was built with CUDA ${TORCH_CUDA_VERSION} but nvcc (${_nvcc}) is CUDA "
    "${_nvcc_version}. Install a CUDA ${_torch_cuda_major}.x compiler (the CUDA toolkit, or "
    "`pip install nvidia-cuda-nvcc` of that major, then set CUDA_HOME to its folder), "
    "or build without CUDA: PIPELSTM_CUDA=off.")
endif()
set(CMAKE_CUDA_COMPILER "${_nvcc}")

set(PIPELSTM_WITH_CUDA ON)
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)
message(STATUS "pipelstm: CUDA kernels on (torch CUDA ${TORCH_CUDA_VERSION}, nvcc ${_nvcc_version}, "
               "TORCH_CUDA_ARCH_LIST=$ENV{TORCH_CUDA_ARCH_LIST})")
