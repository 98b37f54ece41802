"""What a raw-socket test client holds: unread bytes in its kernel, and a chunked body."""

from __future__ import annotations

import fcntl
import socket
import struct
import termios


def unread(sock: socket.socket) -> int:
    """Bytes waiting in the socket's receive queue (received by the kernel, not yet read)."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0])


def dechunk(body: bytes) -> bytes:
    """HTTP/1.1 chunked body -> payload; a torn last chunk gives what arrived of it."""
    out = bytearray()
    while body:
        line, sep, rest = body.partition(b"\r\n")
        if not sep:
            break
        size = int(line, 16)
        out += rest[:size]
        body = rest[size + 2 :]
        if size == 0:
            break
    return bytes(out)
