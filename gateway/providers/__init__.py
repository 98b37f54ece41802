"""Upstream providers: wire formats (pure) and the adapters that speak them."""
