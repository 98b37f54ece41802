"""The operator's commands: `--version`, `migrate --status` / `--dry-run`, a schema newer than the
code refused, teams update and delete, key rotation (CLI and admin API), spool status."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from gateway import __version__
from gateway.cli import main
from gateway.config import parse_config
from gateway.storage import schema
from gateway.storage.backends import make_store
from gateway.storage.spool import Spool
from gateway.storage.writes import Write
from tests.conftest import GatewayUnderTest, MakeGateway

MASTER = "master-key-for-tests-0123456789"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "gw.yaml"
    path.write_text(
        f"store: {{url: 'sqlite:///{tmp_path}/gw.db', spool_path: '{tmp_path}/spool'}}\n"
        "models: [{name: demo, deployments: [{provider: demo, chunk_delay_ms: 0}]}]\n"
    )
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"gateway {__version__}"


def test_migrate_status_and_dry_run_change_nothing(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    latest = schema.latest("sqlite")
    code, out, _ = run(capsys, "migrate", "--dry-run", "--config", str(config))
    assert code == 0
    assert f"schema version 0, this gateway knows {latest}" in out
    would = [line for line in out.splitlines() if line.startswith("would apply")]
    assert len(would) == len(schema.MIGRATIONS["sqlite"])
    with sqlite3.connect(tmp_path / "gw.db") as db:
        tables = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    assert tables == []  # a dry run creates nothing

    code, out, _ = run(capsys, "migrate", "--config", str(config))
    assert code == 0 and f"schema version {latest}" in out

    code, out, _ = run(capsys, "migrate", "--status", "--config", str(config))
    assert code == 0
    applied = [line for line in out.splitlines() if line.startswith("applied")]
    assert len(applied) == len(schema.MIGRATIONS["sqlite"])
    assert "nothing to apply" in out


def test_a_schema_newer_than_the_code_is_refused(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "migrate", "--config", str(config))[0] == 0
    newer = schema.latest("sqlite") + 1
    with sqlite3.connect(tmp_path / "gw.db") as db:
        db.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, 'future', 0)",
            (newer,),
        )
    code, _, err = run(capsys, "migrate", "--config", str(config))
    assert code == 1
    assert f"schema version {newer}, newer than this gateway knows" in err
    code, _, err = run(capsys, "migrate", "--status", "--config", str(config))
    assert code == 1 and "newer than this gateway" in err

    async def start(migrate: bool) -> None:
        loaded = parse_config(
            {"store": {"url": f"sqlite:///{tmp_path}/gw.db", "migrate_on_start": migrate}}
        )
        store = make_store(loaded.config.store, "test")
        await store.start()

    for migrate in (True, False):
        with pytest.raises(schema.SchemaAhead, match="refusing to start"):
            asyncio.run(start(migrate))

    served = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.returncode == 1
    assert "cannot start:" in served.stderr and "newer than this gateway" in served.stderr


def test_teams_update_and_delete_and_keys_rotate(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = ("--config", str(config))
    assert run(capsys, "teams", "create", "Red", "--id", "red", *cfg)[0] == 0
    code, out, _ = run(capsys, "keys", "create", "--team", "red", "--name", "ci", *cfg)
    assert code == 0
    key_id = out.split()[2]

    code, out, _ = run(capsys, "teams", "update", "red", "--name", "Rouge", "--limits",
                       '{"rpm": 5}', *cfg)  # fmt: skip
    assert code == 0 and '{"rpm": 5}' in out
    assert "red\tRouge" in run(capsys, "teams", "list", *cfg)[1]
    code, _, err = run(capsys, "teams", "update", "red", "--limits", "{nope", *cfg)
    assert code == 2 and "error:" in err
    assert run(capsys, "teams", "update", "blue", "--name", "x", *cfg)[0] == 2

    code, out, _ = run(capsys, "keys", "rotate", key_id, "--overlap-s", "0", *cfg)
    assert code == 0
    new_id = out.split()[2]
    assert "secret (shown once, store it now): gw-" in out
    listed = run(capsys, "keys", "list", "--team", "red", *cfg)[1]
    states = {line.split("\t")[0]: line.split("\t")[3] for line in listed.splitlines()}
    assert states == {key_id: "expired", new_id: "active"}
    code, _, err = run(capsys, "keys", "rotate", key_id, *cfg)
    assert code == 2 and "expired" in err

    code, _, err = run(capsys, "teams", "delete", "red", *cfg)
    assert code == 2 and "1 usable keys" in err
    code, out, _ = run(capsys, "teams", "delete", "red", "--revoke-keys", *cfg)
    assert code == 0 and "1 keys revoked" in out
    assert "red" not in run(capsys, "teams", "list", *cfg)[1]
    listed = run(capsys, "keys", "list", "--team", "red", *cfg)[1]
    assert all(line.split("\t")[3] in ("revoked", "expired") for line in listed.splitlines())


async def request(
    gw: GatewayUnderTest, method: str, path: str, key: str, body: object = None
) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, gw.url + path, json=body, headers=headers) as response,
    ):
        return response.status, await response.json()


async def test_a_key_rotated_over_the_api_overlaps_then_expires(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(auth={"master_key": MASTER, "key_cache_s": 0})
    await request(gw, "POST", "/v1/gateway/teams", MASTER, {"id": "red", "name": "Red"})
    status, old = await request(
        gw, "POST", "/v1/gateway/keys", MASTER, {"team_id": "red", "models": ["demo"]}
    )
    assert status == 201
    status, new = await request(gw, "POST", f"/v1/gateway/keys/{old['id']}/rotate", MASTER)
    assert status == 201, new
    assert new["models"] == ["demo"] and new["team_id"] == "red" and new["id"] != old["id"]
    rotated_from = new["rotated_from"]
    assert isinstance(rotated_from, dict) and rotated_from["id"] == old["id"]
    assert isinstance(rotated_from["expires_at"], float)
    # The overlap (an hour by default): both keys work.
    for key in (old["key"], new["key"]):
        assert (await request(gw, "GET", "/v1/models", str(key)))[0] == 200
    # Rotated again with no overlap: the previous key stops at once, the newest works.
    status, newest = await request(
        gw, "POST", f"/v1/gateway/keys/{new['id']}/rotate", MASTER, {"overlap_s": 0}
    )
    assert status == 201
    status, body = await request(gw, "GET", "/v1/models", str(new["key"]))
    assert status == 401 and body["error"]["code"] == "api_key_expired"  # type: ignore[index]
    assert (await request(gw, "GET", "/v1/models", str(newest["key"])))[0] == 200
    status, body = await request(gw, "POST", f"/v1/gateway/keys/{new['id']}/rotate", MASTER, {})
    assert status == 409, body
    status, _ = await request(
        gw, "POST", f"/v1/gateway/keys/{newest['id']}/rotate", MASTER, {"overlap_s": -1}
    )
    assert status == 400


def test_spool_status_counts_what_waits(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "spool", "status", "--config", str(config))
    assert code == 0 and "0 spooled writes wait for the store" in out
    spool = Spool(tmp_path / "spool", "host:4000")
    spool.open()
    spool.append([Write("usage", {"id": f"u{i}"}) for i in range(5)])
    writes, pos = spool.read(2)
    assert len(writes) == 2
    spool.advance(pos)  # two replayed, three wait
    code, out, _ = run(capsys, "spool", "status", "--config", str(config))
    assert code == 0
    assert "3 writes" in out and "3 spooled writes wait for the store" in out
