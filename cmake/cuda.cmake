# CUDA for pipelstm. Sets PIPELSTM_WITH_CUDA from PIPELSTM_CUDA:
#   off   never;
#   auto  when torch was built with CUDA and an nvcc of the same major is found;
#   on    must build, or stop with the reason.
# Included before find_package(Torch), whose config (Caffe2Config.cmake) does
# its own CUDA discovery for a CUDA build of torch; see the end of this file.

set(PIPELSTM_WITH_CUDA OFF)
string(REGEX MATCH "^[0-9]+" _torch_cuda_major "${TORCH_CUDA_VERSION}")

if(NOT PIPELSTM_CUDA MATCHES "^(auto|on|off)$")
  message(FATAL_ERROR "pipelstm: PIPELSTM_CUDA must be auto, on or off, got '${PIPELSTM_CUDA}'")
endif()

# The CUDA version (major.minor) of the nvcc at `nvcc`, or "" if it does not run.
function(_pipelstm_nvcc_version nvcc out)
  execute_process(COMMAND "${nvcc}" --version OUTPUT_VARIABLE _text ERROR_QUIET RESULT_VARIABLE _rc)
  set(_v "")
  if(_rc EQUAL 0 AND _text MATCHES "release ([0-9]+\\.[0-9]+)")
    set(_v "${CMAKE_MATCH_1}")
  endif()
  set(${out} "${_v}" PARENT_SCOPE)
endfunction()

set(_why "")
if(PIPELSTM_CUDA STREQUAL "off")
  set(_why "PIPELSTM_CUDA=off")
elseif(NOT TORCH_CUDA_VERSION)
  set(_why "the installed torch is a CPU-only build (torch.version.cuda is None)")
else()
  # torch wheels carry the CUDA libraries (cuBLAS, NVRTC, ...) and headers in
  # site-packages/nvidia/cuXY (CUDA 13) or nvidia/<lib> (CUDA 12); a system
  # toolkit may have only nvcc and cudart.
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c
            "import importlib.util as u, os; s = u.find_spec('nvidia'); print(list(s.submodule_search_locations)[0] if s else '')"
    OUTPUT_VARIABLE _pip_nvidia OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(PIPELSTM_PIP_CUDA "")
  if(_pip_nvidia AND EXISTS "${_pip_nvidia}/cu${_torch_cuda_major}")
    set(PIPELSTM_PIP_CUDA "${_pip_nvidia}/cu${_torch_cuda_major}")
  endif()

  # The compiler: CUDACXX, else $CUDA_HOME/bin/nvcc (both chosen by the
  # user: used as they are), else the first nvcc of torch's CUDA major among
  # /usr/local/cuda, PATH, the pip package nvidia-cuda-nvcc in this
  # environment and /usr/local/cuda-<major>*. (An nvcc on PATH may be a
  # wrapper script whose folder is not the toolkit's, so the toolkit root is
  # asked of nvcc itself below.)
  set(_chosen_by_user "")
  if(DEFINED ENV{CUDACXX} AND NOT "$ENV{CUDACXX}" STREQUAL "")
    set(_candidates "$ENV{CUDACXX}")
    set(_chosen_by_user "CUDACXX")
  elseif(DEFINED ENV{CUDA_HOME} AND NOT "$ENV{CUDA_HOME}" STREQUAL "")
    set(_candidates "$ENV{CUDA_HOME}/bin/nvcc")
    set(_chosen_by_user "CUDA_HOME")
  else()
    find_program(_path_nvcc nvcc NO_CACHE)
    file(GLOB _versioned LIST_DIRECTORIES true "/usr/local/cuda-${_torch_cuda_major}*")
    list(SORT _versioned COMPARE NATURAL ORDER DESCENDING)
    list(TRANSFORM _versioned APPEND "/bin/nvcc")
    set(_candidates /usr/local/cuda/bin/nvcc ${_path_nvcc})
    if(_pip_nvidia)
      list(APPEND _candidates "${_pip_nvidia}/cu${_torch_cuda_major}/bin/nvcc" "${_pip_nvidia}/cuda_nvcc/bin/nvcc")
    endif()
    list(APPEND _candidates ${_versioned})
  endif()

  set(_nvcc "")
  set(_mismatched "")
  foreach(_candidate IN LISTS _candidates)
    if(NOT EXISTS "${_candidate}")
      continue()
    endif()
    _pipelstm_nvcc_version("${_candidate}" _v)
    string(REGEX MATCH "^[0-9]+" _major "${_v}")
    if(_major STREQUAL _torch_cuda_major)
      set(_nvcc "${_candidate}")
      set(_nvcc_version "${_v}")
      break()
    elseif(_v)
      list(APPEND _mismatched "${_candidate} (CUDA ${_v})")
    endif()
  endforeach()

  if(NOT _nvcc AND NOT _mismatched)
    if(_chosen_by_user)
      set(_why "${_chosen_by_user} names no working nvcc (${_candidates}) for torch's CUDA ${TORCH_CUDA_VERSION}")
    else()
      set(_why "no CUDA compiler (nvcc) was found for torch's CUDA ${TORCH_CUDA_VERSION}; set CUDA_HOME")
    endif()
  elseif(NOT _nvcc)
    # torch's CUDA major must be nvcc's: kernels built with another major do
    # not link against torch's runtime libraries reliably.
    if(_torch_cuda_major GREATER_EQUAL 13)
      set(_pip_nvcc "nvidia-cuda-nvcc==${_torch_cuda_major}.*")
    else()
      set(_pip_nvcc "nvidia-cuda-nvcc-cu${_torch_cuda_major}")
    endif()
    list(JOIN _mismatched ", " _found)
    if(_chosen_by_user)
      string(APPEND _found ", named by ${_chosen_by_user} (unset it to let pipelstm look for a matching one)")
    endif()
    message(FATAL_ERROR
      "pipelstm: torch was built with CUDA ${TORCH_CUDA_VERSION}, but the CUDA compiler found is "
      "${_found}: its major version must be torch's (${_torch_cuda_major}). Install a CUDA "
      "${_torch_cuda_major}.x toolkit and set CUDA_HOME to it, or `pip install '${_pip_nvcc}'` into "
      "this environment (found automatically), or install the torch build for your toolkit's CUDA, "
      "or build without CUDA: PIPELSTM_CUDA=off.")
  endif()
endif()

if(_why)
  if(PIPELSTM_CUDA STREQUAL "on")
    message(FATAL_ERROR "pipelstm: PIPELSTM_CUDA=on, but ${_why}.")
  endif()
  message(STATUS "pipelstm: CPU-only build: ${_why}")
  if(TORCH_CUDA_VERSION)
    # A CPU-only build against a CUDA build of torch: Caffe2Config.cmake would
    # look for a CUDA toolkit (nvcc, cudart, NVRTC, enable_language(CUDA)) and
    # stop without one, although nothing here is compiled for CUDA. Its CUDA
    # part (public/cuda.cmake) returns at once when torch::cudart exists,
    # which is the one CUDA target torch's library targets refer to; an empty
    # one stands in, so torch configures with no toolkit installed.
    if(NOT TARGET torch::cudart)
      add_library(torch::cudart INTERFACE IMPORTED)
    endif()
  endif()
  return()
endif()

if(NOT _chosen_by_user AND NOT _nvcc STREQUAL "/usr/local/cuda/bin/nvcc")
  message(STATUS "pipelstm: using ${_nvcc} (CUDA ${_nvcc_version}, matching torch's CUDA ${TORCH_CUDA_VERSION})")
endif()

# The toolkit root, from nvcc itself (its dry run prints TOP), for torch's
# config (FindCUDA) and CMake's.
execute_process(COMMAND "${_nvcc}" --dryrun -v -x cu -c /dev/null -o /dev/null
                OUTPUT_VARIABLE _dry ERROR_VARIABLE _dry)
if(_dry MATCHES "#\\$ TOP=([^\n]*)\n")
  get_filename_component(_root "${CMAKE_MATCH_1}" ABSOLUTE)
else()
  get_filename_component(_root "${_nvcc}" DIRECTORY)
  get_filename_component(_root "${_root}/.." ABSOLUTE)
endif()
set(CUDA_TOOLKIT_ROOT_DIR "${_root}" CACHE PATH "CUDA toolkit" FORCE)
set(CMAKE_CUDA_COMPILER "${_nvcc}")

# Architectures: TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX") when set, else the GPUs
# our users have (A100, A10/3090, L4/4090, H100) and PTX of the newest for
# anything later. torch's config turns the list into -gencode flags and
# ignores CMAKE_CUDA_ARCHITECTURES (so that is off); unset, it would probe for
# a GPU.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} OR "$ENV{TORCH_CUDA_ARCH_LIST}" STREQUAL "")
  set(ENV{TORCH_CUDA_ARCH_LIST} "8.0;8.6;8.9;9.0+PTX")
endif()
set(CMAKE_CUDA_ARCHITECTURES OFF)

if(PIPELSTM_PIP_CUDA AND EXISTS "${PIPELSTM_PIP_CUDA}/lib")
  find_library(CUDA_nvrtc_LIBRARY NAMES nvrtc libnvrtc.so.${_torch_cuda_major}
               HINTS "${CUDA_TOOLKIT_ROOT_DIR}/lib64" "${PIPELSTM_PIP_CUDA}/lib")
endif()

# The CUDA runtime is torch's shared libcudart: CMake's default, a static
# copy inside the extension, would be a second runtime beside torch's.
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)

set(PIPELSTM_WITH_CUDA ON)
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)
message(STATUS "pipelstm: CUDA kernels on (torch CUDA ${TORCH_CUDA_VERSION}, nvcc ${_nvcc_version}, "
               "TORCH_CUDA_ARCH_LIST=$ENV{TORCH_CUDA_ARCH_LIST})")
