"""``Pipeline.plan``: the stages as a table."""

from typing import List

from .balance import kept_bytes

__all__ = ["Plan", "format_bytes"]


class Plan:
    """``Pipeline.plan``: one row per stage; ``print(model.plan)`` shows the table."""

    def __init__(self, pipe) -> None:
        self.unit_label = pipe._cost_unit
        self.rows: List[dict] = []
        i = 0
        for s, count in enumerate(pipe.balance):
            units = pipe._units[i : i + count]
            i += count
            self.rows.append(dict(
                stage=s, device=str(pipe._devices[s]), units=[u.name for u in units],
                est=sum(u.cost for u in units), params=sum(u.num_params() for u in units),
                act_bytes=kept_bytes(units, pipe.checkpoint), threads=pipe.threads[s],
            ))
        self.per_token = pipe._sample_shape is None

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
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
