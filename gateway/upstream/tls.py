"""Which certificates an upstream's TLS connection trusts.

- By default: `SSL_CERT_FILE` (a PEM bundle) and/or `SSL_CERT_DIR` (a hashed directory) when
  the environment sets them, instead of the system's CAs; else the system's. OpenSSL reads those
  variables itself only in some builds (not on Windows, not with every Python distribution), so
  the gateway reads them explicitly: the same on every platform, and a path that does not exist
  fails at start rather than as a failed handshake on the first request.
- A deployment's `tls.ca_bundle`: that PEM file instead.
- A deployment's `tls.verify: false`: nothing checked (a warning at start names the deployment).

Contexts are made once per setting and shared: loading a bundle takes milliseconds, and the
default one is made at the first https connection, not at start.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_contexts: dict[tuple[str | None, str | None, bool], ssl.SSLContext] = {}


class TrustError(ValueError):
    """`SSL_CERT_FILE` or `SSL_CERT_DIR` names nothing usable (the message says which)."""


def environment_trust(environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """`SSL_CERT_FILE` and `SSL_CERT_DIR` (None where unset); `TrustError` naming the variable
    and its path when it names nothing usable (gateway.config checks it when it loads)."""
    env = os.environ if environ is None else environ
    cafile = env.get("SSL_CERT_FILE") or None
    capath = env.get("SSL_CERT_DIR") or None
    if cafile is not None and not Path(cafile).is_file():
        raise TrustError(f"SSL_CERT_FILE={cafile}: no such file (a PEM bundle of CAs)")
    if capath is not None:
        # A list of directories, as OpenSSL reads it; each must exist.
        for part in capath.split(os.pathsep):
            if part and not Path(part).is_dir():
                raise TrustError(f"SSL_CERT_DIR={capath}: no such directory {part}")
    return cafile, capath


def context(
    cafile: str | None = None, capath: str | None = None, *, verify: bool = True
) -> ssl.SSLContext:
    """A client context trusting `cafile`/`capath` (both None: the system's CAs), or checking
    nothing (`verify=False`); one per setting."""
    key = (None, None, False) if not verify else (cafile, capath, True)
    made = _contexts.get(key)
    if made is None:
        if not verify:
            made = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            made.check_hostname = False
            made.verify_mode = ssl.CERT_NONE
        else:
            # With a cafile or capath, only those (the system's CAs are not loaded too).
            made = ssl.create_default_context(cafile=cafile, capath=capath)
        _contexts[key] = made
    return made


def deployment_context(ca_bundle: str | None, verify: bool) -> ssl.SSLContext | None:
    """A deployment's own context (its `tls` settings), or None for the default one."""
    if not verify:
        return context(verify=False)
    if ca_bundle is not None:
        return context(ca_bundle)
    return None


def check_bundle(path: str) -> None:
    """ValueError unless `path` is a readable PEM file holding at least one certificate."""
    if not Path(path).is_file():
        raise ValueError(f"{path}: no such file (a PEM bundle of CAs)")
    try:
        probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        probe.load_verify_locations(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"{path}: not a PEM bundle of CA certificates ({exc})") from None
    if not probe.cert_store_stats()["x509"]:
        raise ValueError(f"{path}: holds no certificate")


def warn_unverified(deployments: Iterable[Any]) -> None:
    """One warning per deployment whose upstream's certificate is not checked (`tls.verify:
    false`); each has `.name` and `.config` (gateway.routing.router.Deployment)."""
    for deployment in deployments:
        tls = getattr(deployment.config, "tls", None)
        if tls is not None and not tls.verify:
            log.warning(
                "deployment %s: tls.verify is false: its upstream's certificate is not checked,"
                " so anyone between the gateway and %s can read and change its traffic",
                deployment.name,
                deployment.config.api_base or "its upstream",
            )
