"""HTTP surface: the route table, thin handlers, middleware."""
