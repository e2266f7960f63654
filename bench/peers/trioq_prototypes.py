"""Prototypes of runtime changes, measured before they were made (now retired).

The prototypes measured here in November 2026 (``early-slot``, ``pipeline``, ``lean``) were
monkeypatches of `trioq._worker.runtime.Runtime`. All three are now part of the runtime itself
(prefetch buffer and long-lived slots, slot freed before the outcome hand-off, lean
per-job path), so they no longer apply to it. To compare the runtime with an older one,
run both in the same benchmark::

    mkdir /tmp/trioq-old && git archive COMMIT trioq | tar -x -C /tmp/trioq-old
    python bench/bench_peers.py --trioq-baseline /tmp/trioq-old ...

`docs/benchmarks.md` keeps the numbers the prototypes gave.
"""

from __future__ import annotations

NAMES: tuple[str, ...] = ()


def apply(names: list[str]) -> None:
    raise SystemExit(
        f"prototypes {names} are retired: the runtime now does what they sketched. "
        "Compare with an older trioq with bench_peers.py --trioq-baseline DIR."
    )
