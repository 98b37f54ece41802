"""The client's side of the wire: the response a client is streamed, which frames its side
acknowledged, and the connections themselves.

    client.py             ClientStream: one streamed answer's response, its writes, what the
                          client's side received, an explicit cancel
    delivery.py           the delivery tracker: how many frames the client's kernel acknowledged
    idle_readers.py       a client that stopped reading without closing
    slow_clients.py       head and body deadlines, the connection cap, JSON answers to malformed
                          HTTP
    aiohttp_internals.py  the only module that reads aiohttp's private names

Above it: gateway.pipeline (the relay writes through ClientStream) and gateway.http (the server
runs behind the slow-client guard).
"""
