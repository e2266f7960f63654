"""The maintenance services of a worker, one module each, every one a ``run_once()`` in the
one interval loop (`loop`). Only `trioq._worker.wiring` imports them (``tests/test_layout.py``)."""
