"""``kirim doctor``'s checks: ``checks`` (what is wrong, and what to do), ``audit``
(another system's table, read-only) and ``probes`` (a database connection that
reads the catalog of SQLite or PostgreSQL)."""
