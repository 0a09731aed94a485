"""A small, fully specified ``search="auto"`` table for the tests (the packaged one is the
defaults study's, which the lead replaces): which row each input must pick is written here."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

BANDS = (2.0, 5.0, 10.0, 25.0, 50.0, math.inf)
EPSILONS = (1.0, 3.0, 8.0)

RS5 = ("rs_geom_k5", "random_stopping", {"distribution": "geometric", "mean": 5.0}, 4.8, 4.8)
RS10 = ("rs_geom_k10", "random_stopping", {"distribution": "geometric", "mean": 10.0}, 9.5, 9.5)
TNB20 = ("rs_tnb2_k20", "random_stopping",
         {"distribution": "truncated_negative_binomial", "mean": 20.0, "shape": 2.0}, 19.0, 19.0)
LS = ("ls_refined", "linear_scaling", {"preset": "refined"}, 7.0, 7.0)
GRID4 = ("grid4", "grid_composed", {}, 4.0, 4.0)
SVT = ("svt_k20", "svt_threshold", {"num_partitions": 20, "round_epsilon_fraction": 0.1,
                                    "max_rounds": 2, "granularity": 0.2, "u0_chance": True},
       30.0, 21.0)


def pick(eps: float, band: float, space: str) -> tuple[Any, ...] | None:
    """The setting of the test table at (ε band, compute band, space class)."""
    if band < 5:
        return None  # nothing measured fits G ≤ 2
    if space == "lr_only":
        return RS5 if band == 5 else LS
    if space == "finite_grid":
        return SVT if (eps == 8.0 and math.isinf(band)) else GRID4
    return RS5 if band == 5 else RS10 if band == 10 else TNB20


def score(eps: float, band: float) -> float:
    return round(eps / 10 + (0.5 if math.isinf(band) else band / 100), 4)


def document(**overrides: Any) -> dict[str, Any]:
    rows = []
    for eps in EPSILONS:
        for band in BANDS:
            for space in ("lr_only", "finite_grid", "other"):
                chosen = pick(eps, band, space)
                row: dict[str, Any] = {
                    "epsilon_band": eps, "compute_limit": "inf" if math.isinf(band) else band,
                    "space_class": space, "setting": None, "searcher": None, "settings": None,
                    "score": None, "G": None, "expected_trials": None, "runner_up": None}
                if chosen is not None:
                    name, searcher, settings, g, trials = chosen
                    row.update(setting=name, searcher=searcher, settings=settings,
                               score=score(eps, band), G=g, expected_trials=trials,
                               runner_up="rs_geom_k5" if name != "rs_geom_k5" else None)
                rows.append(row)
    doc = {"format": "raydp-hpo auto table", "version": 1,
           "generated_by": "tests/raydp_hpo/searchers/auto_tables.py", "provisional": False,
           "note": "test table", "epsilon_bands": list(EPSILONS),
           "compute_bands": ["inf" if math.isinf(b) else b for b in BANDS],
           "space_classes": ["lr_only", "finite_grid", "other"], "tie_margin": 0.05,
           "searches": {}, "rows": rows}
    doc.update(overrides)
    return doc


def write(path: Path, doc: dict[str, Any] | None = None) -> Path:
    path.write_text(json.dumps(document() if doc is None else doc))
    return path
