"""Stream assembly: SSE decoding, the gateway's stream events, blocks, timing, delivery."""
