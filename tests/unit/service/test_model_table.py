"""The ready table: Triton's layout, so people (and scripts) reading Triton's start-up read ours."""

from __future__ import annotations

from serve_app.service.model_table import model_table


def test_one_ready_model_is_tritons_table() -> None:
    assert model_table([("simple", "1", "READY", "")]) == (
        "+--------+---------+--------+\n"
        "| Model  | Version | Status |\n"
        "+--------+---------+--------+\n"
        "| simple | 1       | READY  |\n"
        "+--------+---------+--------+"
    )


def test_rows_are_sorted_and_unavailable_ones_carry_their_reason_on_one_line() -> None:
    table = model_table(
        [("b", "2", "READY", ""), ("b", "10", "READY", ""), ("a", "", "UNAVAILABLE", "ValueError: no\n\nAt:\n  x.py")]
    )
    lines = table.splitlines()
    assert [line.split("|")[1].strip() for line in lines[3:6]] == ["a", "b", "b"]
    assert [line.split("|")[2].strip() for line in lines[3:6]] == ["-", "2", "10"]
    assert lines[3].split("|")[3].strip() == "UNAVAILABLE: ValueError: no At: x.py"
    assert len({len(line) for line in lines}) == 1  # every line as wide as the others
