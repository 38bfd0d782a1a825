"""Benchmarks: ``python -m pipelstm.bench {layer,module,grid,pipeline,lm,pipelining,distributed,floors} [options]``.

Every bench runs the things it compares in one loop, one run of each in
turn (configurations in other processes stay up and take their turn, see
:mod:`.groups`), so that drift and other processes' noise hit all alike,
and reports medians of at least 5 runs (fewer only with ``--quick``).

``--json PATH`` also writes the rows, the command, the machine (CPU, ISA,
cores), the versions, the commit and the date (:mod:`.report`);
``python -m pipelstm.bench docs`` regenerates the tables of
docs/bench/*.md and the headlines of README.md and docs/benchmarks.md
from those files (:mod:`.docs`, :mod:`.summary`).
"""
