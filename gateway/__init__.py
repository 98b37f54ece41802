"""An OpenAI-compatible LLM gateway that records exactly what each user saw."""

__version__ = "0.1.0"
