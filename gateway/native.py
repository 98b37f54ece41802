"""The recording path (and the upstream's bytes) compiled with mypyc: how it is built, and
found at import.

Recording a turn (its events, blocks, compact stream, usage row and store writes) is half of
what a non-streaming request costs the gateway's one core (docs/performance.md). Compiled to C
by mypyc (shipped with mypy), the modules in `COMPILED` run the same code with about an eighth
fewer instructions per request; nothing else changes, and the plain Python stays the source of
truth and the fallback.

`native.build()` (run by `make`) compiles them into `.native/` beside the package,
with a manifest of each source's SHA-256. At import (`gateway/__init__.py` calls `install()`)
the compiled modules are used only if every one of those sources is unchanged: mypyc compiles
the modules together and each calls the others' compiled code directly, so one stale module
makes the whole build stale. Then, or with no build (a wheel install, a fresh checkout before
`make`), or with `GATEWAY_NATIVE=0`, every module runs as plain Python, and a stale build says
so once on stderr.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# Pure computation on the loop's thread once per turn or per frame, the upstream's bytes up
# to the frames (its connection, the SSE decoder) and the request's small helpers. Not here:
# modules whose classes tests patch or that aiohttp decorates (mypyc's functions take no
# attributes), pydantic models (mypyc does not compile them), the module of the chat chunk's
# msgspec Structs (compiled, a stream took 60% more instructions), and the relay, the store
# and the upstream request's side: compiled as well, a request took 7% fewer instructions but
# 10-37% more CPU time (docs/performance-history.md, session 15).
COMPILED = (
    "gateway/conversations/events.py",
    "gateway/conversations/recorder.py",
    "gateway/ids.py",
    "gateway/metering/usage.py",
    "gateway/metering/auth.py",
    "gateway/metrics.py",
    "gateway/pipeline/deadline.py",
    "gateway/routing/retry.py",
    "gateway/routing/router.py",
    "gateway/storage/writes.py",
    "gateway/stream/assembler.py",
    "gateway/stream/attempt_log.py",
    "gateway/stream/compact.py",
    "gateway/stream/events.py",
    "gateway/upstream/connection.py",
    "gateway/storage/journal.py",
    "gateway/providers/wire.py",
    "gateway/dialects/requests.py",
    "gateway/metering/keys.py",
    "gateway/stream/sse.py",
)
GROUP = "gateway_native"  # the shared library every compiled module loads: f"{GROUP}__mypyc"
ROOT = Path(__file__).resolve().parent.parent  # the directory holding gateway/
DIRECTORY = ROOT / ".native"
MANIFEST = "manifest.json"
_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def digests(root: Path = ROOT) -> dict[str, str]:
    return {p: hashlib.sha256((root / p).read_bytes()).hexdigest() for p in COMPILED}


class _Finder(importlib.abc.MetaPathFinder):
    """Serves the compiled modules (and their shared library) from the build directory."""

    def __init__(self, modules: dict[str, Path]) -> None:
        self.modules = modules

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        found = self.modules.get(fullname)
        if found is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(found))
        return importlib.util.spec_from_file_location(fullname, found, loader=loader)


def built(directory: Path = DIRECTORY, root: Path = ROOT) -> dict[str, Path] | str:
    """The compiled modules by name, or why there are none to use."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        return "not built"
    except (OSError, ValueError) as exc:
        return f"unreadable manifest ({exc})"
    try:
        current = digests(root)
    except OSError as exc:
        return f"sources unreadable ({exc})"
    if manifest.get("python") != sys.implementation.cache_tag or manifest.get("suffix") != _SUFFIX:
        return f"built for {manifest.get('python')}, running {sys.implementation.cache_tag}"
    kept = manifest.get("sources", {})
    changed = sorted(p for p, digest in current.items() if kept.get(p) != digest)
    if changed:
        return "stale: changed since the build: " + ", ".join(changed)
    modules = {module_name(p): directory / (p.removesuffix(".py") + _SUFFIX) for p in COMPILED}
    modules[f"{GROUP}__mypyc"] = directory / f"{GROUP}__mypyc{_SUFFIX}"
    missing = [str(p) for p in modules.values() if not p.is_file()]
    if missing:
        return "incomplete: missing " + ", ".join(missing)
    return modules


def install() -> str | None:
    """Use the compiled modules if they match the sources; returns why not, if not."""
    if os.environ.get("GATEWAY_NATIVE", "1") == "0":
        return "disabled (GATEWAY_NATIVE=0)"
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return None
    found = built()
    if isinstance(found, str):
        if found != "not built":
            # Before logging is set up (this runs at import): straight to stderr, once.
            print(f"gateway: compiled modules not used, {found}: run `make`", file=sys.stderr)
        return found
    sys.meta_path.insert(0, _Finder(found))
    return None


def active() -> bool:
    """Whether this process runs the compiled modules."""
    return any(isinstance(f, _Finder) for f in sys.meta_path)


def build(directory: Path = DIRECTORY, temp: Path | None = None) -> None:
    """Compile `COMPILED` (the sources beside this module) into `directory` and write its
    manifest (last: a build that fails halfway leaves no manifest, so nothing of it is used).

    `directory` may be another package's `.native`: the container image compiles its source
    tree and puts the build beside the installed package (whose sources are the same), as mypy
    cannot compile from site-packages itself. `temp` holds the C sources and objects (default:
    `directory/build`)."""
    import shutil

    from mypyc.build import mypycify
    from setuptools import setup  # type: ignore[import-untyped]

    if shutil.which(os.environ.get("CC", "cc")) is None:
        raise SystemExit("gateway.native: no C compiler (cc, or $CC) to build with")
    os.chdir(ROOT)  # mypyc names modules by their paths from here
    (directory / MANIFEST).unlink(missing_ok=True)
    sources = digests()
    temp = temp or directory / "build"
    extensions = mypycify(list(COMPILED), group_name=GROUP, target_dir=str(temp), multi_file=True)
    args = ["build_ext", "--build-lib", str(directory), "--build-temp", str(temp)]
    args += ["-j", str(os.cpu_count() or 1)]
    setup(name=GROUP, ext_modules=extensions, script_args=["-q", *args])
    manifest = {"python": sys.implementation.cache_tag, "suffix": _SUFFIX, "sources": sources}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
