"""Runs examples/train_lm.py with the last rank starting late, as a rank
still importing torch would: a check that stops the run must still let every
rank say why before torchrun stops the others."""

import os
import runpy
import sys
import time
from pathlib import Path

if int(os.environ["RANK"]) == int(os.environ["WORLD_SIZE"]) - 1:
    time.sleep(float(os.environ.get("PIPELSTM_TEST_LATE_S", "3")))
script = Path(__file__).resolve().parents[2] / "examples" / "train_lm.py"
sys.argv = [str(script)] + sys.argv[1:]
runpy.run_path(str(script), run_name="__main__")
