"""``raydp-hpo report RUN_DIR``: the certificate, plots and a markdown summary of a run.

Inputs (all in the run dir ``<storage_path>/<experiment>`` written by ``raydp-hpo run``):

* ``public/release.json`` — the public release with its certificate (public; older run dirs:
  ``release.json``);
* ``evaluation_private.json`` — the released model's unnoised test accuracy (private: not
  covered by the certificate; shown in its own section of the report, so the report is a
  private artefact as a whole; older run dirs kept it in ``release.json``);
* the ledger journal (path in ``run.json``; default ``ledger.journal``) — replayed in order,
  recomputing ε after each charge under RDP (fixed sequence), the adaptive RDP filter and
  PLD: ``budget_over_time.png``. For a shared ledger the journal holds every experiment on the
  dataset: the plot shows the dataset's spend, this experiment's charges marked;
* ``tune/**/result.json`` — Tune's per-trial results: ``trials_accuracy_vs_epsilon.png``,
  marked **private artefact** (per-trial metrics and the number of trials are not covered by
  the guarantee; never publish it).

Outputs ``report.md`` next to the PNGs (in ``RUN_DIR/report`` by default).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydp_hpo.errors import RayDPHPOError

__all__ = ["SpendPoint", "replay_spend", "read_trials", "write_report", "ReportFiles"]

PRIVATE_MARK = "PRIVATE ARTEFACT: per-trial results are not covered by the certificate"


@dataclass(frozen=True)
class SpendPoint:
    """ε of the journal's first ``seq`` charges at the ledger's δ, per accountant."""

    seq: int
    time: float
    charge_id: str
    owner: str
    epsilon: dict[str, float]


@dataclass(frozen=True)
class ReportFiles:
    markdown: Path
    budget_plot: Path
    trials_plot: Path | None


def replay_spend(journal: str | Path) -> tuple[Any, list[SpendPoint]]:
    """Replay a ledger journal charge by charge: (budget, ε after each charge).

    Uses a journal-less :class:`PrivacyLedger` (fixed-plan halting on a very large budget, so
    every recorded charge is admitted again in order) and its report, which gives the RDP,
    adaptive-RDP-filter and PLD figures at the journal's δ; a dataset ledger's journal
    (``Adaptivity.EXPERIMENTS``) is replayed under its own rule, whose report adds the basic
    composition of the experiments' points and the RDP filter at its δ share (its journal's
    δ split).
    """
    from raydp_hpo.accounting.accountants import Accountant
    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.accounting.mechanisms import mechanism_from_dict
    from raydp_hpo.ledger.filter import Adaptivity, PrivacyLedger
    from raydp_hpo.ledger.journal import read_journal

    header, records = read_journal(journal)
    if header is None:
        raise RayDPHPOError(f"no ledger journal at {journal}")
    budget = PrivacyBudget.from_dict(header["budget"])
    experiments = header.get("adaptivity") == Adaptivity.EXPERIMENTS.value
    from raydp_hpo.ledger.experiments import split_of_header

    replay = PrivacyLedger(PrivacyBudget(1e12, budget.delta), None,
                           adaptivity=Adaptivity.EXPERIMENTS if experiments
                           else Adaptivity.FIXED_PLAN,
                           accountant=Accountant.TIGHTEST if experiments else Accountant.RDP,
                           delta_split=split_of_header(header) if experiments else None)
    points = [SpendPoint(0, float(header.get("created", records[0]["time"] if records else 0.0)),
                         "", "", {"rdp": 0.0, "rdp_filter": 0.0, "pld": 0.0})]
    for rec in records:
        if rec.get("kind") == "release":  # a run's release marker: it charges nothing
            continue
        replay.charge(rec["charge_id"], mechanism_from_dict(rec["mechanism"]), rec.get("owner", ""))
        eps = dict(replay.report().epsilon_by_accountant)
        eps.pop("pure", None)
        points.append(SpendPoint(int(rec["seq"]), float(rec["time"]), rec["charge_id"],
                                 rec.get("owner", ""), eps))
    return budget, points


def read_trials(tune_dir: Path) -> list[dict[str, Any]]:
    """Per-trial result histories from Tune's experiment dir (a private artefact)."""
    trials = []
    for path in sorted(tune_dir.rglob("result.json")):
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        if rows:
            trials.append({"trial_id": rows[-1].get("trial_id", path.parent.name), "rows": rows})
    return trials


def _plot_budget(budget: Any, points: list[SpendPoint], prefix: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = points[0].time if points else 0.0
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    styles = {"rdp_filter": ("RDP filter (adaptive halting rule)", "tab:red"),
              "rdp": ("RDP (fixed sequence)", "tab:blue"),
              "pld": ("PLD (fixed sequence)", "tab:green"),
              "basic_composition": ("basic composition of the experiments' points "
                                    "(dataset ledger)", "tab:purple"),
              "rdp_filter_split_delta": ("RDP filter at its δ share (rule A)", "tab:orange")}
    xs = [p.time - t0 for p in points]
    for key, (label, colour) in styles.items():
        ys = [p.epsilon.get(key, math.nan) for p in points]
        if any(math.isfinite(y) and y > 0 for y in ys):
            ax.step(xs, ys, where="post", label=label, color=colour, linewidth=2)
            ax.plot(xs, ys, "o", color=colour, markersize=4)
    ax.axhline(budget.epsilon, color="black", linestyle="--", label=f"budget ε={budget.epsilon:g}")
    for p, x in zip(points[1:], xs[1:]):
        if p.charge_id.startswith(prefix):  # this run's charges (run.json's charge_prefix)
            ax.axvline(x, color="grey", alpha=0.25, linewidth=1)
    ax.set_xlabel("seconds since the ledger was created")
    ax.set_ylabel(f"ε spent at δ={budget.delta:g}")
    ax.set_title(f"Ledger spend over time ({len(points) - 1} charge(s); grey: this experiment's)")
    ax.set_ylim(0, budget.epsilon * 1.1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _trial_epsilon(row: dict[str, Any]) -> float | None:
    """A trial result's own RDP ε (``trial_epsilon_rdp``; ``epsilon`` in runs before the
    rename), or ``None``."""
    from raydp_hpo.trial.privacy import TRIAL_EPSILON_KEY

    value = row.get(TRIAL_EPSILON_KEY, row.get("epsilon"))
    return None if value is None else float(value)


def _plot_trials(trials: list[dict[str, Any]], metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for i, trial in enumerate(trials):
        points = [(eps, r[metric]) for r in trial["rows"]
                  if metric in r and (eps := _trial_epsilon(r)) is not None]
        if not points:
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", markersize=4,
                label=f"trial {i + 1}", alpha=0.8)
    ax.set_xlabel("ε of the trial's own training so far (not the search's cost)")
    ax.set_ylabel(metric)
    ax.set_title("Trials: validation score against ε")
    ax.grid(alpha=0.3)
    if len(trials) <= 12:
        ax.legend(fontsize=7, loc="lower right")
    fig.text(0.5, 0.5, "PRIVATE ARTEFACT", fontsize=40, color="red", alpha=0.15,
             ha="center", va="center", rotation=20)
    fig.suptitle(PRIVATE_MARK, color="red", fontsize=9, y=0.995)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _fmt(value: Any) -> str:
    return "-" if value is None else (f"{value:.4f}" if isinstance(value, float) else str(value))


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> ReportFiles:
    """Write ``report.md``, ``budget_over_time.png`` and (if there are trial results)
    ``trials_accuracy_vs_epsilon.png`` for the run in ``run_dir``."""
    from raydp_hpo.tune.publish import find_release

    run = Path(run_dir).expanduser().resolve()
    release_path = find_release(run)  # public/release.json (older run dirs: release.json)
    if release_path is None:
        raise RayDPHPOError(f"{run} is not a finished run dir (no release.json in public/)")
    release = json.loads(release_path.read_text(encoding="utf-8"))
    evaluation_path = run / "evaluation_private.json"
    evaluation = (json.loads(evaluation_path.read_text(encoding="utf-8"))
                  if evaluation_path.is_file() else release.get("evaluation") or {})
    meta: dict[str, Any] = {}
    if (run / "run.json").is_file():
        meta = json.loads((run / "run.json").read_text(encoding="utf-8"))
    experiment = meta.get("experiment", run.name)
    journal = Path(meta.get("ledger_journal") or run / "ledger.journal")
    metric = (meta.get("spec") or {}).get("search", {}).get("metric", "val_accuracy")
    out = Path(out_dir).expanduser().resolve() if out_dir else run / "report"
    out.mkdir(parents=True, exist_ok=True)

    budget, points = replay_spend(journal)
    budget_png = out / "budget_over_time.png"
    _plot_budget(budget, points, str(meta.get("charge_prefix") or f"{experiment}/"), budget_png)
    trials = read_trials(run / "tune") if (run / "tune").is_dir() else []
    trials_png: Path | None = None
    if trials:
        trials_png = out / "trials_accuracy_vs_epsilon.png"
        _plot_trials(trials, metric, trials_png)

    cert = release["certificate"]
    eps = cert["epsilon"]
    certified = eps.get("certified", eps.get("best"))  # "best" in releases before the rename
    certified_by = eps.get("certified_accountant", "the smallest figure below")
    lines = [
        f"# raydp-hpo report: {experiment}",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} from `{run}`.",
        "",
        "## Public release (covered by the certificate)",
        "",
        f"- budget exhausted during the search: {release.get('budget_exhausted')}",
        "",
        "| hyperparameter | value |",
        "| --- | --- |",
    ]
    for key, value in sorted((release.get("hyperparameters") or {}).items()):
        lines.append(f"| {key} | `{json.dumps(value)}` |")
    if not release.get("hyperparameters"):
        lines.append("| (nothing released) | |")
    dp_test = release.get("dp_test_accuracy")
    if dp_test:
        lines += ["", f"- test accuracy of the released model (DP, Laplace ε = "
                      f"{dp_test['epsilon']:g}, in the certificate): {dp_test['value']:.4f}"]
    lines += [
        "",
        "## Evaluation (NOT covered by the certificate; from evaluation_private.json)",
        "",
        "- test accuracy of the released model: "
        f"{_fmt(evaluation.get('test_accuracy'))} — computed without "
        "noise on the private test split; publish it only if that split is public.",
        "",
        "## Privacy certificate",
        "",
        f"- algorithm: {cert['algorithm']}",
        f"- paper: {cert['paper']}",
        f"- accounting: {cert['description']}",
        f"- budget: ε = {cert['budget']['epsilon']:g}, δ = {cert['budget']['delta']:g}",
        f"- **ε certified = {certified:.4f}** ({certified_by}; the ledger halts on "
        f"{cert['ledger']['halting_rule']}; ≤ budget: {certified <= cert['budget']['epsilon']})",
        f"- references: ε (RDP) = {eps['rdp']:.4f}, ε (PLD) = {eps['pld']:.4f}, "
        f"ε (profile) = {eps.get('profile', float('inf')):.4f}",
        f"- ledger: {cert['ledger']['name']} ({cert['ledger']['halting_rule']}), "
        f"ledger spent ε = {cert['ledger']['spent_epsilon']:.4f}",
        f"- privacy unit: {cert.get('privacy_unit', 'one record (add/remove)')}",
        *[f"- treated as public: {key}: {value}"
          for key, value in (cert.get("treated_as_public") or {}).items()],
        f"- charges of this experiment: {len(cert['charges'])}",
        "",
        "| charge id | mechanism |",
        "| --- | --- |",
    ]
    for charge in cert["charges"][:50]:
        lines.append(f"| {charge['charge_id']} | {charge['mechanism'].get('type', '?')} |")
    last = points[-1]
    lines += [
        "",
        "## Ledger spend over time",
        "",
        f"Journal `{journal}` replayed in order: {len(points) - 1} charges "
        f"(all experiments on this ledger). After the last charge: "
        + ", ".join(f"{k} ε = {v:.4f}" for k, v in last.epsilon.items())
        + f" at δ = {budget.delta:g}; ledger budget ε = {budget.epsilon:g}.",
        "",
        f"![budget over time]({budget_png.name})",
        "",
    ]
    if trials_png is not None:
        lines += [
            "## Trials (PRIVATE ARTEFACT — do not publish)",
            "",
            "Per-trial validation scores and the number of trials are **not** covered by the "
            "privacy guarantee; this plot is for the data owner only.",
            "",
            f"![trials]({trials_png.name})",
            "",
        ]
    md = out / "report.md"
    md.write_text("\n".join(lines), encoding="utf-8")
    return ReportFiles(markdown=md, budget_plot=budget_png, trials_plot=trials_png)
