"""Seeing what trioq does: the metrics a scrape shows, the per-minute job history, the queue
depths, and the trace context an enqueue stores."""
