"""The CLI, run in a real subprocess where it matters (exit codes, output)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import SubsampledGaussian
from raydp_hpo.cli.main import EXIT_BAD_INPUT, main
from raydp_hpo.ledger.filter import PrivacyLedger


def test_account_prints_each_accountant(capsys) -> None:
    rc = main(["account", "--noise-multiplier", "1.1", "--sample-rate", "0.0042667",
               "--steps", "14063", "--delta", "1e-5", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    eps = out["epsilon"]
    assert abs(eps["rdp_classic"] - 3.01) < 0.01  # Abadi et al.
    assert eps["tightest"] == min(eps["rdp"], eps["rdp_classic"], eps["pld"])


def test_pld_grid_is_bounded_for_every_valid_input() -> None:
    """`account --sample-rate 1 --noise-multiplier 1e-3` asked for ~23 GB (a 10⁹-point PLD
    grid) and was killed by the OOM killer: the grid step now grows so the grid stays bounded,
    and the result is still a pessimistic (upper) bound."""
    from raydp_hpo.accounting.mechanisms import Gaussian
    from raydp_hpo.accounting.pld import (
        MAX_PLD_POINTS,
        VALUE_DISCRETIZATION,
        discretisation_interval,
    )

    for realistic in (SubsampledGaussian(1.0, 0.01, 1000), SubsampledGaussian(0.5, 0.01, 10**5),
                      Gaussian(2.0, 1000)):
        assert discretisation_interval(realistic) == VALUE_DISCRETIZATION  # figures unchanged
    step = discretisation_interval(Gaussian(1e-3, 1000))
    assert 2 * 9 * 1000**0.5 / 1e-3 / step <= MAX_PLD_POINTS * (1 + 1e-12)


def test_account_near_noiseless_mechanism_answers_without_crash(capsys) -> None:
    """σ = 1e-3 (bounded grid) and σ = 1e-6 (no PLD in float range: inf, RDP applies)."""
    for sigma, finite_pld in (("1e-3", True), ("1e-6", False)):
        rc = main(["account", "--noise-multiplier", sigma, "--sample-rate", "1",
                   "--steps", "10", "--delta", "1e-5", "--json"])
        assert rc == 0
        eps = json.loads(capsys.readouterr().out)["epsilon"]
        assert (eps["pld"] != float("inf")) is finite_pld
        # exact Gaussian: μ = √10/σ-GDP; every figure is an upper bound, so ≥ a lower estimate
        assert eps["tightest"] >= 0.99 * (10 / float(sigma) ** 2) / 2


def test_account_prices_a_random_stopping_search_by_privacy_profiles(capsys) -> None:
    """KRW 2024's reference setting (digest): geometric E[K]=10 over σ=1, q=0.01, T=1000 at
    δ=1e-5 — profile ≈ 2.87 in the digest (we get 2.84), RDP (P&S) 4.10. (The geometric law
    is named: the default law is the truncated negative binomial, see the next test.)"""
    rc = main(["account", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "1000",
               "--delta", "1e-5", "--search", "random_stopping", "--mean", "10",
               "--distribution", "geometric", "--json"])
    assert rc == 0
    eps = json.loads(capsys.readouterr().out)["epsilon"]
    assert abs(eps["rdp"] - 4.10) < 0.01
    assert eps["profile"] <= 2.875 and eps["tightest"] == eps["profile"]
    assert main(["account", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10",
                 "--delta", "1e-5", "--search", "random_stopping"]) == EXIT_BAD_INPUT
    assert "--mean" in capsys.readouterr().err


def test_account_epsilon_inverts_for_one_dp_sgd_run(capsys) -> None:
    """`account --epsilon E` without --noise-multiplier: the smallest σ for the target, on the
    tightest valid figure by default (the same float as calibrate_noise), RDP on request."""
    from raydp_hpo.accounting.accountants import Accountant, calibrate_noise, epsilon

    argv = ["account", "--epsilon", "3", "--sample-rate", "0.02", "--steps", "1000",
            "--delta", "1e-5", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    sigma = out["noise_multiplier"]
    assert out["accountant"] == "tightest" and sigma == calibrate_noise(3.0, 1e-5, 0.02, 1000)
    assert out["epsilon"]["tightest"] <= 3.0 < out["epsilon"]["rdp"]  # RDP alone overshoots
    assert sigma == pytest.approx(1.1514, abs=2e-3)
    assert main([*argv, "--accountant", "rdp"]) == 0
    rdp = json.loads(capsys.readouterr().out)
    assert rdp["noise_multiplier"] == calibrate_noise(3.0, 1e-5, 0.02, 1000, Accountant.RDP)
    assert epsilon(SubsampledGaussian(rdp["noise_multiplier"], 0.02, 1000), 1e-5,
                   Accountant.RDP) <= 3.0


def test_account_epsilon_inverts_a_random_stopping_plan(capsys) -> None:
    """`account --epsilon E --search random_stopping`: the σ of the whole plan, under random
    stopping's default law (truncated negative binomial, η = 2) when no --distribution is
    given — the plan `search="random_stopping", search_kwargs={"mean": 10}` runs."""
    from raydp_hpo.accounting.mechanisms import RandomStopping, StoppingDistribution

    assert main(["account", "--epsilon", "3", "--sample-rate", "0.01", "--steps", "1000",
                 "--delta", "1e-5", "--search", "random_stopping", "--mean", "10"]) == 0
    text = capsys.readouterr().out
    assert "σ for the whole search within ε=3" in text and "σ = 0.993" in text
    assert "TRUNCATED_NEGATIVE_BINOMIAL" in text and "shape=2.0" in text
    assert main(["account", "--epsilon", "3", "--sample-rate", "0.01", "--steps", "1000",
                 "--delta", "1e-5", "--search", "random_stopping", "--mean", "10",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    plan = RandomStopping(SubsampledGaussian(out["noise_multiplier"], 0.01, 1000),
                          StoppingDistribution.TRUNCATED_NEGATIVE_BINOMIAL, 10, 2.0)
    from raydp_hpo.accounting.accountants import epsilon

    assert epsilon(plan, 1e-5) <= 3.0 and out["epsilon"]["profile"] <= 3.0
    assert out["noise_multiplier"] == pytest.approx(0.9932, abs=2e-3)
    # the geometric law named: its own, smaller σ (0.9731 before the default changed)
    assert main(["account", "--epsilon", "3", "--sample-rate", "0.01", "--steps", "1000",
                 "--delta", "1e-5", "--search", "random_stopping", "--mean", "10",
                 "--distribution", "geometric", "--json"]) == 0
    geometric = json.loads(capsys.readouterr().out)
    assert geometric["noise_multiplier"] == pytest.approx(0.9731, abs=2e-3)


def test_account_epsilon_wrong_combinations_exit_2(capsys) -> None:
    cases = [
        (["--epsilon", "3", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10",
          "--delta", "1e-5"], "not both"),
        (["--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10", "--delta", "1e-5",
          "--accountant", "rdp"], "--accountant"),
        (["--epsilon", "3", "--sample-rate", "0.01", "--delta", "1e-5"], "--steps"),
        (["--epsilon", "3", "--sample-rate", "0.01", "--steps", "10", "--delta", "1e-5",
          "--search", "random_stopping"], "--mean"),
        (["--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10", "--delta", "1e-5",
          "--distribution", "poisson"], "add --search random_stopping"),
        (["--epsilon", "-1", "--sample-rate", "0.01", "--steps", "10", "--delta", "1e-5"],
         "argument --epsilon: must be a finite number > 0, got '-1'"),
        (["--epsilon", "3", "--sample-rate", "0.01", "--steps", "10", "--delta", "1e-5",
          "--sensitivity", "1"], "--mechanism"),
        (["--mechanism", "laplace", "--epsilon", "1", "--accountant", "rdp"], "--accountant"),
    ]
    for argv, needle in cases:
        assert main(["account", *argv]) == EXIT_BAD_INPUT, argv
        assert needle in capsys.readouterr().err, argv


def test_account_bad_input_exit_code(capsys) -> None:
    rc = main(["account", "--noise-multiplier", "1.1", "--sample-rate", "1.5",
               "--steps", "10", "--delta", "1e-5"])
    assert rc == EXIT_BAD_INPUT
    assert "--sample-rate" in capsys.readouterr().err


def test_ledger_show_and_list_in_subprocess(tmp_path: Path) -> None:
    journal = tmp_path / "ledgers" / "ns" / "a.journal"
    with PrivacyLedger(PrivacyBudget(3.0, 1e-5), journal) as ledger:
        ledger.charge("exp/plan", SubsampledGaussian(2.0, 0.01, 100), owner="exp")
        spent = ledger.spent()
        # show works while the ledger is live (read-only replay, no lock)
        proc = subprocess.run(
            [sys.executable, "-m", "raydp_hpo.cli.main", "ledger", "show", str(journal), "--json"],
            capture_output=True, text=True, check=True,
        )
    report = json.loads(proc.stdout)
    assert report["spent_epsilon"] == spent
    assert report["charges"][0]["charge_id"] == "exp/plan"
    proc = subprocess.run(
        [sys.executable, "-m", "raydp_hpo.cli.main", "ledger", "list", str(tmp_path / "ledgers")],
        capture_output=True, text=True, check=True,
    )
    assert "a.journal" in proc.stdout


def test_ledger_show_missing_journal(tmp_path: Path, capsys) -> None:
    assert main(["ledger", "show", str(tmp_path / "nope")]) == EXIT_BAD_INPUT
    assert "no ledger journal" in capsys.readouterr().err


def test_ledger_list_without_argument_finds_the_ledgers_runs_create(tmp_path, monkeypatch,
                                                                    capsys) -> None:
    """`raydp-hpo run` puts dataset ledgers under ./raydp_results/ledgers by default; `ledger
    list` with no argument looked only under ~/.raydp_hpo and found nothing after a run."""
    monkeypatch.chdir(tmp_path)
    journal = tmp_path / "raydp_results" / "ledgers" / "data-digits-0123.journal"
    journal.parent.mkdir(parents=True)
    with PrivacyLedger(PrivacyBudget(4.0, 1e-5), journal) as ledger:
        ledger.charge("exp/plan", SubsampledGaussian(1.0, 0.01, 100))
    assert main(["ledger", "list"]) == 0
    assert "data-digits-0123.journal" in capsys.readouterr().out


def test_account_mechanism_calibrates_one_shot_releases(capsys) -> None:
    """`account --mechanism laplace|gaussian`: the noise of a one-shot release, the same float
    as raydp_hpo.accounting.calibration (pinned there against mpmath and dp-accounting)."""
    from raydp_hpo.accounting.calibration import calibrate_analytic_gaussian, gaussian_delta

    assert main(["account", "--mechanism", "laplace", "--epsilon", "0.5", "--sensitivity", "2",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scale"] == 4.0 and out["delta"] == 0.0 and out["classic_sigma"] is None

    assert main(["account", "--mechanism", "gaussian", "--epsilon", "0.5", "--delta", "1e-5",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scale"] == calibrate_analytic_gaussian(0.5, 1e-5)
    assert gaussian_delta(out["scale"], 0.5) <= 1e-5
    assert out["scale"] < out["classic_sigma"]  # classic √(2 ln(1.25/δ))/ε, valid for ε < 1

    assert main(["account", "--mechanism", "gaussian", "--epsilon", "1", "--delta", "1e-5"]) == 0
    text = capsys.readouterr().out
    assert "σ = 3.73064" in text  # 3.7306316… rounded *up* to 6 digits, never down
    assert "classic" not in text  # the classic formula is not valid at ε = 1


def test_account_mechanism_wrong_combinations_exit_2(capsys) -> None:
    cases = [
        (["--mechanism", "gaussian", "--epsilon", "1"], "--delta"),
        (["--mechanism", "laplace", "--epsilon", "1", "--delta", "1e-5"], "pure ε-DP"),
        (["--mechanism", "laplace"], "--epsilon"),
        (["--mechanism", "gaussian", "--epsilon", "1", "--delta", "1e-5", "--steps", "10"],
         "--steps"),
        (["--mechanism", "laplace", "--epsilon", "1", "--search", "random_stopping"], "--search"),
        (["--mechanism", "laplace", "--epsilon", "1", "--distribution", "poisson"],
         "--search/--mean/--distribution/--shape"),
        (["--epsilon", "1", "--delta", "1e-5"], "--mechanism"),
        (["--noise-multiplier", "1", "--delta", "1e-5"], "--sample-rate, --steps"),
        (["--mechanism", "gaussian", "--epsilon", "0", "--delta", "1e-5"], "--epsilon: must be a finite number > 0, got '0'"),
        (["--mechanism", "laplace", "--epsilon", "1", "--sensitivity", "nan"],
         "--sensitivity: must be a finite number > 0, got 'nan'"),
    ]
    for argv, needle in cases:
        assert main(["account", *argv]) == EXIT_BAD_INPUT, argv
        assert needle in capsys.readouterr().err, argv


def test_federated_subcommand_runs_the_federated_trainer(capsys) -> None:
    """`raydp-hpo federated ...` passes its options to raydp_hpo.trainables.federated.main, and leaves
    the process's torch thread count as it found it (a later bit-exact reproducibility test
    in the same process failed when it stayed at 1)."""
    import torch

    threads = torch.get_num_threads()
    assert main(["federated", "--dataset", "digits", "--rounds", "1", "--clients", "2"]) == 0
    assert "round    1" in capsys.readouterr().out
    assert torch.get_num_threads() == threads
