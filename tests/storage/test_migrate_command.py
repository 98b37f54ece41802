"""`gateway migrate`: brings a store's schema up to date, on either backend, and says where
it stands; running it again applies nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.storage import schema


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migrate_applies_then_finds_nothing_to_do(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path}/gw.db" if backend == "sqlite" else request.getfixturevalue("pg_url")
    )
    config = tmp_path / "gw.yaml"
    config.write_text(f"store: {{url: '{url}', spool_path: '{tmp_path}/spool'}}\n")
    command = [sys.executable, "-m", "gateway", "migrate", "--config", str(config)]
    first = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    latest = schema.latest(backend)  # type: ignore[arg-type]
    versions = ", ".join(str(m.version) for m in schema.MIGRATIONS[backend])  # type: ignore[index]
    assert f"schema version {latest} ({versions})" in first.stdout
    if backend == "postgresql":
        assert "//***@127.0.0.1" in first.stdout  # the credentials are never printed
    again = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0
    assert f"schema version {latest} (nothing to apply)" in again.stdout


def test_migrate_names_a_store_it_cannot_reach(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text("store: {url: 'postgresql://gw:secret@127.0.0.1:1/none'}\n")
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "migrate", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "127.0.0.1:1" in result.stderr and "secret" not in result.stderr
