"""The packages litellm imports only on a provider's first request (Google's auth for Vertex AI,
AWS's signer for Bedrock), which the `providers` extra installs: without one, `check-config`
fails naming the file, the field, the package and the extra, instead of a 502 on each request."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

GATEWAY = [sys.executable, "-m", "gateway"]
VERTEX = {"provider": "litellm", "model": "vertex_ai/gemini-2.5-flash"}
BEDROCK = {"provider": "litellm", "model": "bedrock/anthropic.claude-3-7-sonnet-20250219-v1:0"}


def config_of(*deployments: dict[str, Any]) -> dict[str, Any]:
    return {"models": [{"name": "m", "deployments": list(deployments)}]}


def without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment whose Python cannot import `modules`, as if never installed."""
    site = tmp_path / "site"
    site.mkdir()
    lines = ["import sys"] + [f"sys.modules[{m!r}] = None" for m in modules]
    (site / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    return {"PYTHONPATH": f"{site}:{Path.cwd()}", "PATH": "/usr/bin:/bin"}


@pytest.mark.parametrize(
    ("deployment", "module", "package"),
    [(VERTEX, "google.auth", "google-auth"), (BEDROCK, "botocore", "botocore")],
    ids=["vertex", "bedrock"],
)
def test_check_config_names_the_missing_extra(
    tmp_path: Path, deployment: dict[str, Any], module: str, package: str
) -> None:
    """Without the package its provider imports on the first request, `check-config` exits 2
    naming the file, the deployment's `model` field, the package and the extra to install; with
    it, the same file is OK."""
    path = tmp_path / "gateway.yaml"
    path.write_text(json.dumps(config_of(deployment)))
    missing = subprocess.run(
        [*GATEWAY, "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        env=without(tmp_path, module),
    )
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert f"{path}: models[0].deployments[0].model:" in missing.stderr
    assert package in missing.stderr
    assert "pip install 'gateway[providers]'" in missing.stderr

    installed = subprocess.run(
        [*GATEWAY, "check-config", "--config", str(path)], capture_output=True, text=True
    )
    assert installed.returncode == 0, installed.stderr
    assert "OK (1 model aliases: m)" in installed.stdout


def test_the_extra_holds_every_package_named_and_is_installed_everywhere() -> None:
    """Each package a provider is checked for is in the `providers` extra, and `make run`,
    `make test` and the container image install that extra."""
    import re
    import tomllib

    from gateway.providers import extras

    root = Path(__file__).parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    listed = {
        re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()
        for requirement in project["optional-dependencies"][extras.EXTRA]
    }
    named = {package for needs in extras.NEEDS.values() for _, package in needs}
    assert named <= listed

    makefile = (root / "Makefile").read_text()
    assert "pip install --quiet -e '.[providers]'" in makefile  # make run
    assert "pip install --quiet -e '.[dev,providers]'" in makefile  # make test
    dockerfile = (root / "deploy" / "Dockerfile").read_text()
    assert "pip install '.[providers]'" in dockerfile
