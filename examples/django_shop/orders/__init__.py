"""The shop's orders: a model, the view that takes an order, and the job that sends its
receipt (``tasks.py``, run by a trio worker that does not import Django)."""
