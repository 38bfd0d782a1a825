"""Run by `make test-wheel` on the source distribution it builds: the
tarball holds every tracked file the build reads (CMakeLists.txt, cmake/,
csrc/, kernels/ and the Python package) and the licence, and no build
output (a compiled module, the generated build info) from this tree.

    python tests/scripts/sdist_check.py dist/pipelstm-0.1.0.tar.gz
"""

import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NEEDED_DIRS = ("cmake/", "csrc/", "kernels/include/", "kernels/src/", "python/pipelstm/")
NEEDED_FILES = {"CMakeLists.txt", "setup.py", "pyproject.toml", "LICENSE", "README.md"}

tarball = Path(sys.argv[1])
with tarfile.open(tarball) as tar:
    names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
needed = {f for f in tracked if f.startswith(NEEDED_DIRS) or f in NEEDED_FILES}
missing = sorted(needed - set(names))
assert not missing, f"{tarball.name} lacks files the build needs: {missing}"
outputs = [n for n in names if n.endswith((".so", ".pyc")) or n.endswith("_build_info.py")]
assert not outputs, f"{tarball.name} carries build outputs: {outputs}"
print(f"sdist OK: {tarball.name} holds the {len(needed)} tracked files the build needs, and no build output")
