"""Does the native DP-SGD noise kernel shorten whole searches? (issue 33)

    .venv/bin/python benchmarks/native_kernel_end_to_end.py                    # demo ×3 + PU ×2 per side
    .venv/bin/python benchmarks/native_kernel_end_to_end.py --demo-pairs 1 --pu-pairs 0 --quick-demo

Two whole searches, each run with the kernel on (``RAYDP_HPO_NATIVE_NOISE=1``) and off
(``=0``: ``Tensor.normal_``), interleaved — pairs with the same secret seed, the order of the
two sides alternating from one pair to the next (AB, BA, AB, ...) so that drift in the load of
the shared machine hits both sides alike:

* **demo** — ``raydp_hpo.cli.demo.run_demo`` exactly as ``raydp-hpo demo`` runs it (local Ray,
  DPTuner, random stopping, the 1-D random-kernel model on MNIST-1D), except that the tuner's
  ``secret_seed`` is fixed per pair (the demo draws it from OS entropy), so both sides of a
  pair run the same number of trials with the same hyperparameters;
* **privacy-utility** — ``benchmarks/privacy_utility.py`` on a small configuration (one
  dataset, one method, one ε, a few seeds; ``--pu-args``), oracle grid included, output to a
  temporary folder.

For each run: wall time, and CPU time (user + system) of the whole process tree — the runner
makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so Ray's daemons and
worker processes, which leave the driver's tree, are re-parented to it and reaped, and their
CPU time is counted by ``getrusage(RUSAGE_CHILDREN)``. The CPU figure is less sensitive to
other jobs on the machine than the wall time. Each child also reports whether the kernel was
in use where the noise is drawn (in a Ray worker for the demo).

Reported per study: median and range of each side, the paired differences (on − off) with
their mean and a 95 % Student-t interval, and the saving in % of the off side's median.
Decision rule of issue 33: the kernel stays only if it saves ≥ 10 % of a whole search's wall
time. Results: ``benchmarks/results/native_kernel/``.

The kernel was removed after this measurement (issue 33: no saving). This script needs it
(``raydp_hpo.trainables.gaussian_kernel``): run it from commit 9924d83, the last one with the
kernel, e.g. ``git worktree add /tmp/nk 9924d83 && cd /tmp/nk && .venv/bin/python
benchmarks/native_kernel_end_to_end.py``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PR_SET_CHILD_SUBREAPER = 36
DEFAULT_PU_ARGS = "--datasets mnist1d --methods random_stopping --epsilons 3 --seeds 2"
# t_{0.975, n-1} for n = 2..10
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262}

DEMO_CHILD = r"""
import json, sys
seed, storage, ray_tmp, quick = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1"
import raydp_hpo.tune.tuner as tuner_module
_init = tuner_module.DPTuner.__init__
def _seeded(self, *args, **kwargs):  # the demo draws its secret seed from OS entropy
    kwargs.setdefault("secret_seed", seed)
    _init(self, *args, **kwargs)
tuner_module.DPTuner.__init__ = _seeded
import ray
from raydp_hpo._ray_runtime import ensure_ray
from raydp_hpo.cli.demo import run_demo
ensure_ray(num_cpus=2, temp_dir=ray_tmp)
try:
    rc = run_demo(quick=quick, storage_path=storage)
    @ray.remote
    def _status():
        from raydp_hpo.trainables import gaussian_kernel
        return gaussian_kernel.native_status().available
    print("NATIVE_IN_WORKER", json.dumps(ray.get(_status.remote())), flush=True)
finally:
    ray.shutdown()
sys.exit(rc)
"""


def _subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _reap(timeout: float = 60.0) -> int:
    """Wait for every remaining descendant (orphans re-parented to us); return how many."""
    reaped, deadline = 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            time.sleep(0.2)
        else:
            reaped += 1
    print(f"  warning: descendants still running after {timeout:.0f} s; their CPU time is "
          "not counted", flush=True)
    return reaped


def _cpu_children() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_one(cmd: list[str], native: bool, log: Path) -> dict[str, Any]:
    env = {**os.environ, "RAYDP_HPO_NATIVE_NOISE": "1" if native else "0",
           "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    cpu0, t0 = _cpu_children(), time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                              check=False)
    wall = time.perf_counter() - t0
    orphans = _reap()
    cpu = _cpu_children() - cpu0
    text = log.read_text(errors="replace")
    return {"native": native, "rc": proc.returncode, "wall_s": wall, "cpu_s": cpu,
            "orphans_reaped": orphans, "log": str(log), "text": text}


def _interval(diffs: list[float]) -> str:
    if len(diffs) < 2:
        return f"{diffs[0]:+.1f} (one pair)" if diffs else "—"
    m, s = statistics.mean(diffs), statistics.stdev(diffs)
    h = T975.get(len(diffs) - 1, 1.96) * s / len(diffs) ** 0.5
    return f"{m:+.1f} [{m - h:+.1f}, {m + h:+.1f}]"


def summarise(name: str, runs: list[dict[str, Any]]) -> str:
    lines = [f"## {name}", "",
             "| run | pair | kernel | rc | wall s | CPU s | kernel used | detail |",
             "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs):
        lines.append(f"| {i + 1} | {r['pair']} | {'on' if r['native'] else 'off'} | {r['rc']} | "
                     f"{r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r.get('used', '?')} | "
                     f"{r.get('detail', '')} |")
    lines.append("")
    for key, label in (("wall_s", "wall time"), ("cpu_s", "CPU time")):
        on = [r[key] for r in runs if r["native"]]
        off = [r[key] for r in runs if not r["native"]]
        if not on or not off:
            continue
        pairs: dict[int, dict[bool, float]] = {}
        for r in runs:
            pairs.setdefault(r["pair"], {})[r["native"]] = r[key]
        diffs = [p[True] - p[False] for p in pairs.values() if len(p) == 2]
        saving = 100.0 * (statistics.median(off) - statistics.median(on)) / statistics.median(off)
        rel = [100.0 * (p[False] - p[True]) / p[False] for p in pairs.values() if len(p) == 2]
        lines.append(
            f"- {label}: kernel on median {statistics.median(on):.1f} s "
            f"(range {min(on):.1f}–{max(on):.1f}), off median {statistics.median(off):.1f} s "
            f"(range {min(off):.1f}–{max(off):.1f}); paired on − off (s), mean [95% t]: "
            f"{_interval(diffs)}; saving of the median {saving:+.1f} %, per pair "
            + ", ".join(f"{x:+.1f} %" for x in rel))
    lines.append("")
    return "\n".join(lines)


def draw_check(rounds: int = 15, number: int = 500) -> str:
    """Per-draw time of the kernel (``gaussian_``, key draw included) and of ``normal_`` at
    the parameter counts of the searches' models, one torch thread, interleaved rounds: the
    most the kernel can save per DP step of those searches."""
    import timeit

    import torch
    from raydp_hpo.trainables.gaussian_kernel import gaussian_, native_status

    from raydp_hpo.trainables.models import build_model

    torch.set_num_threads(1)
    lines = ["## Per-draw time at the searches' model sizes (1 thread; median [min–max] over "
             f"{rounds} interleaved rounds of {number} draws; kernel: {native_status().reason})",
             "", "| model | values | kernel µs | normal_ µs | kernel / normal_ |", "|---|---|---|---|---|"]
    for name in ("random_kernels1d", "mlp"):
        n = sum(p.numel() for p in build_model(name, (40,), 10).parameters() if p.requires_grad)
        out, gen = torch.empty(n), torch.Generator().manual_seed(1)
        sides = {"kernel": lambda out=out, gen=gen: gaussian_(out, 1.0, gen),
                 "normal_": lambda out=out, gen=gen: out.normal_(0.0, 1.0, generator=gen)}
        times: dict[str, list[float]] = {k: [] for k in sides}
        for r in range(rounds):
            for k in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                times[k].append(timeit.timeit(sides[k], number=number) / number * 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
        lines.append(f"| {name} | {n} | {med['kernel']:.1f} [{min(times['kernel']):.1f}–"
                     f"{max(times['kernel']):.1f}] | {med['normal_']:.1f} "
                     f"[{min(times['normal_']):.1f}–{max(times['normal_']):.1f}] | "
                     f"{med['kernel'] / med['normal_']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo-pairs", type=int, default=3)
    ap.add_argument("--quick-demo", action="store_true", help="the demo's --quick setting")
    ap.add_argument("--pu-pairs", type=int, default=2)
    ap.add_argument("--pu-args", default=DEFAULT_PU_ARGS,
                    help=f"privacy_utility.py arguments (default: {DEFAULT_PU_ARGS!r})")
    ap.add_argument("--seed", type=int, default=33, help="secret seed of demo pair 0")
    ap.add_argument("--first-pair", type=int, default=0,
                    help="index of the first pair (its seed is --seed + index; even pairs run "
                    "the kernel first): a later invocation continues a series")
    ap.add_argument("--combine", type=Path, nargs="+", default=None,
                    help="no runs: one report from these end_to_end_runs.json files")
    ap.add_argument("--draw-check", action="store_true",
                    help="also time one noise draw at the models' sizes (kernel vs normal_)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "native_kernel")
    args = ap.parse_args(argv)
    if args.combine:
        runs = [r for f in args.combine for r in json.loads(f.read_text())]
        demo = [r for r in runs if Path(r["log"]).name.startswith("demo_")]
        pu = [r for r in runs if Path(r["log"]).name.startswith("pu_")]
        text = "\n".join(["# Native noise kernel, end to end (combined)", "",
                          "From " + ", ".join(f"`{f}`" for f in args.combine) + ".", "",
                          summarise("Demo", demo) if demo else "",
                          summarise("Privacy-utility benchmark", pu) if pu else ""])
        print(text)
        return 0
    _subreaper()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="nk-e2e-"))
    py = sys.executable
    print(f"python {py}; {os.cpu_count()} CPUs; load average {os.getloadavg()}; work {work}",
          flush=True)
    report = [f"# Native noise kernel, end to end ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
              "", f"Command: `{' '.join(shlex.quote(a) for a in [Path(py).name, *sys.argv])}`; "
              f"{os.cpu_count()} CPUs shared with other jobs; load average at start "
              f"{os.getloadavg()[0]:.2f}.", ""]

    demo_runs: list[dict[str, Any]] = []
    for pair in range(args.first_pair, args.first_pair + args.demo_pairs):
        for native in ((True, False) if pair % 2 == 0 else (False, True)):
            tag = f"demo_p{pair}_{'on' if native else 'off'}"
            storage = work / tag
            ray_tmp = Path(tempfile.mkdtemp(prefix="nkray", dir="/tmp"))
            cmd = [py, "-c", DEMO_CHILD, str(args.seed + pair), str(storage), str(ray_tmp),
                   "1" if args.quick_demo else "0"]
            r = run_one(cmd, native, work / f"{tag}.log")
            used = [ln.split()[1] for ln in r["text"].splitlines()
                    if ln.startswith("NATIVE_IN_WORKER")]
            r["used"] = used[0] if used else "?"
            fin = [ln.strip() for ln in r["text"].splitlines() if "Finished in" in ln or
                   "trials" in ln.lower()][:2]
            r["detail"] = "; ".join(fin)[:120].replace("|", "/")
            r["pair"] = pair
            demo_runs.append(r)
            print(f"{tag}: rc={r['rc']} wall={r['wall_s']:.1f}s cpu={r['cpu_s']:.1f}s "
                  f"native-in-worker={r['used']} orphans={r['orphans_reaped']}", flush=True)
    if demo_runs:
        report.append(summarise(f"Demo ({'quick' if args.quick_demo else 'full'} setting, "
                                f"secret seeds {args.seed + args.first_pair}.."
                                f"{args.seed + args.first_pair + args.demo_pairs - 1})",
                                demo_runs))

    pu_runs: list[dict[str, Any]] = []
    for pair in range(args.first_pair, args.first_pair + args.pu_pairs):
        for native in ((True, False) if pair % 2 == 0 else (False, True)):
            tag = f"pu_p{pair}_{'on' if native else 'off'}"
            out = work / tag
            cmd = [py, str(HERE / "privacy_utility.py"), *shlex.split(args.pu_args),
                   "--out", str(out)]
            r = run_one(cmd, native, work / f"{tag}.log")
            r["pair"] = pair
            rows = []
            for f in out.glob("*_runs.jsonl"):
                rows += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
            train = sum(float(x.get("wall_s") or 0.0) for x in rows)
            r["detail"] = f"{len(rows)} searches, Σ search wall {train:.1f} s"
            r["used"] = "see note"
            pu_runs.append(r)
            print(f"{tag}: rc={r['rc']} wall={r['wall_s']:.1f}s cpu={r['cpu_s']:.1f}s "
                  f"{r['detail']}", flush=True)
    if pu_runs:
        report.append(summarise(f"Privacy-utility benchmark (`{args.pu_args}`)", pu_runs))
        report.append("The privacy-utility workers are this runner's children and inherit "
                      "RAYDP_HPO_NATIVE_NOISE; each draws noise in process (one torch thread "
                      "per worker).\n")
    if args.draw_check:
        report.append(draw_check())
    text = "\n".join(report)
    print(text, flush=True)
    (args.out / "end_to_end.md").write_text(text + "\n")
    (args.out / "end_to_end_runs.json").write_text(json.dumps(
        [{k: v for k, v in r.items() if k != "text"} for r in demo_runs + pu_runs], indent=1)
        + "\n")
    return 0 if all(r["rc"] == 0 for r in demo_runs + pu_runs) else 1


if __name__ == "__main__":
    sys.exit(main())
