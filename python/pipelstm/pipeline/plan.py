"""``Pipeline.plan``: the stages as a table."""

from typing import List, Optional, Sequence, Tuple

import torch

from .balance import kept_bytes
from .units import Unit

__all__ = ["Plan", "format_bytes"]


class Plan:
    """The stages of a pipeline as a table (``Pipeline.plan``): one row per
    stage; ``print(model.plan)`` shows it.

    Args:
        units: the pipeline's units, their costs estimated.
        balance: units per stage.
        devices, threads: per stage.
        checkpoint: the recomputation mode (what a stage keeps for backward).
        sample_shape: ``(T, B)`` of the profiled sample (costs in seconds,
            activations for the sample), or None (FLOP cost model, per token).
    """

    def __init__(self, units: Sequence[Unit], balance: Sequence[int], devices: Sequence[torch.device],
                 threads: Sequence[int], checkpoint: str, sample_shape: Optional[Tuple[int, int]]) -> None:
        self.per_token = sample_shape is None
        self.unit_label = "MFLOP/token" if self.per_token else "ms"
        self.rows: List[dict] = []
        i = 0
        for s, count in enumerate(balance):
            stage = units[i : i + count]
            i += count
            self.rows.append(dict(
                stage=s, device=str(devices[s]), units=[u.name for u in stage],
                est=sum(u.cost for u in stage), params=sum(u.num_params() for u in stage),
                act_bytes=kept_bytes(stage, checkpoint), threads=threads[s],
            ))

    def __str__(self) -> str:
        est_head = f"est. time ({self.unit_label})" if self.unit_label == "ms" else f"est. cost ({self.unit_label})"
        act_head = "activations/token" if self.per_token else "activations"
        head = ["stage", "device", "threads", "units", est_head, "params", act_head]
        body = [[
            str(r["stage"]), r["device"], str(r["threads"]), ", ".join(r["units"]),
            f"{r['est'] * (1e3 if self.unit_label == 'ms' else 1e-6):.3f}",
            f"{r['params']:,}", format_bytes(r["act_bytes"]),
        ] for r in self.rows]
        widths = [max(len(h), *(len(b[c]) for b in body)) for c, h in enumerate(head)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        return "\n".join([line(head), line(["-" * w for w in widths])] + [line(b) for b in body])

    __repr__ = __str__


def format_bytes(n: float) -> str:
    """``n`` bytes for people: ``"512 B"``, ``"1.5 KiB"``, ... up to GiB."""
    units = ("B", "KiB", "MiB", "GiB")
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"
