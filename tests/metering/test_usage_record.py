"""A usage record's row: every field, by name (the usage table's columns)."""

from __future__ import annotations

from dataclasses import fields

from gateway.metering.usage import UsageRecord


def test_a_usage_row_holds_every_field_of_the_record_and_nothing_else() -> None:
    # A distinct value per field: a row that swapped or dropped one would show it.
    values = {f.name: f"value-{i}" for i, f in enumerate(fields(UsageRecord))}
    assert UsageRecord(**values).row() == values
