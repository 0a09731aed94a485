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

3. **Race** (skip it with ``--no-race``, run only it with ``--race-only``):
   ``--race-clusters`` (2) drivers each start their own local Ray cluster (own head and temp
   dir) running ``--race-workers`` racing tasks, and
   ``--race-processes`` (8) plain processes race too, every racer charging the same PostgreSQL
   ledger ``--race-per-racer`` times (default 2·2 + 8 = 12 racers × 850 = 10,200 charges) on a
   budget that runs out mid-race (ε = 2.5 admits 8,438 of them). Reported: admissions beyond
   the budget (must be 0), admitted vs the sequential replay (must be equal), acknowledged
   charges lost / stored unacknowledged (0), admissions per cluster, and the admission
   latency under contention. Harness: ``tests/raydp_hpo/ledger/postgres_race.py``. Exits 1
   if a property fails.

Targets from the issue: admission p50 ≤ 5 ms and p99 ≤ 25 ms at 10,000 charges; open ≤ 2 s.

By default a throw-away server is started (``initdb`` + ``pg_ctl`` under a temp dir, as the
``postgres`` user when run as root; see ``tests/raydp_hpo/ledger/pg_server.py``); pass
``--uri postgresql://host:port/db`` to time an existing server (credentials from libpq).

    python benchmarks/ledger_postgres.py [--n 10000] [--repeats 3] [--uri URI] [--no-race|--race-only]
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


def race(uri_base: str, args: argparse.Namespace) -> bool:
    from postgres_race import run_race

    sep = "&" if "?" in uri_base else "?"
    uri = f"{uri_base}{sep}ledger=race-{uuid.uuid4().hex[:8]}"
    r = run_race(uri, eps=args.race_eps, processes=args.race_processes,
                 clusters=args.race_clusters, workers=args.race_workers,
                 per_racer=args.race_per_racer)
    print(f"race: {r.charges} charges from {r.racers} racers ({args.race_clusters} Ray clusters "
          f"x {args.race_workers} tasks, {args.race_processes} processes) on one ledger, "
          f"budget eps={r.budget_epsilon:g}, wall {r.wall_s:.1f} s")
    print(f"  distinct Ray clusters (GCS): {len(r.clusters)} {r.clusters}")
    print(f"  admitted {r.admitted}, sequential replay {r.sequential}, stored {r.stored}; "
          f"beyond budget {r.beyond_budget}; lost {r.lost}; stored unacknowledged "
          f"{r.unacknowledged}; refused as unavailable {r.unavailable}; max eps after "
          f"{r.spent:.6f}")
    print(f"  admitted per source: {dict(sorted(r.by_source.items()))}; racer switches along "
          f"the chain: {r.switches}")
    print(f"  decision latency under contention: p50 {1e3 * _pct(r.latencies, 0.5):.2f} ms, "
          f"p99 {1e3 * _pct(r.latencies, 0.99):.2f} ms")
    for problem in r.problems():
        print(f"  FAIL: {problem}")
    print("  OK" if not r.problems() else "  FAILED")
    return not r.problems()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--uri", default=None, help="postgresql://host:port/db (default: start "
                                                    "a throw-away server)")
    parser.add_argument("--no-race", action="store_true", help="skip the race")
    parser.add_argument("--race-only", action="store_true", help="run only the race")
    parser.add_argument("--race-clusters", type=int, default=2)
    parser.add_argument("--race-workers", type=int, default=2, help="racing tasks per cluster")
    parser.add_argument("--race-processes", type=int, default=8)
    parser.add_argument("--race-per-racer", type=int, default=850)
    parser.add_argument("--race-eps", type=float, default=2.5)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "raydp_hpo" / "ledger"))
    if args.uri:
        _run_all(args.uri, args)
        return
    from pg_server import WRITER, start_server

    server, why = start_server()
    if server is None:
        raise SystemExit(f"no PostgreSQL server: {why}")
    os.environ["PGUSER"] = WRITER
    try:
        _run_all(server.uri(), args)
    finally:
        server.cleanup()


def _run_all(uri: str, args: argparse.Namespace) -> None:
    if not args.race_only:
        run(uri, args.n, args.repeats)
    if (args.race_only or not args.no_race) and not race(uri, args):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
