"""A FastAPI shop (asyncio): its endpoint enqueues on a psycopg_pool connection, in the
request's transaction; a trio worker runs the job (``trioq serve``, see ``tasks.py``)."""
