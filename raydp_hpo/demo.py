"""``raydp-hpo demo``: the main job on the built-in default.

An accounting walkthrough on real settings (MNIST-scale DP-SGD): calibrate noise for one
trial, price a Papernot–Steinke random-stopping search and a Koskela–Kulkarni subsampled
search against one total budget, and run a journaled privacy ledger that admits the plan and
refuses what does not fit — leaving the ledger unchanged.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from raydp_hpo.accounting import Accountant, calibrate_noise, epsilon
from raydp_hpo.budget import PrivacyBudget
from raydp_hpo.ledger import Adaptivity, PrivacyLedger
from raydp_hpo.mechanisms import (
    RandomStopping,
    StoppingDistribution,
    SubsampledGaussian,
    SubsampledTuning,
)

__all__ = ["run_demo"]


def _row(name: str, mech, delta: float) -> str:  # type: ignore[no-untyped-def]
    rdp = epsilon(mech, delta, Accountant.RDP)
    pld = epsilon(mech, delta, Accountant.PLD)
    return f"  {name:<46} RDP ε={rdp:7.3f}   PLD ε={pld:7.3f}"


def run_demo(*, quick: bool = False) -> int:
    budget = PrivacyBudget(epsilon=3.0, delta=1e-5)
    n, batch, epochs = 60_000, 256, 5 if quick else 20
    q = batch / n
    steps = round(epochs / q)
    print(f"Total budget: ε={budget.epsilon}, δ={budget.delta}  (n={n}, batch={batch}, {epochs} epochs)")

    sigma_one = calibrate_noise(budget.epsilon, budget.delta, q, steps)
    print(f"\n1. One training run at the whole budget needs σ = {sigma_one:.3f}")
    print(_row("DP-SGD trial", SubsampledGaussian(sigma_one, q, steps), budget.delta))

    trials = 10
    print(f"\n2. Naively tuning {trials} such trials composes to:")
    print(_row(f"{trials} × DP-SGD trial", [SubsampledGaussian(sigma_one, q, steps)] * trials,
               budget.delta))

    def search(sigma: float) -> RandomStopping:
        return RandomStopping(SubsampledGaussian(sigma, q, steps), StoppingDistribution.GEOMETRIC,
                              trials)

    lo, hi = sigma_one, sigma_one * 8
    for _ in range(30):
        mid = (lo + hi) / 2
        if epsilon(search(mid), budget.delta, Accountant.RDP) > budget.epsilon:
            lo = mid
        else:
            hi = mid
    print(f"\n3. Papernot–Steinke random stopping (geometric K, E[K]={trials}) fits with σ = {hi:.3f}")
    print(_row("random stopping, whole search", search(hi), budget.delta))

    sub_q = 0.1
    kk = SubsampledTuning(search(hi), SubsampledGaussian(hi, q, steps), sub_q)
    print(f"\n4. Koskela–Kulkarni: tune on a {sub_q:.0%} Poisson subsample, final run on the rest")
    print(_row("subsampled tuning + final run", kk, budget.delta))
    saved = trials / (trials * sub_q + 1)
    print(f"  gradient evaluations: ≈{saved:.1f}× fewer than random stopping on all data")

    with tempfile.TemporaryDirectory() as tmp:
        journal = Path(tmp) / "demo.journal"
        print(f"\n5. A journaled privacy ledger (adaptive RDP filter) at {journal.name}")
        with PrivacyLedger(budget, journal, adaptivity=Adaptivity.ADAPTIVE) as ledger:
            plan = search(hi * 1.2)
            decision = ledger.try_charge("search/plan", plan, owner="demo")
            print(f"  admit the search plan:        admitted={decision.admitted}  "
                  f"spent ε={ledger.spent():.3f}")
            before = journal.read_bytes()
            extra = SubsampledGaussian(sigma_one, q, steps)
            refused = ledger.try_charge("search/extra-trial", extra, owner="demo")
            print(f"  one more full-budget trial:   admitted={refused.admitted}  "
                  f"(would reach ε={refused.epsilon_after:.3f} > {budget.epsilon})")
            print(f"  ledger unchanged by refusal:  {journal.read_bytes() == before}")
            print("\n" + ledger.report().format())
    return 0
