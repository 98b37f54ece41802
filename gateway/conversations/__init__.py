"""Conversations: recording a turn (recorder, turn_ends), deriving history from the event log,
joining a request to its conversation (service, history, threading), and reading it back."""
