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
    def __init__(self, max_frame_bytes: int = 16 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._scan = 0  # bytes of _buf already split into lines for the current frame
        self._max = max_frame_bytes
        self._first = True
        self._reset_fields()

    def _reset_fields(self) -> None:
        self._event: str | None = None
        self._data: list[str] | None = None
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEFrame]:
        if not chunk:
            return []
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
        if len(buf) > self._max:
            raise SSEFrameTooLarge(f"an SSE frame exceeded {self._max} bytes")
        return frames

    def flush(self) -> list[SSEFrame]:
        """The unterminated tail at end of stream, if any (its fields parsed, `complete=False`)."""
        if not self._buf:
            return []
        tail = bytes(self._buf[self._scan :])
        if tail:
            for line in _EOL.split(tail):
                if line:
                    self._field(line)
        frame = self._dispatch(bytes(self._buf))
        frame.complete = False
        self._buf = bytearray()
        self._scan = 0
        return [frame]

    def _field(self, line: bytes) -> None:
        if self._first:
            self._first = False
            if line.startswith(b"\xef\xbb\xbf"):
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
