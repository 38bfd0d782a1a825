import sys

from . import distributed, docs, floors, gpu, grid, layer, lm, module, peak, pipeline, pipelining_peer, wavefront

# docs: the tables of docs/benchmarks.md from the JSON results
COMMANDS = {"floors": floors.main, "gpu": gpu.main, "layer": layer.main, "module": module.main, "grid": grid.main,
              "pipeline": pipeline.main, "lm": lm.main, "pipelining": pipelining_peer.main,
              "distributed": distributed.main, "wavefront": wavefront.main, "peak": peak.main, "docs": docs.main}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: python -m pipelstm.bench {{{','.join(COMMANDS)}}} [options]")
    status = COMMANDS[sys.argv[1]](sys.argv[2:])
    if isinstance(status, int):  # docs: 1 when the doc is out of date
        sys.exit(status)


if __name__ == "__main__":
    main()
