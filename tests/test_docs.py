"""The docs describe the product as it is: every config field, route and metric is documented,
README.md stays a front door, and every relative link lands on a file (and heading) that exists."""

from __future__ import annotations

import re
from importlib import import_module
from pathlib import Path

import pytest
from pydantic import BaseModel

from gateway.app import create_app
from gateway.config import (
    DeploymentConfig,
    GatewayConfig,
    ModelConfig,
    TimeoutsConfig,
    parse_config,
)

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
# Every Markdown file whose links are checked: the front door, the manual, and the two
# READMEs beside the code they describe.
MARKDOWN = [README, *sorted(DOCS.glob("*.md")), ROOT / "bench/README.md", ROOT / "deploy/README.md"]


def _read(name: str) -> str:
    return (DOCS / name).read_text()


def _fields(model: type[BaseModel], prefix: str) -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out += _fields(annotation, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def test_every_config_field_is_in_the_configuration_doc() -> None:
    doc = _read("configuration.md")
    names = [f for f in _fields(GatewayConfig, "") if f != "models"]
    names += _fields(ModelConfig, "models[].")
    names += _fields(DeploymentConfig, "deployments[].")
    assert all(f"deployments[].timeouts.{f}" in names for f in TimeoutsConfig.model_fields)
    missing = [n for n in names if f"`{n}`" not in doc]
    assert missing == []


def test_every_route_is_in_the_api_doc() -> None:
    doc = _read("api.md")
    app = create_app(parse_config({}).config)
    paths = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    missing = [p for p in paths if f"{p}`" not in doc and f"{p}," not in doc]
    assert missing == []


def test_every_metric_is_in_the_operations_doc() -> None:
    from gateway.metrics import REGISTRY

    # These register their metrics when imported, which serving does only with Redis.
    for module in ("gateway.metering.redis_limits", "gateway.redis_client"):
        import_module(module)

    doc = _read("operations.md")
    names = {m.name for m in REGISTRY.collect()}
    # prometheus-client drops the _total suffix from counter family names.
    missing = [n for n in names if f"`{n}`" not in doc and f"`{n}_total`" not in doc]
    assert missing == []


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < 300, f"README.md has {len(lines)} lines: move reference into docs/"


_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    return {_anchor(m) for m in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.MULTILINE)}


def _links(path: Path) -> list[str]:
    return _LINK.findall(_FENCE.sub("", path.read_text()))


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files(path: Path) -> None:
    broken = []
    for target in _links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in _anchors(linked):
            broken.append(f"{target}: no such heading")
    assert broken == []


# The mypyc build is gone; only the decision that undid it may mention it.
_REMOVED = re.compile(r"mypyc|\.native\b|GATEWAY_NATIVE|gateway/native\.py", re.IGNORECASE)


@pytest.mark.parametrize(
    "path",
    [p for p in MARKDOWN if p.name != "decisions.md"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_doc_describes_the_removed_compiled_build(path: Path) -> None:
    hits = [line for line in path.read_text().splitlines() if _REMOVED.search(line)]
    assert hits == []


# Code cites a doc as `docs/recording.md` or `docs/recording.md, "Order inside a turn"` (the
# title may be broken across comment or docstring lines).
_CITATION = re.compile(r'docs/([\w-]+\.md)(?:,\s*"([^"]+)")?')
_SOURCES = ["gateway", "tests", "bench"]


def _citations() -> list[tuple[str, str, str | None]]:
    out = []
    for top in _SOURCES:
        for source in sorted((ROOT / top).rglob("*.py")):
            text = source.read_text()
            for match in _CITATION.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                title = match.group(2)
                if title is not None:
                    title = " ".join(title.replace("#", " ").split())
                where = f"{source.relative_to(ROOT)}:{line}"
                out.append((where, match.group(1), title))
    return out


def test_every_doc_the_code_cites_exists() -> None:
    broken = []
    for where, name, title in _citations():
        path = DOCS / name
        if not path.exists():
            broken.append(f"{where}: docs/{name} does not exist")
        elif title is not None and _anchor(title) not in _anchors(path):
            broken.append(f'{where}: docs/{name} has no section "{title}"')
    assert broken == []
