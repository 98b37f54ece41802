""".ci/audit's verdicts, on pip-audit reports made up here (no network needed): a finding
fails unless its id or an alias is ignored with a reason; no reachable service skips."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "audit"


def load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("ci_audit", str(SCRIPT))
    spec = importlib.util.spec_from_loader("ci_audit", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def report(*vulns: dict[str, Any], unknown: int = 0) -> dict[str, Any]:
    deps: list[dict[str, Any]] = [
        {"name": "aiohttp", "version": "3.0.0", "vulns": list(vulns)},
        {"name": "orjson", "version": "3.10.0", "vulns": []},
    ]
    deps += [{"name": f"local{i}", "skip_reason": "not found"} for i in range(unknown)]
    return {"dependencies": deps, "fixes": []}


VULN = {"id": "PYSEC-2024-1", "aliases": ["CVE-2024-0001", "GHSA-aaaa-bbbb-cccc"],
        "fix_versions": ["3.9.4"]}  # fmt: skip


def verdict(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    results: dict[str, dict[str, Any] | str],
    ignore: str = "",
) -> int:
    audit = load()
    ignore_file = tmp_path / "pip-audit-ignore.txt"
    ignore_file.write_text(ignore)
    monkeypatch.setattr(audit, "IGNORE_FILE", ignore_file)
    monkeypatch.setattr(audit, "run", lambda service: results[service])
    code: int = audit.main()
    return code


def test_a_finding_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verdict(monkeypatch, tmp_path, {"pypi": report(VULN), "osv": "unused"}) == 1
    out = capsys.readouterr().out
    assert "VULNERABLE  aiohttp 3.0.0: PYSEC-2024-1 / CVE-2024-0001" in out
    assert "fixed in: 3.9.4" in out and "FAILED" in out


def test_an_ignored_alias_with_a_reason_passes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ignore = "# comment\n\nGHSA-aaaa-bbbb-cccc  # only the client side, unused\nCVE-1-2 # gone\n"
    assert verdict(monkeypatch, tmp_path, {"pypi": report(VULN, unknown=2)}, ignore) == 0
    out = capsys.readouterr().out
    assert "ignored: only the client side, unused" in out
    assert "CVE-1-2 is in pip-audit-ignore.txt but no longer found" in out
    assert "not on the service (2): local0, local1" in out


def test_an_ignore_entry_needs_a_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert verdict(monkeypatch, tmp_path, {"pypi": report(VULN)}, "PYSEC-2024-1\n") == 2


def test_no_reachable_service_skips(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results: dict[str, dict[str, Any] | str] = {
        "pypi": {"dependencies": [{"name": "x", "skip_reason": "not found on PyPI"}]},
        "osv": "ConnectionError: Failed to resolve 'api.osv.dev'",
    }
    assert verdict(monkeypatch, tmp_path, results) == 0
    assert "SKIPPED" in capsys.readouterr().out
    # ... and the second service is used when the first knows nothing.
    results["osv"] = report(VULN)
    assert verdict(monkeypatch, tmp_path, results) == 1
    assert "checked (osv)" in capsys.readouterr().out
