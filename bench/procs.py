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
        return peak_rss_kib(self.pid)

    def descendants(self) -> list[int]:
        return descendants(self.pid)

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log_file.close()


def peak_rss_kib(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def cpu_s(pid: int) -> float | None:
    """CPU time of a process so far, every thread (ns resolution, from schedstat)."""
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that just ended
    return total / 1e9


def descendants(pid: int) -> list[int]:
    """Every process below pid (e.g. the workers of `gateway serve --workers N`), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The command name in parentheses may hold spaces: the ppid follows the last ")".
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        parents.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def set_affinity(pids: list[int], cores: set[int]) -> None:
    """Move processes, every thread of each, onto `cores`. sched_setaffinity on a pid changes
    only that one thread; the SQLite writer, the executor threads etc. keep their old mask."""
    for pid in pids:
        try:
            tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError):  # a thread that just ended
                os.sched_setaffinity(tid, cores)


def spawn(
    name: str,
    argv: list[str],
    core: int,
    log_path: Path,
    cwd: Path,
    env: dict[str, str] | None = None,
) -> Child:
    """Start argv under `taskset -c core`; taskset execs, so the pid is the program's own.
    The log is appended to, so several short-lived children can share one."""
    log_file = log_path.open("ab")
    started = time.perf_counter()
    proc = subprocess.Popen(
        ["taskset", "-c", str(core), *argv],
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
    )
    return Child(name, proc, log_path, log_file, started)


def http_get(port: int, path: str, timeout: float = 1.0) -> tuple[int, bytes] | None:
    """(status, body) of a GET on a new connection, or None if it could not be made."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    except OSError:
        return None
    finally:
        conn.close()


def http_get_status(port: int, path: str, timeout: float = 1.0) -> int | None:
    answer = http_get(port, path, timeout)
    return None if answer is None else answer[0]


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
