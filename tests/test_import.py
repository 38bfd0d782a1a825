"""``import pipelstm`` stays light: it loads no TorchDynamo (about 1.3 s of
import on a 2-core machine, enough for torchrun's agent to stop a slow rank
before it reports its own error)."""

import subprocess
import sys


def test_import_does_not_load_torchdynamo():
    done = subprocess.run([sys.executable, "-c", "import sys, pipelstm; print('torch._dynamo' in sys.modules)"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
