"""``raydp-hpo dashboard`` server time on a large ledger: a journal of N charges (10,000 by
default, distinct DP-SGD mechanisms from several experiments) in a storage folder, and the time
from request to complete response of

* **ledger page, cold**: a fresh application (nothing cached, as after a start or a change to
  the journal): scan and check the journal (chain, seal), replay it, start the recomputation
  of every stored RDP curve in the background, render the page (its spend plot carries all N
  points, the charges table one page);
* **ledger page, warm**: the same page again (the journal unchanged: its reading is reused);
* **ledgers page, cold**: the overview (one row per ledger) on a fresh application;
* **ledger JSON, warm**: ``GET /api/ledgers/{id}``;
* **a later page, warm**: ``?page=100`` of the charges table;
* **curve check**: the rest of the background recomputation of every stored RDP curve (a
  ledger of more than :data:`~raydp_hpo.dashboard.data.CURVE_CHECK_INLINE` charges shows
  integrity "checking" until it is done), waited for after the page views above.

Measured through Starlette's in-process TestClient (no network; the client's share is included,
so the figures bound the server's time from above), as wall clock and as the process's CPU time
(all threads; on a shared, loaded machine the wall clock also counts waiting for a core). Each
figure: median and range (min–max) over ``--repeats`` runs. The journal is built once into ``--workdir`` (fsync per charge: about
a minute for 10,000) and reused.

    python benchmarks/dashboard.py [--charges 10000] [--repeats 7] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.ledger.filter import PrivacyLedger


def build(storage: Path, charges: int) -> Path:
    """``<storage>/ledgers/data-bench.journal`` with ``charges`` distinct DP-SGD charges."""
    journal = storage / "ledgers" / "data-bench.journal"
    if journal.exists():
        with PrivacyLedger.read_only(journal) as ledger:
            if len(ledger.charges()) == charges:
                return journal
        for p in journal.parent.glob("data-bench.journal*"):
            p.unlink()
    journal.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with PrivacyLedger(PrivacyBudget(1e6, 1e-5), journal) as ledger:
        for i in range(charges):
            owner = f"exp-{i % 20}"
            mech = SubsampledGaussian(2.0 + (i % 97) / 100, 0.01, 10 + i % 13)
            ledger.charge(f"{owner}/trial-{i}", mech, owner=owner)
    print(f"built {journal} ({charges} charges) in {time.perf_counter() - start:.1f} s")
    return journal


CPU: dict[str, list[float]] = {}


def timed(fn: Callable[[], object], name: str = "") -> float:
    """Wall-clock seconds of ``fn()``; its process CPU seconds (every thread: the server's
    work, plus the in-process client's small share) go to ``CPU[name]``."""
    cpu, start = time.process_time(), time.perf_counter()
    fn()
    wall = time.perf_counter() - start
    CPU.setdefault(name, []).append(time.process_time() - cpu)
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--charges", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    from starlette.testclient import TestClient

    from raydp_hpo.dashboard.app import build_app

    storage = args.workdir or Path(tempfile.mkdtemp(prefix="raydp-dash-bench-"))
    build(storage, args.charges)
    figures: dict[str, list[float]] = {k: [] for k in (
        "ledger page, cold", "ledger page, warm", "ledgers page, cold", "ledger JSON, warm",
        "a later page (?page=100), warm", "curve check (background), after")}
    size = 0
    for _ in range(args.repeats):
        client = TestClient(build_app([str(storage)]))
        ledger_id = client.get("/api/ledgers").json()["ledgers"][0]["id"]
        client = TestClient(build_app([str(storage)]))  # fresh: nothing read yet
        client.get("/static/plots.js")  # discovery happens on the first request; not timed
        figures["ledgers page, cold"].append(timed(lambda c=client: c.get("/"), "ledgers page, cold"))
        client.app.catalogue.settle()  # type: ignore[attr-defined]
        client = TestClient(build_app([str(storage)]))
        client.get("/static/plots.js")

        def page(c: TestClient = client, lid: str = ledger_id, q: str = "") -> None:
            nonlocal size
            response = c.get(f"/ledgers/{lid}{q}")
            assert response.status_code == 200, response.text[:300]
            size = max(size, len(response.content))

        figures["ledger page, cold"].append(timed(page, "ledger page, cold"))
        figures["ledger page, warm"].append(timed(page, "ledger page, warm"))
        figures["ledger JSON, warm"].append(timed(lambda c=client, lid=ledger_id: c.get(
            f"/api/ledgers/{lid}"), "ledger JSON, warm"))
        if args.charges > 99 * 50:
            figures["a later page (?page=100), warm"].append(timed(lambda: page(q="?page=100"),
                                                                     "a later page (?page=100), warm"))
        check = timed(lambda c=client: c.app.catalogue.settle(),  # type: ignore[attr-defined]
                      "curve check (background), after")
        figures["curve check (background), after"].append(check)
    print(f"dashboard server time, ledger of {args.charges} charges, {args.repeats} repeats "
          f"(page size {size / 1e6:.2f} MB incl. the plot's {args.charges} points)")
    print(f"  {'':<34} {'wall clock':>32}   {'CPU (all threads)':>32}")
    for name, values in figures.items():
        if values:
            cpu = CPU[name]
            print(f"  {name:<34} median {statistics.median(values) * 1e3:7.1f} ms "
                  f"({min(values) * 1e3:6.1f}–{max(values) * 1e3:6.1f})   median "
                  f"{statistics.median(cpu) * 1e3:7.1f} ms ({min(cpu) * 1e3:6.1f}–"
                  f"{max(cpu) * 1e3:6.1f})")
    print(f"  load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
          "CPUs (on a shared machine the wall clock also counts waiting for a core)")


if __name__ == "__main__":
    main()
