"""The data path of one chat completion, top to bottom.

    plan: the alias's deployments in strategy order, then its fallback aliases'
      -> attempt: open the upstream; until the first content chunk nothing is sent to the
         client, so a failure up to then is retried (backoff with jitter, Retry-After within
         a cap, bounded attempts and time) on the next deployment of the plan
      -> relay: decode upstream SSE frames into the gateway's stream events; forward each
         frame's bytes unchanged when the upstream speaks the client's dialect, else render
         the events in the client's dialect; note which events each written frame carried
      -> track delivery: the kernel's acknowledged-byte count says which frames the client has
      -> record: the finalisation rules of contract section 3 (gateway.conversations.recorder)

When the client goes away, aiohttp cancels the handler (`handler_cancellation=True`) wherever it
is waiting: on the upstream's headers, on the next upstream chunk, or on a write (or a write
raises ConnectionError first). `client_gone` then runs without awaiting anything: it closes the
upstream connection at once and records the delivered prefix.

Upstream timeouts live here, not in aiohttp: time to first token (until the first content
chunk), the idle gap between chunks (paused while a slow client holds up a write), and total.

The package, in that order:

    relay.py     ChatCall, run_chat, the relay's state and its attempts (retries, deadlines)
    stream.py    the streaming relay: frames in, frames out, held until the first content
    body.py      the non-streaming relay: one JSON body
    endings.py   the client gone, draining, a crash, an explicit cancel, closing up
    deadline.py  an attempt's deadline, moved on every upstream read without timer work
"""

from gateway.pipeline.relay import ChatCall, run_chat

__all__ = ["ChatCall", "run_chat"]
