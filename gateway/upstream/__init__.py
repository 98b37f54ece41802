"""The upstream side of the gateway's HTTP: the seam every provider adapter posts through
(`seam`), the pool of kept-alive connections per origin (`pool`), one connection's request
and response framing (`connection`), forward proxies and their CONNECT tunnels (`proxy`), and
the CAs an upstream's certificate is checked against (`tls`)."""
