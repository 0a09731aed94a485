"""``benchmarks/defaults_study.py`` and ``make_tabular_task.py`` without training: the tabular
task is the pre-registered table, an interrupted chunk resumes without redoing a search, every
setting of the grid is one its searcher accepts, and the decision rule is the one written in
the pre-registration."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import defaults_study as ds  # noqa: E402
import make_tabular_task as tabular  # noqa: E402


def test_tabular_task_is_deterministic_and_the_preregistered_table(tmp_path: Path) -> None:
    manifest = json.loads((ds.OUT / "tabular_task" / "manifest.json").read_text())
    assert manifest["parameters"] == tabular.PARAMETERS
    first, second = tabular.generate(), tabular.generate()
    for name, lo, hi in tabular.SPLITS:
        x, y = first[name]
        assert x.shape == (hi - lo, 20) and y.shape == (hi - lo,)
        assert tabular.digest(x, y) == tabular.digest(*second[name])
        assert tabular.digest(x, y) == manifest["splits"][name]["sha256"]
    # what the study loads from Parquet is that table, with the public sizes declared
    data = ds.load("tabular", tabular_dir=tmp_path)
    assert data.declared_sizes is not None and data.declared_sizes.train == 4200
    assert tabular.digest(data.test.features, data.test.labels) == \
        manifest["splits"]["test"]["sha256"]


def test_resume_skips_finished_keys_and_reruns_only_crashes_when_asked(tmp_path: Path) -> None:
    path = ds.chunk_path(tmp_path, "digits", 3.0)
    path.parent.mkdir(parents=True)
    rows = [{"dataset": "digits", "epsilon": 3.0, "setting": "oracle", "seed": 42000,
             "status": "ok", "test_accuracy": 0.9},
            {"dataset": "digits", "epsilon": 3.0, "setting": "grid4", "seed": 42000,
             "status": "refused"},
            {"dataset": "digits", "epsilon": 3.0, "setting": "rs_geom_k10", "seed": 42000,
             "status": "error", "reason": "boom"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"dataset": "dig')  # cut
    done = ds.read_rows(path)
    assert len(done) == 3
    jobs = [(s, seed) for s in ("oracle", "grid4", "rs_geom_k10") for seed in (42000, 42001)]
    assert ds.pending(jobs, done) == [("oracle", 42001), ("grid4", 42001),
                                      ("rs_geom_k10", 42001)]
    assert ("rs_geom_k10", 42000) in ds.pending(jobs, done, retry_errors=True)
    rerun = {**rows[2], "status": "ok", "test_accuracy": 0.8}
    assert ds.latest([*done, rerun])[-1]["status"] == "ok"
    assert len(ds.latest([*done, rerun])) == 3
    # oracle and one-shot first within a seed, seed by seed
    assert ds.order([("grid4", 2), ("one_shot_random", 2), ("oracle", 1)])[0] == ("oracle", 1)


def test_preregistered_seeds_and_grid() -> None:
    assert ds.GRID_SEEDS[3.0] == tuple(range(42000, 42020))
    assert ds.GRID_SEEDS[1.0] == ds.GRID_SEEDS[8.0] == tuple(range(42000, 42010))
    assert not set(ds.CONFIRM_SEEDS) & set(ds.GRID_SEEDS[3.0])
    laws = {s.kwargs.get("distribution") for s in ds.SETTINGS.values()
            if s.family == "random_stopping"}
    assert laws == {"geometric", "truncated_negative_binomial", "poisson", "logarithmic"}
    assert [n for n, s in ds.SETTINGS.items() if s.shipped_default] == ["rs_geom_k10",
                                                                       "ls_refined"]


@pytest.mark.parametrize("name", [n for n, s in ds.SETTINGS.items() if s.searcher])
def test_every_setting_is_accepted_by_its_searcher(name: str) -> None:
    from raydp_hpo.searchers import _CLASSES, SearchAlgorithm, check_search_settings
    from raydp_hpo.searchers.base import resolve_preset

    setting = ds.SETTINGS[name]
    cls = _CLASSES[SearchAlgorithm(setting.searcher)]
    size = ds.sizing()
    for dataset in ds.DATASETS:
        for eps in ds.EPSILONS:
            space, kwargs = ds.setup(setting, size, dataset, eps)
            check_search_settings(setting.searcher, kwargs)
            resolve_preset(cls, kwargs)
            assert ("lr" in space) == (setting.space != "full_batch")


@pytest.mark.parametrize("dataset", ds.CLI_DATASETS)
def test_cli_check_files_parse(dataset: str, tmp_path: Path) -> None:
    from raydp_hpo.cli.experiment import parse_experiment

    for name in ds.CLI_SETTINGS:
        raw = ds.experiment_file(dataset, 3.0, ds.SETTINGS[name], 42000, tmp_path / "runs",
                                 tabular_dir=tmp_path / "tab")
        spec = parse_experiment(raw)
        assert spec.budget.epsilon == 3.0 and spec.ledger is None  # the dataset's own ledger


def _rows(accs: dict[str, dict[str, list[float]]], evals: dict[str, float],
          refused: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    out = []
    for dataset, per in accs.items():
        for name, values in per.items():
            for seed, acc in enumerate(values):
                status = "refused" if name in refused else "ok"
                out.append({"dataset": dataset, "epsilon": 3.0, "setting": name, "seed": seed,
                            "status": status, "test_accuracy": acc if status == "ok" else None,
                            "gradient_evaluations": evals[name],
                            "trials": max(1, round(evals[name]))})
    return out


def test_decision_rule_is_the_worst_dataset_low_tail_then_compute() -> None:
    base = {"one_shot_random": [0.5] * 10, "oracle": [0.9] * 10}
    evals = {"one_shot_random": 1.0, "oracle": 7.0, "rs_geom_k10": 10.0, "rs_tnb2_k20": 20.0,
             "rs_geom_k40": 40.0, "ls_refined": 7.0, "grid4": 4.0}
    # rs_geom_k10: best mean but a fat low tail on tabular; rs_tnb2_k20: steady
    accs = {d: {**base,
                "rs_geom_k10": [0.9] * 8 + [0.3, 0.1] if d == "tabular" else [0.9] * 10,
                "rs_tnb2_k20": [0.84] * 10,
                "rs_geom_k40": [0.9] * 10,   # best, but over the compute cap of 25
                "ls_refined": [0.83] * 10,   # within the tie margin of tnb20 and cheaper
                "grid4": [0.9] * 10}         # refused: inapplicable
            for d in ("mnist1d", "digits", "tabular")}
    stats = ds.cell_stats(_rows(accs, evals, refused=("grid4",)))
    s = stats[("tabular", 3.0, "rs_geom_k10")]
    assert s["rerr"] == pytest.approx((0.76 - 0.5) / 0.4)
    # per-seed RERR −1, −0.5, 1, ...: the 10th percentile interpolates the two lowest
    assert s["q10"] == pytest.approx(-1.0 + 0.9 * 0.5)
    assert s["worst_seed"] == pytest.approx(-1.0)
    assert s["collapses"] == 1  # 0.1 ≤ 1/5 + 0.05 on the 5-class task; 0.3 is not
    assert s["G"] == pytest.approx(10.0)
    assert ds.scores(stats, "rs_tnb2_k20", 3.0) == pytest.approx(0.85)
    winner, scored = ds.choose(stats, ["rs_geom_k10", "rs_tnb2_k20", "rs_geom_k40",
                                       "ls_refined", "grid4"], [3.0], ds.DEFAULT_CAP)
    # grid4 refused, rs_geom_k40 over the cap: ineligible; rs_geom_k10 last on its tail
    assert [c["setting"] for c in scored] == ["rs_tnb2_k20", "ls_refined", "rs_geom_k10"]
    assert winner == "ls_refined"  # tie within 0.05, less compute
    winner, _ = ds.choose(stats, ["rs_geom_k10", "rs_tnb2_k20", "rs_geom_k40"], [3.0],
                          math.inf)
    assert winner == "rs_geom_k40"  # no cap: the steady best wins; k10's tail excludes it


def test_epsilon_bands() -> None:
    assert [ds.epsilon_band(e) for e in (0.5, 1.7, 1.8, 4.8, 5.0, 16)] == [1, 1, 3, 3, 8, 8]


def test_report_writes_the_table_the_decisions_and_the_auto_table(tmp_path: Path) -> None:
    evals = {"one_shot_random": 1.0, "oracle": 7.0, "rs_tnb2_k20": 20.0, "ls_refined": 7.0}
    accs = {d: {"one_shot_random": [0.5, 0.6], "oracle": [0.9, 0.9],
                "rs_tnb2_k20": [0.85, 0.8], "ls_refined": [0.88, 0.86]}
            for d in ds.DATASETS}
    rows = _rows(accs, evals)
    runs = tmp_path / "runs"
    runs.mkdir()
    for eps in ds.EPSILONS:
        (runs / f"x_eps{eps:g}.jsonl").write_text(
            "".join(json.dumps({**r, "epsilon": eps}) + "\n" for r in rows))
    (runs / "cli_digits_eps3.jsonl").write_text("".join(
        json.dumps({**r, "path": "cli"}) + "\n" for r in rows
        if r["dataset"] == "digits" and r["setting"] == "ls_refined"))
    assert ds.main(["report", "--out", str(tmp_path)]) == 0
    decisions = (tmp_path / "decisions.md").read_text()
    assert "Package default (cap G ≤ 25): **ls_refined**" in decisions
    assert "digits ε=3 ls_refined: CLI 0.8700" in decisions and "→ inside" in decisions
    doc = json.loads((tmp_path / "auto_table.json").read_text())
    assert doc["provisional"] is True  # two seeds per cell: not the pre-registered grid
    assert doc["searches"] == {f"{d}/eps{e:g}": 8 for d in ds.DATASETS for e in ds.EPSILONS}
    table = doc["rows"]
    assert len(table) == len(ds.EPSILONS) * len(ds.COMPUTE_BANDS) * len(ds.SPACE_CLASSES)
    row = next(r for r in table if r["epsilon_band"] == 3.0 and r["compute_limit"] == "inf"
               and r["space_class"] == "lr_only")
    assert row["setting"] == "ls_refined" and row["runner_up"] == "rs_tnb2_k20"
    other = next(r for r in table if r["epsilon_band"] == 3.0 and r["compute_limit"] == "inf"
                 and r["space_class"] == "other")
    assert other["setting"] == "rs_tnb2_k20"  # linear scaling needs an lr-only space
    assert other["expected_trials"] == 20  # the trials it ran (the rows say 20)
    # the package reads the table the report wrote, and picks these rows from it
    from ray import tune

    from raydp_hpo.searchers.auto import choose_auto, load_auto_table

    loaded = load_auto_table(tmp_path / "auto_table.json")
    base = {"epochs": 15, "sample_rate": 0.1}
    assert choose_auto(3.0, {**base, "lr": tune.loguniform(1e-3, 10)}, table=loaded
                       ).setting == "ls_refined"
    assert choose_auto(3.0, {**base, "lr": tune.loguniform(1e-3, 10),
                             "momentum": tune.uniform(0, 1)}, table=loaded
                       ).setting == "rs_tnb2_k20"
    assert "| tabular | 3 | ls_refined | 2 |" in (tmp_path / "results_table.md").read_text()


def test_a_shipped_default_stays_within_the_tie_margin() -> None:
    evals = {"one_shot_random": 1.0, "oracle": 7.0, "rs_geom_k10": 10.0, "rs_geom_k5": 5.0,
             "rs_tnb2_k20": 20.0}

    def stats_with(k10: float) -> Any:
        accs = {d: {"one_shot_random": [0.5] * 10, "oracle": [0.9] * 10,
                    "rs_geom_k10": [k10] * 10, "rs_geom_k5": [0.845] * 10,
                    "rs_tnb2_k20": [0.86] * 10} for d in ds.DATASETS}
        return ds.cell_stats([{**r, "epsilon": e} for e in ds.EPSILONS
                              for r in _rows(accs, evals)])

    # scores: tnb20 0.9, k10 0.875, k5 0.8625: all within 0.05, the rule takes the cheapest
    stats = stats_with(0.85)
    assert ds.choose(stats, ["rs_geom_k10", "rs_geom_k5", "rs_tnb2_k20"], ds.EPSILONS,
                     ds.DEFAULT_CAP)[0] == "rs_geom_k5"
    # ... but the shipped k10 is within the margin of that winner: it stays the default
    assert ds.family_default(stats, "random_stopping")[0] == "rs_geom_k10"
    # a shipped default far behind (score 0.5) is replaced
    assert ds.family_default(stats_with(0.7), "random_stopping")[0] == "rs_geom_k5"


def test_install_auto_table_copies_the_report_into_the_package(tmp_path: Path,
                                                               monkeypatch) -> None:
    evals = {"one_shot_random": 1.0, "oracle": 7.0, "ls_refined": 7.0}
    accs = {d: {"one_shot_random": [0.5, 0.6], "oracle": [0.9, 0.9], "ls_refined": [0.88, 0.86]}
            for d in ds.DATASETS}
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "x_eps3.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in _rows(accs, evals)))
    target = tmp_path / "package" / "auto_table.json"
    target.parent.mkdir()
    monkeypatch.setattr(ds, "PACKAGED_AUTO_TABLE", target)
    page = tmp_path / "page.md"
    _, start, end = ds.DOCS_AUTO_TABLE
    page.write_text(f"before\n{start}\nold table\n{end}\nafter\n")
    monkeypatch.setattr(ds, "DOCS_AUTO_TABLE", (page, start, end))
    assert ds.main(["report", "--out", str(tmp_path)]) == 0
    assert not target.exists()  # only when asked
    assert ds.main(["report", "--out", str(tmp_path), "--install-auto-table"]) == 0
    assert target.read_text() == (tmp_path / "auto_table.json").read_text()
    shown = page.read_text()  # and the docs' copy, between its markers
    assert shown.startswith(f"before\n{start}\n| ε band | space | ∞ |")
    assert shown.endswith(f"{end}\nafter\n") and "old table" not in shown
    assert "| 3 | `lr_only` | ls_refined (" in shown and "**Provisional**" in shown


def test_the_docs_show_the_packaged_table() -> None:
    """docs/how-to/dptuner.md's table is the one search='auto' reads (rendered from it)."""
    page, start, end = ds.DOCS_AUTO_TABLE
    text = page.read_text(encoding="utf-8")
    shown = text[text.index(start) + len(start):text.index(end)].strip()
    document = json.loads(ds.PACKAGED_AUTO_TABLE.read_text(encoding="utf-8"))
    assert shown == ds.auto_table_markdown(document)


def _committed_runs() -> list[Path]:
    """The grid's runs files committed to git (not those of a study still running)."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(ds.ROOT), "ls-files", "--",
                              "benchmarks/results/defaults_study/runs"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [ds.ROOT / line for line in out.splitlines() if line.endswith(".jsonl")
            and not Path(line).name.startswith(("cli_", "confirm_"))]


def test_the_packaged_auto_table_is_the_report_of_the_committed_runs() -> None:
    """search='auto' is reproducible from the study: the table shipped in the package is
    exactly what ``defaults_study.py report`` computes from the committed runs."""
    files = _committed_runs()
    if not files:
        pytest.skip("no defaults-study runs are committed yet (the packaged table is "
                    "provisional until the lead commits them with the final table)")
    rows = ds.latest(r for p in files for r in ds.read_rows(p))
    want = json.loads(json.dumps(ds.auto_table_document(ds.cell_stats(rows), rows)))
    assert json.loads(ds.PACKAGED_AUTO_TABLE.read_text()) == want, (
        "raydp_hpo/searchers/auto_table.json is not the report of the committed runs: run "
        "'python benchmarks/defaults_study.py report --install-auto-table'")


@pytest.mark.parametrize("name", [n for n, s in ds.SETTINGS.items() if s.searcher is not None])
def test_every_setting_is_one_the_package_table_accepts(name: str) -> None:
    """Whatever the study picks, search='auto' can run it: its package-form settings are
    ones its searcher takes (the relative ones resolved), and its family applies to the
    space classes the study lets it win (the package's APPLICABLE)."""
    from raydp_hpo.searchers import check_search_settings
    from raydp_hpo.searchers.auto import APPLICABLE, SpaceClass, _absolute

    setting = ds.SETTINGS[name]
    settings = ds.package_settings(setting)
    json.dumps(settings)  # JSON as written
    check_search_settings(setting.searcher, _absolute(settings, 3.0, 10))
    for space_class, families in ds.SPACE_CLASSES.items():
        if setting.family in families:
            assert setting.searcher in APPLICABLE[SpaceClass(space_class)]
