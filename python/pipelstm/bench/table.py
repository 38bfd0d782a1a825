"""Markdown tables of benchmark rows, from one column spec.

A bench describes its table once, as a list of :class:`Column`; the same
spec prints the table on stdout while the bench runs, is stored in the
bench's JSON file next to the rows, and lets ``python -m pipelstm.bench
docs`` rebuild the table from the JSON alone.
"""

from dataclasses import asdict, dataclass
from typing import Iterable, List, Mapping, Sequence

__all__ = ["Column", "header", "row_line", "add_row", "markdown", "columns_to_json", "columns_from_json"]


@dataclass(frozen=True)
class Column:
    """One column: ``row[key]`` times ``scale``, formatted with ``fmt``
    (a ``str.format`` template). ``None`` (or a missing key) shows as ``-``;
    a list shows as its items joined by `` / `` (e.g. one value per stage).
    """

    key: str
    title: str
    fmt: str = "{}"
    scale: float = 1.0

    def cell(self, row: Mapping) -> str:
        value = row.get(self.key)
        if value is None:
            return "-"
        if isinstance(value, (list, tuple)):
            return " / ".join(self._one(v) for v in value)
        return self._one(value)

    def _one(self, value) -> str:
        if value is None:
            return "-"
        if self.scale != 1.0 and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = value * self.scale
        return self.fmt.format(value)


def header(columns: Sequence[Column]) -> str:
    """The title line and the separator line of a table."""
    return "| " + " | ".join(c.title for c in columns) + " |\n|" + "---|" * len(columns)


def row_line(columns: Sequence[Column], row: Mapping) -> str:
    """One row of the table."""
    return "| " + " | ".join(c.cell(row) for c in columns) + " |"


def add_row(rows: List[Mapping], columns: Sequence[Column], row: Mapping) -> None:
    """Keeps ``row`` and prints it as the table's next line at once (a long run shows its progress)."""
    rows.append(row)
    print(row_line(columns, row), flush=True)


def markdown(columns: Sequence[Column], rows: Iterable[Mapping]) -> str:
    """The whole table (no trailing newline)."""
    return "\n".join([header(columns)] + [row_line(columns, r) for r in rows])


def columns_to_json(columns: Sequence[Column]) -> List[dict]:
    return [asdict(c) for c in columns]


def columns_from_json(data: Sequence[Mapping]) -> List[Column]:
    return [Column(**d) for d in data]
