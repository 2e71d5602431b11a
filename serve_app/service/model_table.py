"""The table of models a server prints once it is ready, laid out as Triton's (``table_printer.cc``).

Triton ends its start-up with one row per model version (``Model``,
``Version``, ``Status``, the status followed by the reason when it is not
READY); without a terminal its columns are as wide as their widest cell.
"""

from __future__ import annotations

from collections.abc import Iterable

HEADERS = ("Model", "Version", "Status")
# Triton's exit at start-up, with --exit-on-error, when a model failed to load.
LOAD_FAILED = "error: creating server: Internal - failed to load all models"


def failed_to_load(rows: Iterable[tuple[str, str, str, str]]) -> bool:
    """Whether a model of the start-up table is not READY (``rows`` as :func:`model_table` takes them)."""
    return any(state != "READY" for _, _, state, _ in rows)


def model_table(rows: Iterable[tuple[str, str, str, str]]) -> str:
    """``rows``: (model, version, state, reason); sorted by model, then version, as Triton's are."""
    cells = []
    for name, version, state, reason in rows:
        status = f"{state}: {' '.join(reason.split())}" if reason else state
        cells.append((name, version or "-", status))
    cells.sort(key=lambda r: (r[0], int(r[1]) if r[1].isdigit() else -1))
    widths = [max(len(c[i]) for c in [HEADERS, *cells]) for i in range(len(HEADERS))]
    divider = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(row: tuple[str, ...]) -> str:
        return "|" + "".join(f" {cell:<{w}} |" for cell, w in zip(row, widths, strict=True))

    return "\n".join([divider, line(HEADERS), divider, *(line(r) for r in cells), divider])
