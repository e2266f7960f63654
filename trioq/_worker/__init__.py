"""The worker runtime: `serve`, the `Runtime` (fetchers, slots, shutdown), what one handler
run becomes (`execute`), the completer, the leases held, and the wiring that builds the
maintenance services (``services/``) from a `trioq.Config`."""
