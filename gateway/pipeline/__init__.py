"""The data path of one completion, from admission to the recorded end of its turn.

    turn.py          run_turn: limits, the conversation joined, the turn's recorder, the relay
    relay.py         Relay: the attempts (retries, fallbacks, deadlines), the stream or body
                     relayed to the client, and every way a turn ends
    body.py          a non-streaming answer read whole
    deadline.py      an attempt's deadlines, served by one watchdog timer per event loop
    continuation.py  continue_on_failure: the request that asks another deployment to finish
    embeddings.py    an embeddings request: routed and retried like a turn, not recorded
    calls.py         images, audio, moderations, rerank: admitted, routed, metered, logged
    files.py         files and batches, owned by the uploading key's team; batches metered
    token_count.py   /v1/messages/count_tokens: Anthropic's count, else an estimate

Below it: gateway.routing (which deployments), gateway.upstream (the HTTP to them),
gateway.providers (their wire formats), gateway.stream (events, assembly, the attempt's log),
gateway.downstream (the client's side of a stream: its response, writes, what it received),
gateway.conversations.recorder (what is recorded, in which order) and gateway.storage.
"""
