"""A usage record's row: every field, by name (the usage table's columns)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from gateway.metering.usage import UsageRecord


def _distinct(i: int, annotation: str) -> Any:
    # Of the field's own type: a compiled record (gateway.native) checks them.
    if annotation.startswith("int"):
        return i
    if annotation.startswith("float"):
        return i + 0.5
    return f"value-{i}"


def test_a_usage_row_holds_every_field_of_the_record_and_nothing_else() -> None:
    values = {f.name: _distinct(i, str(f.type)) for i, f in enumerate(fields(UsageRecord))}
    # A distinct value per field: a row that swapped or dropped one would show it.
    assert UsageRecord(**values).row() == values
