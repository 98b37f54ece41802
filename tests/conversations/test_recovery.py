"""When a replica may take a silent peer for dead: only after two beats of its own that reached
the store, so that an outage of the store, which silences every replica, kills none of them."""

from __future__ import annotations

from gateway.conversations.recovery import PeerWatch


def test_a_peer_is_judged_only_after_two_beats_of_watching() -> None:
    watch = PeerWatch(beat_s=1.0)
    assert watch.stale_s == 2.0
    assert [watch.beat(t) for t in (10.0, 11.0, 12.0, 13.0)] == [False, False, True, True]


def test_after_an_outage_of_the_store_peers_get_two_beats_again() -> None:
    watch = PeerWatch(beat_s=1.0)
    assert [watch.beat(t) for t in (0.0, 1.0, 2.0)] == [False, False, True]
    watch.missed()  # the store did not answer: every peer's beats may have failed too
    watch.missed()
    assert [watch.beat(t) for t in (5.0, 6.0, 7.0)] == [False, False, True]


def test_a_late_beat_is_a_gap_in_the_watch() -> None:
    """A heartbeat that took long (a store stalling rather than failing) counts as a gap."""
    watch = PeerWatch(beat_s=1.0)
    assert [watch.beat(t) for t in (0.0, 1.0, 2.0)] == [False, False, True]
    assert watch.beat(9.0) is False
    assert [watch.beat(t) for t in (10.0, 11.0)] == [False, True]


def test_a_long_sweep_is_no_gap() -> None:
    """The store answered the sweep's claims: the next beat follows from its end."""
    watch = PeerWatch(beat_s=1.0)
    assert [watch.beat(t) for t in (0.0, 1.0, 2.0)] == [False, False, True]
    watch.reached(6.0)  # the sweep closed many turns
    assert watch.beat(7.0) is True
