"""Run wrk with bench/post.lua and parse the one JSON line its done() prints."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

import orjson

LUA_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "post.lua")
RESULT_PREFIX = "BENCH_RESULT "


@dataclass(frozen=True)
class WrkResult:
    requests: int
    duration_s: float
    errors: dict[str, int]  # connect, read, write, status (non-2xx), timeout
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0

    @property
    def error_total(self) -> int:
        return sum(self.errors.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "duration_s": round(self.duration_s, 3),
            "rps": round(self.rps, 1),
            "p50_ms": self.p50_ms,
            "p90_ms": self.p90_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
            "errors": self.errors,
        }


def ensure_wrk() -> str:
    """Path to wrk, installing the Debian package if needed (the bench runs as root)."""
    found = shutil.which("wrk")
    if found:
        return found
    print("wrk not found; installing it with apt-get", flush=True)
    install = ["apt-get", "install", "-y", "-q", "wrk"]
    if subprocess.run(install, check=False).returncode != 0:
        # A fresh container often has no package lists yet.
        subprocess.run(["apt-get", "update", "-q"], check=True)
        subprocess.run(install, check=True)
    found = shutil.which("wrk")
    if not found:
        raise RuntimeError("apt-get install wrk succeeded but wrk is not on PATH")
    return found


def wrk_version(wrk: str) -> str:
    # `wrk -v` prints its banner and exits non-zero; the first line is enough.
    out = subprocess.run([wrk, "-v"], capture_output=True, text=True, check=False)
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "?"


def run_wrk(
    wrk: str,
    url: str,
    body: bytes,
    connections: int,
    duration_s: int,
    core: int,
    api_key: str = "sk-bench",
) -> WrkResult:
    argv = [
        "taskset", "-c", str(core),
        wrk, "-t1", f"-c{connections}", f"-d{duration_s}s", "--timeout", "10s",
        "-s", LUA_SCRIPT, url,
    ]  # fmt: skip
    env = {**os.environ, "BENCH_BODY": body.decode(), "BENCH_KEY": api_key}
    # wrk stops by itself after duration_s; the timeout only guards against a hung wrk.
    out = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=duration_s + 30, check=False
    )
    for line in out.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            raw = orjson.loads(line[len(RESULT_PREFIX) :])
            lat = raw["latency_us"]
            return WrkResult(
                requests=raw["requests"],
                duration_s=raw["duration_us"] / 1e6,
                errors=raw["errors"],
                p50_ms=lat["p50"] / 1000,
                p90_ms=lat["p90"] / 1000,
                p99_ms=lat["p99"] / 1000,
                max_ms=lat["max"] / 1000,
            )
    raise RuntimeError(
        f"wrk printed no result (exit {out.returncode}):\n{out.stdout}\n{out.stderr}"
    )
