"""Racing charges on one PostgreSQL ledger from several Ray clusters and plain processes
(issue #32), shared by ``test_ledger_postgres.py`` (a few hundred charges) and
``benchmarks/ledger_postgres.py`` (≥ 10,000).

Racers:

* ``processes`` plain Python processes, each with its own :class:`PrivacyLedger` on the URI;
* ``clusters`` driver processes, each starting its **own local Ray cluster** (``ray.init(
  address="local", _temp_dir=<its own>)``: its own head, GCS and raylet, nothing shared with
  the other cluster or any other Ray on the machine) and running ``workers`` Ray tasks, each
  with its own ledger on the URI. Each driver shuts its cluster down (``ray.shutdown``);
  nothing else is stopped.

Every racer charges ``per_racer`` times the same mechanism under its own ids. They start
together: each writes a ``ready-<who>`` file and waits for the ``go`` file, which the parent
writes when all are ready (Ray start-up takes seconds; without the barrier the plain
processes would be done before the clusters began). The clusters start one after another,
and a start that times out (Ray waits 30 s for its raylet, which a loaded machine can miss)
is retried with a fresh driver and temp dir.

Every charge is the same mechanism, so *any* order of admission admits the same number of
them: the sequential replay (one in-memory ledger charging until refused) is the exact count
the race must admit. Checked after the race: admitted (acknowledged) = sequential, the stored
ids are the acknowledged ids (0 lost, 0 unacknowledged), every stored charge's ε after it is
≤ the budget (0 beyond it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger

MECH = SubsampledGaussian(2.0, 0.01, 1)  # ~1,480 fit in ε=1, ~8,440 in ε=2.5
DELTA = 1e-5

# one racer's loop: runs in a plain process and inside a Ray task alike
_LOOP = r'''
def race(uri, who, n, eps, sync):
    import json, os, time
    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.accounting.mechanisms import SubsampledGaussian
    from raydp_hpo.errors import LedgerUnavailableError
    from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger
    mech = SubsampledGaussian(2.0, 0.01, 1)
    acked, unavailable, latencies = [], 0, []
    with PrivacyLedger(PrivacyBudget(eps, 1e-5), uri, curve_check=CurveCheck.ON_DEMAND) as led:
        open(os.path.join(sync, "ready-" + who), "w").close()
        deadline = time.monotonic() + 1200  # the clusters start one after another
        while not os.path.exists(os.path.join(sync, "go")):
            if time.monotonic() > deadline:
                raise SystemExit("no go signal")
            time.sleep(0.005)
        for k in range(n):
            t0 = time.perf_counter()
            try:
                admitted = led.try_charge(f"{who}-{k}", mech).admitted
            except LedgerUnavailableError:
                unavailable += 1
                continue
            latencies.append(time.perf_counter() - t0)
            if admitted:
                acked.append(f"{who}-{k}")
    return {"who": who, "acked": acked, "unavailable": unavailable, "pid": os.getpid(),
            "latencies": latencies}
'''

_PROCESS = _LOOP + r'''
import json, sys
uri, who, n, eps, sync = sys.argv[1:6]
print(json.dumps([race(uri, who, int(n), float(eps), sync)]))
'''

_CLUSTER = _LOOP + r'''
import json, os, sys
import ray
uri, who, workers, n, eps, sync, temp_dir = sys.argv[1:8]
ray.init(address="local", num_cpus=int(workers), include_dashboard=False, log_to_driver=False,
         _temp_dir=temp_dir)
try:
    gcs = ray.get_runtime_context().gcs_address
    remote = ray.remote(num_cpus=1)(race)
    out = ray.get([remote.remote(uri, f"{who}w{i}", int(n), float(eps), sync)
                   for i in range(int(workers))])
    for o in out:
        o["cluster"] = gcs
finally:
    ray.shutdown()
print(json.dumps(out))
'''


@dataclass
class RaceResult:
    """What a race did; :meth:`problems` lists every violated property (empty: all hold)."""

    racers: int
    charges: int
    budget_epsilon: float
    sequential: int
    admitted: int
    stored: int
    lost: int  # acknowledged but not stored
    unacknowledged: int  # stored but never acknowledged
    beyond_budget: int  # stored charges whose ε after them exceeds the budget
    spent: float
    unavailable: int
    wall_s: float
    by_source: dict[str, int] = field(default_factory=dict)  # admitted per cluster / process
    clusters: list[str] = field(default_factory=list)  # distinct Ray GCS addresses seen
    switches: int = 0  # how often consecutive stored charges come from different racers
    latencies: list[float] = field(default_factory=list)

    def problems(self) -> list[str]:
        out = []
        if self.beyond_budget or self.spent > self.budget_epsilon:
            out.append(f"{self.beyond_budget} admissions beyond the budget (spent "
                       f"{self.spent} > ε={self.budget_epsilon})")
        if self.admitted != self.sequential:
            out.append(f"admitted {self.admitted} != sequential replay {self.sequential}")
        if self.lost or self.unacknowledged or self.stored != self.admitted:
            out.append(f"{self.lost} acknowledged charges lost, {self.unacknowledged} stored "
                       "but unacknowledged")
        if self.unavailable:
            out.append(f"{self.unavailable} charges refused as unavailable (server was up)")
        return out


def sequential_count(eps: float) -> int:
    """How many charges of :data:`MECH` one ledger admits on ε=``eps`` (any order)."""
    led = PrivacyLedger(PrivacyBudget(eps, DELTA))
    n = 0
    while led.try_charge(f"s{n}", MECH).admitted:
        n += 1
    return n


def _wait_ready(sync: str, names: list[str], procs: list[subprocess.Popen[str]],
                timeout_s: float = 300) -> str | None:
    """Wait until every racer in ``names`` wrote its ready file; why not (a racer process
    failed, or the time ran out), else ``None``."""
    deadline = time.monotonic() + timeout_s
    while not all((Path(sync) / f"ready-{w}").exists() for w in names):
        dead = [p for p in procs if p.poll() not in (None, 0)]
        if dead:
            return str(dead[0].communicate()[1][-3000:])
        if time.monotonic() > deadline:
            return f"not ready after {timeout_s:.0f} s"
        time.sleep(0.05)
    return None


def _stop(proc: subprocess.Popen[str]) -> None:
    """Kill a racer this module started (by its own handle), if it still runs. A driver's Ray
    processes share its fate (Ray starts them to die with the driver)."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def run_race(uri: str, *, eps: float, processes: int, clusters: int, workers: int,
             per_racer: int, timeout_s: float = 1800) -> RaceResult:
    """Race on the (new) ledger at ``uri``; credentials from the environment (libpq)."""
    sequential = sequential_count(eps)
    PrivacyLedger(PrivacyBudget(eps, DELTA), uri).close()  # create it before the race
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "RAY_AUTH_MODE": "disabled"}
    with tempfile.TemporaryDirectory(prefix="rpgrace", dir="/tmp") as sync:
        procs: list[subprocess.Popen[str]] = []
        whos: list[str] = []
        try:
            # the clusters start one after another, each retried (a fresh driver and temp
            # dir) when Ray's start-up times out on a loaded machine (its raylet wait is 30 s)
            for c in range(clusters):
                names = [f"c{c}w{i}" for i in range(workers)]
                for attempt in range(3):
                    temp = tempfile.mkdtemp(prefix=f"rc{c}{attempt}", dir=sync)  # short paths
                    driver = subprocess.Popen(
                        [sys.executable, "-c", _CLUSTER, uri, f"c{c}", str(workers),
                         str(per_racer), str(eps), sync, temp], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True, env=env)
                    why = _wait_ready(sync, names, [driver])
                    if why is None:
                        break
                    _stop(driver)
                else:
                    raise RuntimeError(f"Ray cluster c{c} did not start 3 times: {why}")
                procs.append(driver)
                whos += names
            for k in range(processes):
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", _PROCESS, uri, f"p{k}", str(per_racer), str(eps),
                     sync], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
                whos.append(f"p{k}")
            why = _wait_ready(sync, whos, procs)
            if why is not None:
                raise RuntimeError(f"a racer did not get ready: {why}")
            t0 = time.perf_counter()
            (Path(sync) / "go").touch()
            reports = []
            for p in procs:
                out, err = p.communicate(timeout=timeout_s)
                if p.returncode != 0:
                    raise RuntimeError(f"a racer failed (exit {p.returncode}): {err[-3000:]}")
                reports += json.loads(out.strip().splitlines()[-1])
            wall = time.perf_counter() - t0
        finally:
            for p in procs:  # only the racers started here, by their own handles
                _stop(p)
    acked = [a for r in reports for a in r["acked"]]
    stored = PrivacyLedger.read_only(uri, curve_check=CurveCheck.ON_DEMAND).charges()
    ids = [c.charge_id for c in stored]
    by_source: dict[str, int] = {}
    for a in acked:
        src = a.split("w")[0] if a.startswith("c") else "processes"
        by_source[src] = by_source.get(src, 0) + 1
    racer_of = [i.split("-")[0] for i in ids]
    return RaceResult(
        racers=len(reports), charges=len(reports) * per_racer, budget_epsilon=eps,
        sequential=sequential, admitted=len(acked), stored=len(ids),
        lost=len(set(acked) - set(ids)), unacknowledged=len(set(ids) - set(acked)),
        beyond_budget=sum(c.epsilon_after > eps for c in stored),
        spent=max((c.epsilon_after for c in stored), default=0.0),
        unavailable=sum(r["unavailable"] for r in reports), wall_s=wall,
        by_source=by_source, clusters=sorted({r["cluster"] for r in reports if "cluster" in r}),
        switches=sum(a != b for a, b in zip(racer_of, racer_of[1:], strict=False)),
        latencies=[t for r in reports for t in r["latencies"]],
    )
