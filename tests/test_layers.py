"""The package's floors point one way (docs/layout.md, "Which way imports point").

Each module belongs to a layer; a module may import from its own layer and the layers below it,
never from one above. A newcomer reads down the data path and never has to jump back up to
understand a lower floor. Every import counts, as in `test_imports.py`: under `TYPE_CHECKING`
and inside functions too.
"""

from __future__ import annotations

from tests.test_imports import ROOT, _graph

# Top to bottom. A module is in the layer of the longest prefix that names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "wiring",
        (
            "gateway.__main__",
            "gateway.cli",
            "gateway.workers",
            "gateway.app",
            "gateway.reload",
            "gateway.heartbeat",
            "gateway.litellm_import",
            "gateway.connect_check",
        ),
    ),
    ("the server", ("gateway.http",)),
    ("the data path", ("gateway.pipeline", "gateway.tracing")),
    ("the app's state", ("gateway.context",)),
    ("conversations", ("gateway.conversations",)),
    ("client dialects", ("gateway.dialects",)),
    ("routing", ("gateway.routing",)),
    ("metering", ("gateway.metering",)),
    ("provider wire formats", ("gateway.providers",)),
    (
        "the wire",
        (
            "gateway.upstream",
            "gateway.downstream",
            "gateway.stream",
            "gateway.forms",
            "gateway.lanes",
            "gateway.redis_client",
        ),
    ),
    ("the store", ("gateway.storage",)),
    ("logs and secrets", ("gateway.logs", "gateway.scrub")),
    (
        "configuration",
        (
            "gateway.config",
            "gateway.url_check",
            # The rules it checks fields with, which depend on nothing above it.
            "gateway.metering.price_file",
            "gateway.providers.cloud",
            "gateway.providers.extras",
            "gateway.upstream.proxy",
            "gateway.upstream.tls",
        ),
    ),
    ("base", ("gateway", "gateway.errors", "gateway.ids", "gateway.metrics")),
]

# Imports against the direction that are known and still to be turned around, each with what
# it is for (none now). The list only shrinks: a new upward import fails the test.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[1]
            ):
                best = (rank, len(prefix))
    assert best is not None, f"{module} is in no layer: add it to LAYERS (and docs/layout.md)"
    return best[0]


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    # A package whose __init__ imports nothing (a docstring) is no floor of its own: `from
    # gateway.providers import cloud` imports gateway.providers.cloud, not the providers.
    inert = {m for m, targets in graph.items() if not targets and _is_package(m)}
    return {
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if target not in inert and layer_of(target) < layer_of(module)
    }


def _is_package(module: str) -> bool:
    return (ROOT.parent.joinpath(*module.split(".")) / "__init__.py").is_file()


def test_every_module_is_in_a_layer() -> None:
    for module in _graph():
        layer_of(module)


def test_no_import_points_up_but_the_known_ones() -> None:
    upward = upward_imports(_graph())
    new = sorted(upward - KNOWN_UPWARD)
    assert not new, "imports against the layers' direction (docs/layout.md): " + ", ".join(
        f"{module} -> {target} ({LAYERS[layer_of(module)][0]} -> {LAYERS[layer_of(target)][0]})"
        for module, target in new
    )


def test_the_known_ones_are_still_there() -> None:
    """An upward import turned around leaves the list too, so it cannot come back unseen."""
    gone = sorted(KNOWN_UPWARD - upward_imports(_graph()))
    assert not gone, f"no longer imported: remove from KNOWN_UPWARD: {gone}"


def test_an_upward_import_is_found() -> None:
    graph = {"gateway.storage.store": {"gateway.pipeline.relay"}, "gateway.pipeline.relay": set()}
    assert upward_imports(graph) == {("gateway.storage.store", "gateway.pipeline.relay")}
    assert upward_imports({"gateway.pipeline.relay": {"gateway.storage.store"}}) == set()
