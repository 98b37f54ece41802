"""Client-facing wire formats: request parsing and response shapes, pure."""
