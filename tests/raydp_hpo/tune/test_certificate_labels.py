"""The privacy certificate names the figure it certifies (the one the ledger's halting rule
stands behind) and marks the others as references (no Ray)."""

from __future__ import annotations

import pytest

from raydp_hpo.accounting.accountants import Accountant, epsilon
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import RandomStopping, StoppingDistribution, SubsampledGaussian
from raydp_hpo.tune.tuner import PrivacyCertificate

BUDGET = PrivacyBudget(3.0, 1e-5)
PLAN = RandomStopping(SubsampledGaussian(1.0, 0.01, 1000), StoppingDistribution.GEOMETRIC, 10)


def _cert(rule: str) -> PrivacyCertificate:
    return PrivacyCertificate(
        "random_stopping", "P&S 2022", "one plan charge", BUDGET, (("exp/plan", PLAN),),
        epsilon_rdp=epsilon(PLAN, 1e-5, Accountant.RDP),
        epsilon_pld=epsilon(PLAN, 1e-5, Accountant.PLD),
        ledger_name="l", ledger_spent_epsilon=2.84, ledger_halting_rule=rule,
        epsilon_profile=epsilon(PLAN, 1e-5, Accountant.TIGHTEST))


@pytest.mark.parametrize("rule", ["fixed_plan/tightest", "fixed_plan/profile"])
def test_fixed_plan_certifies_the_tightest_figure(rule: str) -> None:
    cert = _cert(rule)
    tightest = epsilon(PLAN, 1e-5)  # 2.8411; RDP 4.10, PLD 4.2
    assert cert.certified_accountant is Accountant.TIGHTEST
    assert cert.epsilon == pytest.approx(tightest, rel=1e-12) and cert.within_budget
    text = cert.format()
    assert "certified figure: tightest" in text
    assert f"ε (tightest)  {tightest:.4f}  certified, ≤ budget: True" in text
    assert f"ε (RDP)       {cert.epsilon_rdp:.4f}  (looser reference)" in text
    assert f"ε (PLD)       {cert.epsilon_pld:.4f}  (looser reference)" in text
    assert "(reference; the certified minimum)" in text  # the profile figure gives it
    eps = cert.to_dict()["epsilon"]
    assert eps["certified"] == eps["best"] == cert.epsilon
    assert eps["certified_accountant"] == "tightest"


def test_adaptive_rdp_filter_certifies_rdp_only() -> None:
    """Under the adaptive RDP filter the PLD and profile figures hold only for a plan fixed in
    advance: the certificate states RDP's (it printed the smaller profile figure as the
    released ε before)."""
    cert = _cert("adaptive/rdp")
    assert cert.certified_accountant is Accountant.RDP
    assert cert.epsilon == cert.epsilon_rdp > cert.epsilon_profile
    assert not cert.within_budget  # 4.10 > 3: the RDP figure is what the filter admits on
    text = cert.format()
    assert f"ε (RDP)       {cert.epsilon_rdp:.4f}  certified, ≤ budget: False" in text
    assert "ε (tightest)" not in text
    assert text.count("reference only: valid for a fixed plan, not for adaptive charges") == 2
    eps = cert.to_dict()["epsilon"]
    assert eps["certified"] == cert.epsilon_rdp and eps["certified_accountant"] == "rdp"
