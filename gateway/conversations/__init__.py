"""The conversation store: event types, the store protocol and backends, derive, recording."""
