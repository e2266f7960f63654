"""A Quart-Trio shop (trio): its endpoint enqueues on a connection of trioq's pool, in
the request's transaction, and the same process runs the worker, in the app's nursery."""
