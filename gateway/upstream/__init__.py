"""The upstream side of the gateway's HTTP: the seam every provider adapter posts through
(`seam`), the pool of kept-alive connections per origin (`pool`), and one connection's
request and response framing (`connection`)."""
