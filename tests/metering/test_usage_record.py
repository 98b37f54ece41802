"""A usage record's row: every field, by name (the usage table's columns)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from gateway.metering.usage import UsageRecord

NUMBERS = {"created_at", "cost_usd", "ttft_ms", "duration_ms"}  # floats; *_tokens, *_delivered ints


def test_a_usage_row_holds_every_field_of_the_record_and_nothing_else() -> None:
    # A distinct value per field, of the field's type (a compiled record checks them): a row
    # that swapped or dropped one would show it.
    values: dict[str, Any] = {}
    for i, field in enumerate(fields(UsageRecord)):
        if field.name in NUMBERS:
            values[field.name] = i + 0.5
        elif field.name.endswith(("_tokens", "_delivered")):
            values[field.name] = i
        else:
            values[field.name] = f"value-{i}"
    assert UsageRecord(**values).row() == values
