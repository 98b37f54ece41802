"""The store: one interface over SQLite (embedded) and PostgreSQL (several replicas), with a
write queue that spills to a local spool while the database is away."""
