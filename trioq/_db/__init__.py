"""trioq's tables: every statement (``sql/``, composed in `statements`), the ways rows get in
(`insert`), the worker's fenced calls (`driver`), the schema's version and its migrations.

It imports nothing of `trioq._worker` or `trioq._obs` (``tests/test_layout.py``).
"""
