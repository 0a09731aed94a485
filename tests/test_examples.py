"""Every ``examples/*.py`` runs with ``--smoke`` and prints its certificate; example (1)'s
certificate agrees with an independent computation of its plan by Google's dp_accounting;
each example's released model (a class of the example script) loads in a fresh Python process
that never imported the script (``raydp_hpo.load_released_model``).

The examples connect to the suite's one Ray session (``RAY_ADDRESS``, as under ``ray job
submit``) instead of each starting its own (34-46 s each before; 13-17 s each on a loaded
2-CPU machine after). The Ray Job example is ``slow`` (`make test-slow`, run by CI): the same
search as the others, and tests/cluster/test_job_submit.py submits it to a real head.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dp_accounting
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
DEFAULT = "own_mlp_parquet.py"
JOB_EXAMPLE = "ray_job_tuning.py"


def _run(script: Path, storage: Path) -> str:
    import ray

    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RAY_AUTH_MODE": "disabled", "PYTHONWARNINGS": "ignore",
           "RAY_ADDRESS": ray.get_runtime_context().gcs_address}  # the session's Ray
    done = subprocess.run([sys.executable, str(script), "--smoke", "--storage", str(storage)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "Privacy certificate" in done.stdout and "hyperparameters: {" in done.stdout
    _load_in_a_fresh_process(done.stdout, storage)
    return done.stdout


def _load_in_a_fresh_process(out: str, cwd: Path) -> None:
    """The model the example released loads in a new interpreter (run from ``cwd``, so the
    example script cannot be imported) and has parameters."""
    path = next(line for line in out.splitlines() if line.startswith("released model: "))[16:]
    assert path != "None", out[-2000:]
    code = ("import sys, raydp_hpo; m = raydp_hpo.load_released_model(sys.argv[1]); "
            "print('PARAMS', sum(p.numel() for p in m.parameters()))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", code, path], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split("PARAMS ")[1]) > 0


def test_the_four_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {DEFAULT, "own_cnn_digits.py", "own_text_model.py",
                                          "ray_job_tuning.py"}


@pytest.mark.ray
def test_example_1_certificate_matches_dp_accounting(tmp_path: Path, ray_session: None) -> None:
    out = _run(ROOT / "examples" / DEFAULT, tmp_path)
    plan = json.loads(next(line for line in out.splitlines() if line.startswith("PLAN "))[5:])
    per_trial = dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(
                plan["sample_rate"], dp_accounting.GaussianDpEvent(plan["sigma"])),
            plan["steps"]),
        dp_accounting.LaplaceDpEvent(1.0 / plan["score_epsilon"]),
    ])
    event = dp_accounting.SelfComposedDpEvent(per_trial, plan["trials"])
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(event)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(event)
    # tolerances: RDP orders grids differ (~0.5%); PLD discretisations differ (~1%)
    assert plan["epsilon_rdp"] == pytest.approx(rdp.get_epsilon(plan["delta"]), rel=0.02)
    assert plan["epsilon_certified"] == pytest.approx(pld.get_epsilon(plan["delta"]), rel=0.03)


@pytest.mark.ray
@pytest.mark.parametrize("script", [
    # the Ray Job example is also submitted to a real head by tests/cluster/test_job_submit.py
    pytest.param(p, marks=pytest.mark.slow) if p.name == JOB_EXAMPLE else p
    for p in EXAMPLES if p.name != DEFAULT], ids=lambda p: p.name)
def test_example_runs_with_smoke(script: Path, tmp_path: Path, ray_session: None) -> None:
    _run(script, tmp_path)
