"""An OpenAI-compatible LLM gateway that records exactly what each user saw."""

from gateway import native

__version__ = "0.1.0"

native.install()  # before any other module of the package is imported (gateway.native)
