"""What a faster JSON codec would buy trioq (not a test).

trioq encodes a job's args at the enqueue (`trioq._job.encode_args`: the stdlib encoder,
compact, ``allow_nan=False``, then NUL and lone-surrogate checks), decodes them at the claim
(`trioq._job.decode_args`), and encodes a kept result (`encode_args` again). This measures
each against orjson and msgspec (each if importable; neither is a trioq dependency) on three
shapes of args: small (a dict of 3 fields, about 50 bytes), 1 KB and 10 KB (nested), and
puts the gain next to the client CPU a job costs end to end (``--per-job-us``: the no-op
drain's 37 us/job and the exactly-once path's 350 us/job, from docs/benchmarks.md).

It also checks where the codecs disagree with trioq's rules (the cases a switch would have
to handle): NaN, integers past 64 bits, non-string keys, lone surrogates, NUL.

Usage::

    pip install orjson msgspec   # only for this measurement
    python bench/bench_json.py
"""

from __future__ import annotations

import argparse
import functools
import json
import timeit
from collections.abc import Callable
from typing import Any

from _common import Table, fmt

from trioq._job import encode_args
from trioq._sanitize import decode_args

SHAPES: dict[str, Any] = {
    "small": {"user_id": 12345, "email": "someone@example.com", "retry": True},
    "1 KB": {"order": {"id": 987654, "items": [{"sku": f"SKU-{i:04d}", "qty": i % 5 + 1,
                                                 "price": 9.99 + i} for i in range(12)]},
             "note": "x" * 200},
    "10 KB": {"rows": [{"id": i, "name": f"row {i}", "tags": ["a", "b", "c"], "score": i / 7,
                        "nested": {"k": i, "v": [i, i + 1, i + 2]}} for i in range(80)]},
}  # fmt: skip


def codecs() -> dict[str, tuple[Callable[[Any], str], Callable[[str], Any]]]:
    found: dict[str, tuple[Callable[[Any], str], Callable[[str], Any]]] = {
        "trioq (stdlib json + checks)": (encode_args, decode_args),
        "stdlib json alone": (
            json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode,
            json.loads,
        ),
    }
    try:
        import orjson  # type: ignore[import-not-found, unused-ignore]

        found["orjson"] = (lambda v: orjson.dumps(v).decode(), orjson.loads)
    except ImportError:
        pass
    try:
        import msgspec  # type: ignore[import-not-found, unused-ignore]

        enc, dec = msgspec.json.Encoder(), msgspec.json.Decoder()
        found["msgspec"] = (lambda v: enc.encode(v).decode(), dec.decode)
    except ImportError:
        pass
    return found


def timed(fn: Callable[[], object], n: int) -> float:
    """Microseconds per call, best of 5."""
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def disagreements(found: dict[str, tuple[Callable[[Any], str], Callable[[str], Any]]]) -> None:
    cases: dict[str, Any] = {"NaN": {"x": float("nan")}, "2**70": {"x": 2**70},
                             "int key": {1: "a"}, "lone surrogate": {"x": "\ud800"},
                             "NUL": {"x": "a\x00b"}}  # fmt: skip
    print("\nhow each codec takes what trioq refuses or keeps:")
    for case, value in cases.items():
        cells = []
        for name, (encode, _decode) in found.items():
            try:
                cells.append(f"{name}: {encode(value)[:30]!r}")
            except Exception as ex:  # the point is which ones raise
                cells.append(f"{name}: {type(ex).__name__}")
        print(f"  {case:15} " + "; ".join(cells))


def main(opts: argparse.Namespace) -> None:
    found = codecs()
    table = Table([("shape", 6, "<"), ("bytes", 6, ">"), ("codec", 28, "<"),
                   ("encode us", 9, ">"), ("decode us", 9, ">"),
                   ("saved us/job", 12, ">"),
                   *[(f"% of {us:g} us/job", 14, ">") for us in opts.per_job_us]],
                  markdown=True)  # fmt: skip
    rows = []
    for shape, value in SHAPES.items():
        text = encode_args(value)
        base = None
        n = max(200, 200_000 // max(1, len(text)))
        for name, (encode, decode) in found.items():
            e = timed(functools.partial(encode, value), n)
            d = timed(functools.partial(decode, text), n)
            if base is None:
                base = e + d
            saved = base - e - d  # an enqueue's encode and a claim's decode
            rows.append([shape, str(len(text.encode())), name, fmt(e, ".2f"), fmt(d, ".2f"),
                         fmt(saved, ".1f"),
                         *[fmt(100 * saved / us, ".1f") for us in opts.per_job_us]])  # fmt: skip
    print(table.render(rows))
    disagreements(found)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-job-us", type=lambda t: [float(x) for x in t.split(",")],
                        default=[37.0, 350.0],
                        help="client CPU per job to compare with")  # fmt: skip
    return parser.parse_args()


if __name__ == "__main__":
    main(parse())
