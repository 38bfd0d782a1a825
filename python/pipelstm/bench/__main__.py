"""``python -m pipelstm.bench <command> [options]``: the benchmarks, one command each.

``python -m pipelstm.bench --help`` lists the commands; ``python -m
pipelstm.bench <command> --help`` gives a command's options.
"""

import sys
from typing import List, Optional

from . import (allocators, cluster, cpu_paths, distributed, docs, floors, gpu, grid, layer, layernorm, layout, lm, module,
               packed, peak, persistent_steps, pipeline, pipelining_peer, regularisation, simulator, small, wavefront)

# name: (entry point, one line for the command list)
COMMANDS = {
    "layer": (layer.main, "the layer op against torch.nn.LSTM, forward + backward"),
    "module": (module.main, "pipelstm.LSTM against torch.nn.LSTM, the whole module"),
    "small": (small.main, "small models, where a call's cost is more than its arithmetic"),
    "grid": (grid.main, "pipelstm.LSTM against torch.nn.LSTM over a grid of sizes"),
    "cpu_paths": (cpu_paths.main, "the CPU path chosen by timing: the fastest?, and its cost over a run"),
    "wavefront": (wavefront.main, "where the layer wavefront beats intra-op threads"),
    "peak": (peak.main, "the cores' FMA peak, the ceiling of every rate"),
    "pipeline": (pipeline.main, "the in-process pipeline on the CPU"),
    "packed": (packed.main, "a PackedSequence through the pipeline against the padded batch"),
    "pipelining": (pipelining_peer.main, "torch.distributed.pipelining as a peer of the pipeline"),
    "distributed": (distributed.main, "pp=2 over 2 processes against 1 process and its peers"),
    "simulator": (simulator.main, "the pipeline simulator's predictions against measured steps"),
    "layout": (layout.main, "the automatic layout against every layout this machine runs"),
    "lm": (lm.main, "a language model's training step at equal cores"),
    "regularisation": (regularisation.main, "weight and variational dropout against plain, and nn.LSTM + weight drop"),
    "layernorm": (layernorm.main, "LayerNormLSTM against pipelstm.LSTM and a LayerNorm cell loop"),
    "allocators": (allocators.main, "the CPU buffer cache against jemalloc and tcmalloc, on a training step"),
    "gpu": (gpu.main, "pipelstm.LSTM against nn.LSTM (cuDNN) over a GPU grid"),
    "persistent_steps": (persistent_steps.main, "the persistent kernels' own µs a step, from their GPU check's log"),
    "floors": (floors.main, "lower bounds for a GPU run, on paper"),
    "cluster": (cluster.main, "predicted scaling on H100 clusters, on paper (the simulator)"),
    "docs": (docs.main, "the benchmark tables of the docs, from the JSON results (--check: compare)"),
}


def usage() -> str:
    """The command list, one line each."""
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: python -m pipelstm.bench <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {line}" for name, (_, line) in COMMANDS.items()]
    lines += ["", "python -m pipelstm.bench <command> --help: that command's options"]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    """Runs the command named by ``argv[0]`` (default: ``sys.argv[1:]``).

    Exits with 0 after ``-h`` / ``--help`` (the command list), with 2 and
    the command list for a missing or unknown command, and with the
    command's status where it returns one (docs: 1 when a doc is out of date).
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0)
    if not argv or argv[0] not in COMMANDS:
        what = f"unknown command {argv[0]!r}" if argv else "no command given"
        print(f"{usage()}\n\npython -m pipelstm.bench: error: {what}", file=sys.stderr)
        sys.exit(2)
    status = COMMANDS[argv[0]][0](argv[1:])
    if isinstance(status, int):
        sys.exit(status)


if __name__ == "__main__":
    main()
