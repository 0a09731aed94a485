"""PostgreSQL ledger timings (issue #32): admission latency and open time at N charges.

1. **Admission**: N charges admitted one after another on one PostgreSQL ledger (each is one
   transaction: advisory lock, catch-up read, decision, INSERT, COMMIT with
   ``synchronous_commit=on``), each timed from the call to the acknowledgement. Reported: p50
   and p99 over all N, and over the last 10% (the ledger then holds ~N charges). The same
   mechanism under a new id each time, so its RDP curve is cached: the figures are the
   ledger's and the database's cost, not the accountant's. The same run on an fsync'd journal
   file is shown for comparison.
2. **Open**: ``PrivacyLedger(budget, uri)`` on the ledger of N charges (connect, read and
   chain-check every row, replay the stored curves; default ``CurveCheck.BACKGROUND``).
   Median of ``--repeats`` opens.

Targets from the issue: admission p50 ≤ 5 ms and p99 ≤ 25 ms at 10,000 charges; open ≤ 2 s.

By default a throw-away server is started (``initdb`` + ``pg_ctl`` under a temp dir, as the
``postgres`` user when run as root; see ``tests/raydp_hpo/ledger/pg_server.py``); pass
``--uri postgresql://host:port/db`` to time an existing server (credentials from libpq).

    python benchmarks/ledger_postgres.py [--n 10000] [--repeats 3] [--uri URI]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raydp_hpo.accounting.budget import PrivacyBudget  # noqa: E402
from raydp_hpo.accounting.mechanisms import SubsampledGaussian  # noqa: E402
from raydp_hpo.ledger.filter import PrivacyLedger  # noqa: E402

MECH = SubsampledGaussian(1.0, 0.01, 100)
BUDGET = PrivacyBudget(1e6, 1e-5)  # never exhausted: every charge is an admission


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _admit(target: str | Path, n: int) -> list[float]:
    times = []
    with PrivacyLedger(BUDGET, target) as led:
        for k in range(n):
            t0 = time.perf_counter()
            led.charge(f"c{k}", MECH)
            times.append(time.perf_counter() - t0)
    return times


def _line(what: str, times: list[float]) -> str:
    tail = times[-max(1, len(times) // 10):]
    return (f"{what:<28} p50 {1e3 * _pct(times, 0.5):6.2f} ms  p99 {1e3 * _pct(times, 0.99):6.2f} ms"
            f"   (last 10%: p50 {1e3 * _pct(tail, 0.5):6.2f} ms, p99 "
            f"{1e3 * _pct(tail, 0.99):6.2f} ms)")


def run(uri_base: str, n: int, repeats: int) -> None:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    sep = "&" if "?" in uri_base else "?"
    uri = f"{uri_base}{sep}ledger={name}"
    pg = _admit(uri, n)
    with tempfile.TemporaryDirectory() as tmp:
        file = _admit(Path(tmp) / "bench.journal", n)
    opens = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        led = PrivacyLedger(BUDGET, uri)
        opens.append(time.perf_counter() - t0)
        assert len(led.charges()) == n
        led.close()
    print(f"N = {n} charges ({os.cpu_count()} CPUs visible)")
    print(_line("admission, PostgreSQL", pg))
    print(_line("admission, journal file", file))
    print(f"{'open, PostgreSQL':<28} median {statistics.median(opens):.3f} s over {repeats} "
          f"(min {min(opens):.3f}, max {max(opens):.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--uri", default=None, help="postgresql://host:port/db (default: start "
                                                    "a throw-away server)")
    args = parser.parse_args()
    if args.uri:
        run(args.uri, args.n, args.repeats)
        return
    sys.path.insert(0, str(ROOT / "tests" / "raydp_hpo" / "ledger"))
    from pg_server import WRITER, start_server

    server, why = start_server()
    if server is None:
        raise SystemExit(f"no PostgreSQL server: {why}")
    os.environ["PGUSER"] = WRITER
    try:
        run(server.uri(), args.n, args.repeats)
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
