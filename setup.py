"""Builds pipelstm._C with CMake against the torch that is installed.

Environment:
  PIPELSTM_CUDA   auto (default) | on | off: build the CUDA kernels.
  MAX_JOBS        parallel compile jobs (default: all cores).
  CMAKE_BUILD_TYPE  Release (default) or Debug.
  TORCH_CUDA_ARCH_LIST  CUDA architectures, e.g. "8.0;9.0+PTX" (default:
                  sm_80, sm_86, sm_89, sm_90 and PTX for sm_90).
  PIPELSTM_BUILD_DIR  the CMake build folder (default build/cmake-pyXY).

Build without isolation (``pip install --no-build-isolation .``) so the
extension is compiled against the torch it will run with. The build writes
pipelstm/_build_info.py beside the extension (the torch it was compiled
against, its CUDA architectures); importing pipelstm with another torch
release stops with a message naming both.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# Written by CMake beside the module: the torch it was built against
# (read by pipelstm/__init__.py before the module is loaded).
BUILD_INFO = "_build_info.py"


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        # A fixed folder, so that rebuilds (editable installs too) are
        # incremental; PIPELSTM_BUILD_DIR keeps builds against different
        # torch installs apart.
        default_dir = ROOT / "build" / f"cmake-py{sys.version_info.major}{sys.version_info.minor}"
        build_dir = Path(os.environ.get("PIPELSTM_BUILD_DIR", default_dir)).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        config = [
            "cmake",
            str(ROOT),
            "-G",
            "Ninja",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={build_dir / 'lib'}",
            f"-DCMAKE_BUILD_TYPE={os.environ.get('CMAKE_BUILD_TYPE', 'Release')}",
            f"-DPIPELSTM_CUDA={os.environ.get('PIPELSTM_CUDA', 'auto')}",
        ]
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.run(config, cwd=build_dir, check=True)
        subprocess.run(["cmake", "--build", ".", "-j", jobs], cwd=build_dir, check=True)
        # Copied out of the build folder, so builds against different torch
        # installs (separate build folders) never hand each other a stale file;
        # with it what it was built against (read before it is loaded).
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(build_dir / "lib" / target.name, target)
        shutil.copy2(build_dir / "lib" / BUILD_INFO, target.parent / BUILD_INFO)

    def copy_extensions_to_source(self) -> None:
        # An editable install (or --inplace) copies the module into the
        # source tree; its build info goes with it.
        super().copy_extensions_to_source()
        for ext in self.extensions:
            built = Path(self.build_lib, self.get_ext_filename(self.get_ext_fullname(ext.name))).parent
            package = self.get_finalized_command("build_py").get_package_dir(ext.name.rpartition(".")[0])
            self.copy_file(str(built / BUILD_INFO), str(Path(package) / BUILD_INFO), level=self.verbose)


def torch_requirement() -> str:
    """The torch a build runs with: the exact release it is compiled
    against (the extension links that release's libraries; import stops
    with another), or the tested range where no torch is installed."""
    try:
        import torch
    except ImportError:
        return "torch>=2.11,<2.15"
    return "torch==" + torch.__version__.split("+")[0]


setup(
    install_requires=[torch_requirement(), "numpy"],
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[CMakeExtension("pipelstm._C")],
    cmdclass={"build_ext": CMakeBuild},
)
