"""The store's heartbeat: this replica's liveness, and the sweep that closes the open turns of
replicas that died and did not come back."""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.context import Gateway
from gateway.conversations.recovery import PeerWatch, recover_open_turns
from gateway.storage.db import StoreUnavailable

log = logging.getLogger(__name__)


async def keep_alive(gateway: Gateway, started: float) -> None:
    """Heartbeat, and close the open turns of replicas that died and did not come back.

    A replica is taken for dead two heartbeats after its last, and the sweep runs at every
    beat: its turns are closed within `store.recovery_s` of its death. Two beats this replica
    made: after an outage of the store, the others get that long to beat again (PeerWatch)."""
    beat_s = gateway.config.store.recovery_s / 3
    watch = PeerWatch(beat_s)
    failing = False  # said once when the beats start failing, once when they come back
    while True:
        await asyncio.sleep(beat_s)
        try:
            await gateway.store.heartbeat(started)
            if failing:
                failing = False
                log.info("store heartbeat succeeds again")
            if not watch.beat(time.time()):
                continue
            recovered = await recover_open_turns(
                gateway.store, gateway.meter, at_start=False, stale_s=watch.stale_s
            )
            watch.reached(time.time())
            if recovered:
                log.warning("closed %d turns of a stopped replica (crash_recovered)", recovered)
        except Exception as exc:
            # A store outage, not a bug: the writes go to the spool, which says so itself.
            watch.missed()
            reason = str(exc) if isinstance(exc, StoreUnavailable) else repr(exc)
            if failing:
                log.debug("store heartbeat failed again: %s", reason)
            else:
                failing = True
                log.warning(
                    "store heartbeat failed: %s (not logged again until it succeeds)", reason
                )
            log.debug("store heartbeat failure", exc_info=True)
