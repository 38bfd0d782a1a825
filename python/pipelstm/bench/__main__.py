import sys

from . import distributed, floors, layer, module, pipeline, pipelining_peer

BENCHMARKS = {"floors": floors.main, "layer": layer.main, "module": module.main, "pipeline": pipeline.main,
              "pipelining": pipelining_peer.main, "distributed": distributed.main}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHMARKS:
        sys.exit(f"usage: python -m pipelstm.bench {{{','.join(BENCHMARKS)}}} [options]")
    BENCHMARKS[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
