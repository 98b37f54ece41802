"""Delivery tracking: which written frames the client's side actually received.

Writing is not delivering: a client that stops reading leaves megabytes in the kernel's send
queue while `write()` keeps returning. "Delivered" (docs/recording.md, "Delivery levels") is
what the peer acknowledged: Linux's `tcp_info.tcpi_bytes_acked` has passed the frame's last
byte. The socket is duplicated when the response starts because asyncio closes its own socket
object as soon as the connection is lost; the duplicate still answers `TCP_INFO` with the final
count, even after a reset. Where TCP_INFO cannot be read (another OS, a Unix socket), the weaker
"sent" level is used: bytes handed to the kernel with nothing left in the process's buffer.

Offsets are in the payload writer's `output_size` coordinates (status line and headers
included), relative to the connection's byte count when this response began, so keep-alive
connections work.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import os
import socket
import struct
import sys
import termios
from array import array
from typing import Literal

from aiohttp import web

from gateway.stream.narrow import Items, widened

DeliveryLevel = Literal["acked", "sent"]

_TCP_INFO_LEN = 136
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close with a reset
_BYTES_ACKED = struct.Struct("=Q")  # tcpi_bytes_acked at offset 120
_BYTES_ACKED_OFFSET = 120


def tcp_bytes_acked(sock: socket.socket) -> int | None:
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return None
    if len(info) < _BYTES_ACKED_OFFSET + 8:
        return None
    return int(_BYTES_ACKED.unpack_from(info, _BYTES_ACKED_OFFSET)[0])


def _unacked_in_kernel(fd: int) -> int:
    buf = fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0")
    return int(struct.unpack("i", buf)[0])


class ConnectionSocket:
    """A duplicate of one connection's socket, made once and shared by the responses that
    connection carries (a dup and a close a response cost two syscalls and a socket object on
    every stream of a kept-alive connection). Closed once the connection is lost and no
    tracker still reads it: a tracker reads the final count after the loss."""

    __slots__ = ("_lost", "_users", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._users = 0
        self._lost = False

    def acquire(self) -> socket.socket:
        self._users += 1
        return self.sock

    def release(self) -> None:
        self._users -= 1
        if self._lost and self._users <= 0:
            self.sock.close()

    def connection_lost(self) -> None:
        """Called by the connection's protocol (gateway.downstream.slow_clients.SlowClientGuard)."""
        self._lost = True
        if self._users <= 0:
            self.sock.close()


def _duplicate(sock: socket.socket) -> socket.socket | None:
    try:
        # Family and type given: the socket object skips asking the kernel for them.
        return socket.socket(sock.family, socket.SOCK_STREAM, 0, os.dup(sock.fileno()))
    except OSError:
        return None


_STEP = 1024  # frames between two kept frame ends


class DeliveryTracker:
    """Maps the frames a response wrote to the bytes its peer acknowledged."""

    def __init__(self, request: web.BaseRequest) -> None:
        self._transport = request.transport
        self._sock: socket.socket | None = None  # a duplicate of the connection's socket
        self.level: DeliveryLevel = "sent"
        self._base = 0
        # Where each written frame ends, kept small (a long stream writes 100,000 of them):
        # the first one's end, then each frame's gap from the end before it, a byte each (a
        # frame and its chunk's framing are often shorter than 256 bytes), widened to 2 bytes
        # for all once one is not (a provider's frame is often 200-350 bytes), 4 past 64 KiB;
        # and the end of every _STEP-th frame, so that finding a frame by offset reads at most
        # _STEP gaps.
        self._first_end = 0
        self._end = 0  # the last frame's
        self._gaps: Items = bytearray()
        self._steps: array[int] = array("Q")
        self._next_step = _STEP
        # The last `frames_ending_by`: that many frames end by that offset.
        self._last = (0, 0)
        # A write under way: its frames' lengths, its bytes after the chunk size line, and the
        # output size before it.
        self._pending: tuple[list[int], int, int] | None = None
        self._handed = 0  # "sent" level: bytes known to be out of the process
        # Chunked transfer encoding puts a 2-byte CRLF after each written chunk.
        self.chunked = True
        self._shared: ConnectionSocket | None = None
        # The connection's protocol keeps one duplicate for all its responses, where it can
        # (`delivery_socket`, None until the first); else each response makes its own.
        protocol = request.protocol if self._transport is not None else None
        shared = getattr(protocol, "delivery_socket", False)
        if isinstance(shared, ConnectionSocket):
            self._shared = shared
            self._sock = shared.acquire()
            return
        sock = self._transport.get_extra_info("socket") if self._transport else None
        if sock is None or sys.platform != "linux":
            return
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        self._sock = _duplicate(sock)
        if shared is None and self._sock is not None:
            self._shared = protocol.delivery_socket = ConnectionSocket(self._sock)  # type: ignore[union-attr]
            self._shared.acquire()

    def begin(self) -> None:
        """Call right before the response's first byte: decides the level (TCP_INFO readable or
        not) and fixes the connection's base offset."""
        if self._sock is None:
            return
        acked = tcp_bytes_acked(self._sock)
        if acked is None:
            return
        self.level = "acked"
        try:
            queued = _unacked_in_kernel(self._sock.fileno())
        except OSError:
            queued = 0
        buffered = self._transport.get_write_buffer_size() if self._transport else 0
        self._base = acked + queued + buffered

    def before_write(self, frame_lengths: list[int], output_size: int, last: bool = False) -> None:
        """Frames about to be written in one `write()` (`last`: in `write_eof()`, which ends a
        chunked body with its zero-length chunk in the same send); settled by `after_write`."""
        # What follows the frames' bytes: a chunk's CRLF, and the last chunk's "0" CRLF CRLF.
        trailer = (7 if last else 2) if self.chunked else 0
        self._pending = (frame_lengths, sum(frame_lengths) + trailer, output_size)

    def after_write(self, output_size: int) -> None:
        pending = self._pending
        if pending is None:
            return
        lengths, total, before = pending
        self._pending = None
        if output_size == before:
            return  # nothing reached the transport
        gaps = self._gaps
        if len(lengths) == 1 and gaps:  # a frame a write, what providers' streams make
            end = output_size - total + lengths[0]
            try:
                gaps.append(end - self._end)
            except (ValueError, OverflowError):  # a gap past what an item holds: wider ones
                gaps = self._gaps = widened(gaps, [end - self._end])
            self._end = end
            if len(gaps) >= self._next_step:
                self._keep_steps()
        elif lengths:
            self._add(output_size - total, lengths)
        transport = self._transport
        buffered = (
            transport.get_write_buffer_size() if transport and not transport.is_closing() else 0
        )
        self._handed = output_size - buffered

    def _add(self, start: int, lengths: list[int]) -> None:
        """Frames of `lengths` written one after the other from offset `start`."""
        gaps = self._gaps
        if not gaps:
            self._first_end = self._end = start + lengths[0]  # its gap: 0
        first = start + lengths[0] - self._end
        self._end = start + sum(lengths)
        more = lengths[1:]
        had = len(gaps)
        try:
            gaps.append(first)
            if more:
                gaps.extend(more)
        except (ValueError, OverflowError):  # a gap past what an item holds: wider ones
            del gaps[had:]
            self._gaps = widened(gaps, [first, *more])
        self._keep_steps()

    def _keep_steps(self) -> None:
        """The end of each _STEP-th frame the last write passed: counted back from its last."""
        gaps = self._gaps
        while len(gaps) >= self._next_step:
            self._steps.append(self._end - sum(gaps[self._next_step :]))
            self._next_step += _STEP

    @property
    def frames_written(self) -> int:
        return len(self._gaps)

    def frames_ending_by(self, offset: int) -> int:
        """How many written frames end at or before `offset`. Walked from the nearest kept
        step end, or from the last answer when that is nearer: what a stream is asked (each
        checkpoint, each write's delivery) only grows, and frames are only ever added."""
        gaps = self._gaps
        if not gaps or offset < self._first_end:
            return 0
        steps = self._steps
        passed = bisect.bisect_right(steps, offset)
        frame, end = (passed * _STEP, steps[passed - 1]) if passed else (1, self._first_end)
        last_frame, last_end = self._last
        if frame < last_frame and last_end <= offset:
            frame, end = last_frame, last_end
        count = len(gaps)
        while frame < count and end + gaps[frame] <= offset:
            end += gaps[frame]
            frame += 1
        self._last = (frame, end)
        return frame

    def delivered_frames(self, output_size: int) -> int:
        """How many written frames the client's side has, counted from the first."""
        self.after_write(output_size)  # a write interrupted in drain still reached the kernel
        if self.level == "acked" and self._sock is not None:
            acked = tcp_bytes_acked(self._sock)
            if acked is not None:
                return self.frames_ending_by(acked - self._base)
        return self.frames_ending_by(self._handed)

    def progress(self, output_size: int) -> tuple[int, bool]:
        """How far the client's side has got (bytes acknowledged; at the "sent" level, handed
        to the kernel), and whether the response has written more than that."""
        if self.level == "acked" and self._sock is not None:
            acked = tcp_bytes_acked(self._sock)
            if acked is not None:
                return acked, acked - self._base < output_size
        transport = self._transport
        buffered = transport.get_write_buffer_size() if transport is not None else 0
        return output_size - buffered, buffered > 0

    def reset(self) -> None:
        """Close the connection with a reset, so that what the kernel still queues for the
        client never reaches it: the client keeps what it acknowledged, which is what
        `delivered_frames` counts (the duplicate socket answers it until `close`, and its
        closing sends the reset)."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        if self._shared is not None:
            self._shared.release()
            self._shared = None
        elif self._sock is not None:
            self._sock.close()
        self._sock = None
