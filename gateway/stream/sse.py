"""An incremental Server-Sent Events decoder that keeps every frame's exact bytes.

`feed(bytes)` returns the frames completed by those bytes, `flush()` the unterminated rest at
end of stream. Parsing follows the WHATWG rules (comments, `field: value` with one optional
space stripped, `\\r\\n`, `\\n` or `\\r` line ends, dispatch on a blank line), but each frame also
carries `raw`, the bytes exactly as received from its first line through the blank line that
ended it, so the relay can forward upstream bytes unchanged and count them for delivery.
It never touches a socket.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


class SSEFrameTooLarge(ValueError):
    pass


@dataclass(slots=True)
class SSEFrame:
    raw: bytes
    # The `event:` field; None when absent (the spec's default type "message").
    event: str | None = None
    # Data lines joined by "\n"; None when the frame had no data field (comments only).
    data: str | None = None
    id: str | None = None
    # False only for bytes flushed at end of stream without their blank line.
    complete: bool = True


class SSEDecoder:
    """Two modes: a fast one for `\n`-only streams (what every major provider sends), which
    finds frame ends with `bytes.find`, and a line-by-line one that takes over for good once a
    `\r` shows up."""

    def __init__(self, max_frame_bytes: int = 16 * 1024 * 1024) -> None:
        self._max = max_frame_bytes
        self._first = True
        self._reset_fields()
        # fast mode
        self._pending = b""  # bytes of the unfinished frame
        self._searched = 0  # _pending holds no frame end before this offset
        # line mode
        self._lines_mode = False
        self._buf = bytearray()
        self._scan = 0  # bytes of _buf already split into lines for the current frame

    def _reset_fields(self) -> None:
        self._event: str | None = None
        self._data: list[str] | None = None
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEFrame]:
        if not chunk:
            return []
        if not self._lines_mode and b"\r" in chunk:
            self._lines_mode = True
            self._buf = bytearray(self._pending)
            self._pending = b""
        if self._lines_mode:
            frames = self._feed_lines(chunk)
            size = len(self._buf)
        else:
            frames = self._feed_fast(chunk)
            size = len(self._pending)
        if size > self._max:
            raise SSEFrameTooLarge(f"an SSE frame exceeded {self._max} bytes")
        return frames

    def split(self, chunk: bytes) -> tuple[bytes, list[bytes]] | None:
        """What `feed(chunk)` would dispatch, undecoded: the bytes its complete frames span,
        and each frame's bytes without its blank line (so a frame is `piece + b"\n\n"` and they
        follow each other in the span). The caller reads what it can from a piece and gives
        the rest to `frame()`. None (nothing consumed): this read needs `feed`, as a stream
        using `\r`, one that starts with a byte order mark or has empty frames does."""
        if self._lines_mode or b"\r" in chunk:
            return None
        data = self._pending + chunk if self._pending else chunk
        if self._pending and data.find(b"\n\n", self._searched) < 0:
            if len(data) > self._max:
                raise SSEFrameTooLarge(f"an SSE frame exceeded {self._max} bytes")
            self._pending = data  # still inside one frame: nothing to split yet
            self._searched = max(0, len(data) - 1)
            return b"", []
        if self._first and not _BOM.startswith(data[:3]):
            self._first = False
        if self._first:
            return None
        # Frames of one line each (what chat streams send): split at every newline, one C call
        # that is twice as fast as splitting at blank lines, and the lines alternate with the
        # empty ones between frames.
        lines = data.split(b"\n")
        pieces = lines[0:-1:2]
        if len(lines) % 2 == 0 or any(lines[1::2]) or b"" in pieces:
            # Frames of several lines, or empty ones: find the blank lines themselves.
            if data[:1] == b"\n" or b"\n\n\n" in data:
                return None
            pieces = data.split(b"\n\n")
            tail = pieces.pop()
        else:
            tail = lines[-1]
        if len(tail) > self._max:
            raise SSEFrameTooLarge(f"an SSE frame exceeded {self._max} bytes")
        self._pending = tail
        self._searched = max(0, len(tail) - 1)
        return (data[: len(data) - len(tail)] if tail else data), pieces

    def frame(self, raw: bytes) -> SSEFrame:
        """One complete frame of a `split()` (its bytes with the blank line), as `feed` gives it."""
        if raw.startswith(b"data: ") and raw.find(b"\n", 0, len(raw) - 2) < 0:
            return SSEFrame(raw, None, raw[6:-2].decode("utf-8", "replace"), None)
        for line in raw[:-2].split(b"\n"):
            self._field(line)
        return self._dispatch(raw)

    def _feed_fast(self, chunk: bytes) -> list[SSEFrame]:
        split = self.split(chunk)
        if split is None:  # a byte order mark may lead, or frames may be empty
            return self._feed_scan(self._pending + chunk if self._pending else chunk)
        return [self.frame(piece + b"\n\n") for piece in split[1]]

    def _feed_scan(self, data: bytes) -> list[SSEFrame]:
        """Frame by frame, for streams whose frames may be empty lines or start with one."""
        frames: list[SSEFrame] = []
        start = 0
        search = self._searched
        while True:
            if data[start : start + 1] == b"\n":  # an empty line right at a frame start
                frames.append(self._dispatch(data[start : start + 1]))
                start += 1
                search = start
                continue
            end = data.find(b"\n\n", search)
            if end < 0:
                break
            if (
                not self._first
                and data.startswith(b"data: ", start)
                and data.find(b"\n", start, end) < 0
            ):
                # The common frame, one `data:` line: no line splitting, no field parsing.
                text = data[start + 6 : end].decode("utf-8", "replace")
                frames.append(SSEFrame(data[start : end + 2], None, text, None))
            else:
                for line in data[start:end].split(b"\n"):
                    self._field(line)
                frames.append(self._dispatch(data[start : end + 2]))
            start = search = end + 2
        self._pending = data[start:]
        # Resume the search one byte early: a "\n" at the end may be half of "\n\n".
        self._searched = max(0, len(data) - start - 1)
        return frames

    def _feed_lines(self, chunk: bytes) -> list[SSEFrame]:
        buf = self._buf
        buf += chunk
        frames: list[SSEFrame] = []
        frame_start = 0
        pos = self._scan
        while True:
            match = _EOL.search(buf, pos)
            if match is None:
                break
            end = match.end()
            if match.group() == b"\r" and end == len(buf):
                break  # a "\r" at the very end may be the first half of "\r\n"
            line = bytes(buf[pos : match.start()])
            pos = end
            if line:
                self._field(line)
            else:
                frames.append(self._dispatch(bytes(buf[frame_start:end])))
                frame_start = end
        if frame_start:
            del buf[:frame_start]
            pos -= frame_start
        self._scan = pos
        return frames

    def flush(self) -> list[SSEFrame]:
        """The unterminated tail at end of stream, if any (its fields parsed, `complete=False`)."""
        if self._lines_mode:
            raw, unparsed = bytes(self._buf), bytes(self._buf[self._scan :])
            self._buf, self._scan = bytearray(), 0
        else:
            raw = unparsed = self._pending
            self._pending, self._searched = b"", 0
            self._reset_fields()
        if not raw:
            return []
        for line in _EOL.split(unparsed):
            if line:
                self._field(line)
        frame = self._dispatch(raw)
        frame.complete = False
        return [frame]

    def _field(self, line: bytes) -> None:
        if self._first:
            self._first = False
            if line.startswith(_BOM):
                line = line[3:]
        if line[:1] == b":":
            return  # a comment
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            text = value.decode("utf-8", "replace")
            if self._data is None:
                self._data = [text]
            else:
                self._data.append(text)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            self._id = value.decode("utf-8", "replace")
        # `retry` and unknown fields are ignored, as the spec says.

    def _dispatch(self, raw: bytes) -> SSEFrame:
        data = None if self._data is None else "\n".join(self._data)
        frame = SSEFrame(raw=raw, event=self._event, data=data, id=self._id)
        self._reset_fields()
        return frame
