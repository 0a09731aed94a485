"""Bad input through the real CLI: every row of the bad-input catalogue
(``tests/raydp_hpo/cli/bad_input_catalogue.py``, the same rows as ``tests/raydp_hpo/cli/test_bad_input.py``)
run as ``python -m raydp_hpo.cli ARGS`` in a subprocess with a timeout, classified:

* **clear** — the documented exit code (2 bad input, 3 budget cannot pay), every listed word
  (the bad value, what to do) in the output, no traceback, no journal changed or created;
* **vague** — a traceback, another non-zero exit code, or a missing word;
* **silent** — exit 0: the input was accepted;
* **hang** — no exit within ``--timeout`` seconds.

Ledger-operation rows (kind ``api``) run in a subprocess of their own
(``python -m tests.raydp_hpo.cli.bad_input_catalogue``), which maps errors as the CLI does.

    python benchmarks/bad_input.py [--jobs 2] [--timeout 120] [--pythonpath DIR] [--only WORD]

``--pythonpath`` runs the CLI from another checkout (e.g. an export of an older commit, to
count the outcomes before a fix); the catalogue always comes from this checkout.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.raydp_hpo.cli.bad_input_catalogue import (  # noqa: E402
    CASES,
    Case,
    classify,
    journals_under,
    make_data,
    prepare,
)


def run_case(case: Case, tmp: Path, data: Path, timeout: float, pythonpath: str
             ) -> tuple[Case, str, str, float]:
    argv, _ = prepare(case, tmp, data)
    before = journals_under(tmp)
    env = {**os.environ, "PYTHONPATH": pythonpath, "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0"}
    if case.kind == "api":
        env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{pythonpath}"
        cmd = [sys.executable, "-m", "tests.raydp_hpo.cli.bad_input_catalogue", case.name, str(tmp)]
    else:
        cmd = [sys.executable, "-m", "raydp_hpo.cli.main", *argv]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                              timeout=timeout, errors="replace")
        code: int | None = proc.returncode
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        code, output = None, ""
    elapsed = time.perf_counter() - start
    outcome, why = classify(case, code, output, before, journals_under(tmp))
    return case, outcome, why, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--pythonpath", default=str(ROOT))
    parser.add_argument("--only", default=None, help="only rows whose name contains this")
    parser.add_argument("--kind", action="append", default=[],
                        help="only rows of this kind (repeatable: experiment, data, cli, "
                             "account, ledger, api)")
    parser.add_argument("--verbose", action="store_true", help="print every row")
    args = parser.parse_args()
    cases = [c for c in CASES if (args.only is None or args.only in c.name)
             and (not args.kind or c.kind in args.kind)]
    with tempfile.TemporaryDirectory(prefix="bad-input-") as tmp_name:
        tmp = Path(tmp_name)
        make_data(tmp / "data")
        def one(ic: tuple[int, Case]) -> tuple[Case, str, str, float]:
            result = run_case(ic[1], tmp / f"case{ic[0]:03d}", tmp / "data", args.timeout,
                              args.pythonpath)
            case, outcome, why, elapsed = result
            if args.verbose or outcome != "clear":
                print(f"{outcome:<7} {case.kind:<10} {case.name:<45} {elapsed:6.1f} s  {why}",
                      flush=True)
            return result

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(one, enumerate(cases)))
    counts = Counter(outcome for _, outcome, _, _ in results)
    by_kind: dict[str, Counter[str]] = {}
    for case, outcome, _, _ in results:
        by_kind.setdefault(case.kind, Counter())[outcome] += 1
    print(f"\n{len(results)} bad inputs through the CLI ({args.pythonpath}):")
    for outcome in ("clear", "vague", "silent", "hang"):
        print(f"  {outcome:<7} {counts.get(outcome, 0):>4}")
    print("by kind: " + "; ".join(
        f"{kind} " + ", ".join(f"{o} {n}" for o, n in sorted(c.items()))
        for kind, c in sorted(by_kind.items())))


if __name__ == "__main__":
    main()
