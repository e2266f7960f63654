"""psycopg 3 driven by trio: connections, waits, pipelines, the pool, the embedded Postgres.

The lowest wing: it knows Postgres and trio, and nothing of jobs. ``tests/test_layout.py``
checks that it imports nothing of `trioq._db`, `trioq._worker` or `trioq._obs`.
"""
