"""Child processes for the bench: spawn pinned to a core, wait until ready, read peak RSS, stop."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

HOST = "127.0.0.1"


def free_port() -> int:
    """A port the kernel just handed out on loopback (tiny race, fine for a bench)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    started_at: float  # time.perf_counter() just before spawn

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def peak_rss_kib(self) -> int | None:
        """VmHWM: the high-water mark of resident memory over the process's life."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        return None

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log_file.close()


def spawn(name: str, argv: list[str], core: int, log_path: Path, cwd: Path) -> Child:
    """Start argv under `taskset -c core`; taskset execs, so the pid is the program's own."""
    log_file = log_path.open("wb")
    started = time.perf_counter()
    proc = subprocess.Popen(
        ["taskset", "-c", str(core), *argv],
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return Child(name, proc, log_path, log_file, started)


def http_get_status(port: int, path: str, timeout: float = 1.0) -> int | None:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def port_open(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def wait_until(child: Child, ready: Callable[[], bool], timeout: float = 30.0) -> float:
    """Poll `ready` every 5 ms; return seconds from spawn to the first success."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if not child.alive():
            raise RuntimeError(
                f"{child.name} exited with code {child.proc.returncode} while starting; "
                f"see {child.log_path}"
            )
        if ready():
            return time.perf_counter() - child.started_at
        time.sleep(0.005)
    raise RuntimeError(f"{child.name} not ready after {timeout:.0f} s; see {child.log_path}")
