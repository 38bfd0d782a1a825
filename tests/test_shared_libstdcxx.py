"""cmake/shared_libstdcxx.cmake: a compiler or flag that links libstdc++
statically into the extension stops the build with a message naming the fix
(such an extension crashes when an op formats an error). Each case configures
and builds a one-file project that uses the module as CMakeLists.txt does."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CMAKE = shutil.which("cmake", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
CXX = shutil.which("g++")

pytestmark = pytest.mark.skipif(not (CMAKE and CXX and sys.platform.startswith("linux")),
                                reason="needs cmake and g++ on Linux")

PROJECT = f"""
cmake_minimum_required(VERSION 3.18)
project(probe LANGUAGES CXX)
include("{ROOT / 'cmake' / 'shared_libstdcxx.cmake'}")
if(NOT SKIP_PROBE)
  pipelstm_require_shared_libstdcxx()
endif()
add_library(m MODULE m.cpp)
target_link_options(m PRIVATE ${{MODULE_LINK}})
pipelstm_check_built_module(m)
"""


def _project(tmp_path: Path) -> Path:
    (tmp_path / "CMakeLists.txt").write_text(PROJECT)
    (tmp_path / "m.cpp").write_text(
        "#include <sstream>\n#include <string>\n"
        "std::string f(int v) { std::ostringstream s; s << v; return s.str(); }\n")
    # A compiler wrapper like the one seen on a GPU machine's image.
    wrapper = tmp_path / "static-g++"
    wrapper.write_text(f'#!/bin/sh\nexec "{CXX}" "$@" -static-libstdc++\n')
    wrapper.chmod(0o755)
    return tmp_path


def _configure(src: Path, cxx: str, *defines: str) -> subprocess.CompletedProcess:
    build = src / "build"
    shutil.rmtree(build, ignore_errors=True)
    return subprocess.run([CMAKE, "-S", str(src), "-B", str(build), f"-DCMAKE_CXX_COMPILER={cxx}", *defines],
                          capture_output=True, text=True)


def _build(src: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CMAKE, "--build", str(src / "build")], capture_output=True, text=True)


def _module(src: Path) -> list:
    return list((src / "build").glob("*m.so"))


def test_a_dynamically_linking_compiler_builds(tmp_path):
    src = _project(tmp_path)
    configured = _configure(src, CXX)
    assert configured.returncode == 0, configured.stdout + configured.stderr
    built = _build(src)
    assert built.returncode == 0, built.stdout + built.stderr
    assert len(_module(src)) == 1


def test_a_statically_linking_compiler_is_refused_at_configure_time(tmp_path):
    src = _project(tmp_path)
    configured = _configure(src, str(src / "static-g++"))
    assert configured.returncode != 0
    assert "links libstdc++ statically" in configured.stderr
    assert "CXX=/usr/bin/g++" in configured.stderr


def test_a_static_flag_in_the_module_link_flags_is_refused_at_configure_time(tmp_path):
    src = _project(tmp_path)
    configured = _configure(src, CXX, "-DCMAKE_MODULE_LINKER_FLAGS=-static-libstdc++")
    assert configured.returncode != 0
    assert "links libstdc++ statically" in configured.stderr


def test_a_module_linked_statically_anyway_fails_the_build_and_is_removed(tmp_path):
    # Past the configure-time probe (a flag only the target has): the check
    # after the link catches it, and deletes the module so that the next
    # build does not find it up to date.
    src = _project(tmp_path)
    configured = _configure(src, CXX, "-DSKIP_PROBE=ON", "-DMODULE_LINK=-static-libstdc++")
    assert configured.returncode == 0, configured.stdout + configured.stderr
    for _ in range(2):
        built = _build(src)
        assert built.returncode != 0
        assert "the built extension" in built.stdout + built.stderr
        assert _module(src) == []
