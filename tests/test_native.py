"""The compiled recording path (gateway.native): used only when it matches its sources."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway import native

WHERE = "import gateway.stream.compact as m, gateway.native as n; print(m.__file__, n.active())"


def _python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "GATEWAY_NATIVE"} | env
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=environ, capture_output=True, text=True,
        check=True,
    )  # fmt: skip


@pytest.fixture
def build() -> dict[str, Path]:
    found = native.built()
    if isinstance(found, str):
        pytest.skip(f"no compiled build here ({found}): `make` builds one where cc exists")
    return found


def test_a_build_that_matches_its_sources_is_what_runs(build: dict[str, Path]) -> None:
    assert native.active()
    for path in native.COMPILED:
        module = sys.modules.get(native.module_name(path)) or __import__(
            native.module_name(path), fromlist=["_"]
        )
        assert module.__file__ == str(build[native.module_name(path)])
        assert module.__file__.startswith(str(native.DIRECTORY))


def test_gateway_native_0_runs_plain_python(build: dict[str, Path], tmp_path: Path) -> None:
    out = _python(WHERE, tmp_path, GATEWAY_NATIVE="0").stdout.split()
    assert out == [str(native.ROOT / "gateway/stream/compact.py"), "False"]


def test_a_build_moved_beside_an_installed_copy_of_the_package_is_used(
    build: dict[str, Path], tmp_path: Path
) -> None:
    # What the container image does: built from a source tree, then put in site-packages.
    site = tmp_path / "site-packages"
    shutil.copytree(native.ROOT / "gateway", site / "gateway")
    shutil.copytree(native.DIRECTORY, site / ".native", ignore=shutil.ignore_patterns("build"))
    done = _python(WHERE, tmp_path, PYTHONPATH=str(site))
    library = site / ".native/gateway/stream" / ("compact" + native._SUFFIX)
    assert done.stdout.split() == [str(library), "True"]
    assert done.stderr == ""


def test_one_changed_source_leaves_the_whole_build_unused(
    build: dict[str, Path], tmp_path: Path
) -> None:
    # A copy of the package beside the real build, one compiled module edited.
    shutil.copytree(native.ROOT / "gateway", tmp_path / "gateway")
    (tmp_path / ".native").symlink_to(native.DIRECTORY)
    with (tmp_path / "gateway/stream/compact.py").open("a") as source:
        source.write("\n# edited after the build\n")
    done = _python(WHERE, tmp_path, PYTHONPATH=str(tmp_path))
    assert done.stdout.split() == [str(tmp_path / "gateway/stream/compact.py"), "False"]
    assert "stale: changed since the build: gateway/stream/compact.py" in done.stderr
    assert "run `make`" in done.stderr


def test_a_build_is_used_only_whole(tmp_path: Path) -> None:
    for path in native.COMPILED:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(native.ROOT / path, tmp_path / path)
    build = tmp_path / ".native"
    assert native.built(build, tmp_path) == "not built"
    build.mkdir()
    manifest = {
        "python": sys.implementation.cache_tag,
        "suffix": native._SUFFIX,
        "sources": native.digests(tmp_path),
    }
    (build / native.MANIFEST).write_text(json.dumps(manifest))
    missing = native.built(build, tmp_path)
    assert isinstance(missing, str) and missing.startswith("incomplete: missing")
    for name in [*map(native.module_name, native.COMPILED), f"{native.GROUP}__mypyc"]:
        library = build / (name.replace(".", "/") + native._SUFFIX)
        library.parent.mkdir(parents=True, exist_ok=True)
        library.write_bytes(b"")
    found = native.built(build, tmp_path)
    assert isinstance(found, dict) and len(found) == len(native.COMPILED) + 1
    # Another interpreter's build, or a manifest a crash left half-written: not used.
    (build / native.MANIFEST).write_text(json.dumps(manifest | {"python": "cpython-399"}))
    running = sys.implementation.cache_tag
    assert native.built(build, tmp_path) == f"built for cpython-399, running {running}"
    (build / native.MANIFEST).write_text("{")
    assert str(native.built(build, tmp_path)).startswith("unreadable manifest")
