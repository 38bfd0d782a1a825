# The extension must load libstdc++ as a shared library, as torch does. A
# compiler that links it statically (seen on a GPU machine's image: a g++
# wrapper at /opt/gcc/bin/g++) gives an extension with a second copy of
# libstdc++'s locale state: it imports and runs, then crashes the first time
# an op formats an error message. This module stops the build instead.
#
#   include(cmake/shared_libstdcxx.cmake)
#   pipelstm_require_shared_libstdcxx()        configure time: a probe built
#                                              with this compiler and flags
#   pipelstm_check_built_module(<target>)      after each link: the module
#
# In script mode (cmake -DPIPELSTM_ELF=<file> -DPIPELSTM_READELF=<readelf>
# -P shared_libstdcxx.cmake) it checks one file; the post-link step uses that.

set(_PIPELSTM_LIBSTDCXX_FIX
    "Build with a compiler that links libstdc++ dynamically, e.g. CXX=/usr/bin/g++ "
    "CUDAHOSTCXX=/usr/bin/g++, and without -static-libstdc++ in LDFLAGS or CMAKE_*_LINKER_FLAGS "
    "(a fresh build folder: delete build/ or set PIPELSTM_BUILD_DIR).")

# Sets `out` to whether the ELF file `elf` lists libstdc++.so among the
# shared libraries it needs.
function(_pipelstm_needs_shared_libstdcxx elf readelf out)
  execute_process(COMMAND "${readelf}" -d "${elf}" OUTPUT_VARIABLE _dyn ERROR_VARIABLE _err
                  RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "pipelstm: `${readelf} -d ${elf}` failed: ${_err}")
  endif()
  if(_dyn MATCHES "NEEDED[^\n]*\\[libstdc\\+\\+\\.so")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

function(_pipelstm_static_libstdcxx_error elf what)
  string(JOIN "" _fix ${_PIPELSTM_LIBSTDCXX_FIX})
  message(FATAL_ERROR
    "pipelstm: ${what} links libstdc++ statically (`readelf -d ${elf}` lists no libstdc++.so). "
    "torch loads the shared libstdc++, and an extension with a second, static copy crashes when "
    "an op formats an error message. ${_fix}")
endfunction()

if(CMAKE_SCRIPT_MODE_FILE)
  _pipelstm_needs_shared_libstdcxx("${PIPELSTM_ELF}" "${PIPELSTM_READELF}" _shared)
  if(NOT _shared)
    # Removed, so that the next build links it again rather than finding it
    # up to date.
    file(REMOVE "${PIPELSTM_ELF}")
    _pipelstm_static_libstdcxx_error("${PIPELSTM_ELF}" "the built extension ${PIPELSTM_ELF}")
  endif()
  return()
endif()

function(_pipelstm_readelf out)
  if(CMAKE_READELF)
    set(${out} "${CMAKE_READELF}" PARENT_SCOPE)
  else()
    find_program(_readelf NAMES readelf NO_CACHE)
    set(${out} "${_readelf}" PARENT_SCOPE)
  endif()
endfunction()

function(pipelstm_require_shared_libstdcxx)
  _pipelstm_readelf(_readelf)
  if(NOT _readelf)
    message(WARNING "pipelstm: no readelf found: cannot check that ${CMAKE_CXX_COMPILER} links "
                    "libstdc++ dynamically (install binutils)")
    return()
  endif()
  set(_dir "${CMAKE_BINARY_DIR}/CMakeFiles/pipelstm_libstdcxx_probe")
  # The module's link flags too: LDFLAGS sets them all alike, but a
  # -static-libstdc++ in CMAKE_MODULE_LINKER_FLAGS alone is the module's.
  # (CMAKE_EXE_LINKER_FLAGS reaches the probe by itself.)
  separate_arguments(_module_flags UNIX_COMMAND "${CMAKE_MODULE_LINKER_FLAGS}")
  try_compile(_built "${_dir}/build" "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/libstdcxx_probe.cpp" LINK_OPTIONS ${_module_flags}
              OUTPUT_VARIABLE _log COPY_FILE "${_dir}/probe")
  if(NOT _built)
    message(FATAL_ERROR "pipelstm: ${CMAKE_CXX_COMPILER} cannot build a C++ program:\n${_log}")
  endif()
  _pipelstm_needs_shared_libstdcxx("${_dir}/probe" "${_readelf}" _shared)
  if(NOT _shared)
    _pipelstm_static_libstdcxx_error("${_dir}/probe" "the C++ compiler ${CMAKE_CXX_COMPILER}")
  endif()
endfunction()

# The module itself, after every link: whatever compiler or flag linked it.
function(pipelstm_check_built_module target)
  _pipelstm_readelf(_readelf)
  if(NOT _readelf)
    return()
  endif()
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND "${CMAKE_COMMAND}" "-DPIPELSTM_ELF=$<TARGET_FILE:${target}>"
            "-DPIPELSTM_READELF=${_readelf}" -P "${CMAKE_CURRENT_FUNCTION_LIST_FILE}"
    VERBATIM)
endfunction()
