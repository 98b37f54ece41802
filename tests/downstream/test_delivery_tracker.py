"""DeliveryTracker's bookkeeping of frame end offsets, at the "sent" level (no socket): which
frames are out of the process, however writes group them, past 4 GiB too."""

from __future__ import annotations

import bisect
import os
from typing import Any

from gateway.downstream.delivery import DeliveryTracker


class Transport:
    def __init__(self) -> None:
        self.buffered = 0

    def get_extra_info(self, name: str) -> Any:
        return None

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return False


class Request:
    def __init__(self) -> None:
        self.transport = Transport()
        self.protocol = None


def tracker() -> tuple[DeliveryTracker, Transport]:
    request = Request()
    tracked = DeliveryTracker(request)  # type: ignore[arg-type]
    tracked.begin()
    assert tracked.level == "sent"
    return tracked, request.transport


def test_frames_count_as_sent_once_their_last_byte_left_the_process() -> None:
    tracked, transport = tracker()
    size = 100  # the status line and headers
    writes = [[10], [20, 30, 40], [5]]
    for lengths in writes:
        tracked.before_write(lengths, size)
        size += sum(lengths) + 2  # chunked: a CRLF after each chunk
        tracked.after_write(size)
    assert tracked.frames_written == 5
    assert tracked.delivered_frames(size) == 5
    # Ends so far: 110, 132, 162, 202, 209. With 48 bytes still in the transport's buffer
    # after the next write (ending at 214), bytes up to 166 are out: three frames.
    transport.buffered = 48
    tracked.before_write([1], size)
    size += 3
    tracked.after_write(size)
    assert tracked.frames_written == 6
    assert tracked.delivered_frames(size) == 3


def test_a_write_that_reached_nothing_records_no_frames() -> None:
    tracked, _ = tracker()
    tracked.before_write([10, 10], 50)
    tracked.after_write(50)
    assert tracked.frames_written == 0
    assert tracked.delivered_frames(50) == 0


def test_offsets_past_4_gib() -> None:
    tracked, _ = tracker()
    size = 2**32 - 30
    for lengths in ([10], [10, 10], [10]):  # the second write crosses 4 GiB
        tracked.before_write(lengths, size, last=False)
        size += sum(lengths) + 2
        tracked.after_write(size)
    assert tracked.frames_written == 4
    assert tracked.delivered_frames(size) == 4
    assert tracked.delivered_frames(size) == 4  # and again, with nothing new


def test_a_connection_socket_closes_once_the_connection_is_lost_and_no_tracker_reads_it() -> None:
    import socket

    from gateway.downstream.delivery import ConnectionSocket, tcp_bytes_acked

    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        shared = ConnectionSocket(socket.socket(fileno=os.dup(accepted.fileno())))
        first, second = shared.acquire(), shared.acquire()
        assert first is second
        shared.release()
        shared.connection_lost()
        accepted.close()  # the connection's own socket is gone; a tracker still reads the dup
        assert tcp_bytes_acked(second) is not None
        assert second.fileno() >= 0
        shared.release()
        assert second.fileno() == -1  # closed with its last reader
        lone = ConnectionSocket(socket.socket(fileno=os.dup(client.fileno())))
        lone.connection_lost()  # lost with no reader: closed at once
        assert lone.sock.fileno() == -1
    finally:
        for sock in (server, client, accepted):
            sock.close()


def test_frames_are_found_by_offset_however_writes_and_frame_sizes_come() -> None:
    """Against the plain list of every frame's end: byte-sized gaps, widened ones (a frame of
    300 bytes, then one of 70,000, or one past 4 GiB), writes of one frame and of thousands
    (past the kept step ends), and writes that reached nothing."""
    import random

    from gateway.downstream import delivery

    rng = random.Random(7)
    for case in range(6):
        tracked, _ = tracker()
        size, ends = 100, []
        for _ in range(400):
            n = rng.choice((1, 1, 2, 50, 3000))
            lengths = [rng.randint(1, 200) for _ in range(n)]
            if case >= 2 and rng.random() < 0.05:
                lengths[rng.randrange(n)] = 300
            if case == 4 and rng.random() < 0.01:
                lengths[-1] = 70_000  # past 2-byte gaps
            if case == 5 and rng.random() < 0.01:
                lengths[0] = 2**32 + 5
            tracked.before_write(lengths, size)
            if rng.random() < 0.1:
                tracked.after_write(size)  # nothing reached the transport
                continue
            at = size + 6  # the chunk's size line
            for length in lengths:
                at += length
                ends.append(at)
            size = at + 2
            tracked.after_write(size)
            # Asked as a stream is between its writes: mostly near its end, so the offset
            # grows from one ask to the next, now and then anywhere before it.
            near = ends[-1] - rng.randrange(min(ends[-1], 400))
            asked = near if rng.random() < 0.8 else rng.randrange(ends[-1] + 2)
            assert tracked.frames_ending_by(asked) == bisect.bisect_right(ends, asked)
        assert tracked.frames_written == len(ends)
        widths = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 8}  # a byte a gap, then 2, 4, 8 as needed
        assert getattr(tracked._gaps, "itemsize", 1) == widths[case]
        assert len(tracked._steps) == len(ends) // delivery._STEP
        probes = [0, 99, ends[0] - 1, ends[0], ends[-1], ends[-1] + 1, size + 10]
        probes += [rng.randrange(ends[-1] + 2) for _ in range(300)]
        probes += [e + d for e in rng.sample(ends, 300) for d in (-1, 0, 1)]
        for offset in probes:
            assert tracked.frames_ending_by(offset) == bisect.bisect_right(ends, offset)
