"""`gateway usage --group-by tag:KEY`: the report `/v1/usage?group_by=tag:KEY` gives, as the
CLI's table, read from the store of the config."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream
from tests.metering.test_usage_export import billed, report

GATEWAY = [sys.executable, "-m", "gateway"]


async def usage_cli(
    gw: GatewayUnderTest, tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "cli.yaml"
    config.write_text(f"store: {{url: 'sqlite:///{gw.db_path}'}}\nmodels: []\n")
    return await asyncio.to_thread(
        subprocess.run,
        [*GATEWAY, "usage", *args, "--config", str(config)],
        capture_output=True,
        text=True,
    )


async def test_the_cli_groups_usage_by_a_metadata_tag(
    make_gateway: MakeGateway, upstream: FakeUpstream, tmp_path: Path
) -> None:
    gw, _ = await billed(make_gateway, upstream, {})
    result = await usage_cli(gw, tmp_path, "--group-by", "tag:project")
    assert result.returncode == 0, result.stderr
    header, *lines = result.stdout.splitlines()
    assert header.split()[:3] == ["period", "tag:project", "requests"]
    table = {line.split()[1]: line.split() for line in lines}
    expected = await report(gw, "group_by=tag:project")
    assert len(table) == len(expected) == 3  # apollo, zeus, and the untagged ("-")
    for row in expected:
        cells = table["-" if row["group"] is None else row["group"]]
        assert int(cells[2]) == row["requests"]
        assert float(cells[-1]) == round(row["cost_usd"], 6)
    refused = await usage_cli(gw, tmp_path, "--group-by", "tag:no spaces")
    assert refused.returncode == 2 and "tag:KEY" in refused.stderr
