"""``search="auto"``: the search method and its settings, read off the measured table.

The rule is pre-registered (``benchmarks/results/defaults_study/preregistration.md``,
section 7.3) and shipped as data, so that every choice is reproducible from the table alone:
``auto_table.json`` beside this module, **written by** ``benchmarks/defaults_study.py report``
(``--install-auto-table`` copies it here; a table whose ``provisional`` flag is set was
computed from an incomplete grid). :func:`load_auto_table` reads and checks it (a malformed
table is refused with :class:`AutoTableError`); :func:`choose_auto` applies it:

1. **ε band.** ε maps to the nearest measured budget on a log scale: ε < √3 → the ε = 1 table,
   ε < √24 → ε = 3, else ε = 8 (the geometric midpoints of 1, 3 and 8). ε outside
   [0.5, 16] is flagged "outside the measured range" (the certificate says so): the table
   was measured at 1, 3 and 8 only.
2. **Space class** (:func:`space_class`): ``lr_only`` when the learning rate is the one tuned
   key and a range (every other key a constant: a value, or a choice / grid of one value);
   ``finite_grid`` when every tuned key takes finitely many values (``tune.choice``,
   ``tune.grid_search``; a grid or choice over the learning rate alone is this class: the
   grid searches enumerate exactly the values given); else ``other``. Linear scaling applies
   to ``lr_only`` only, grid search and SVT to ``finite_grid`` only; random stopping,
   subsampled transfer and one-shot to every class (the table was computed that way).
3. **Compute limit** L in one-shot units (one training run of the space = 1): the settings
   ``max_gradient_evaluations`` ÷ one training run's planned gradient evaluations
   (steps · q · n per run, the largest over the space's privacy grid, at the declared public
   training size n: :func:`one_run_gradient_evaluations`), and/or ``max_trials`` (compared
   with a row's expected trials), and/or ``compute_limit`` (L itself; ``"inf"`` for none).
   :func:`choose_auto` alone defaults to no limit (L = ∞); ``DPTuner(search="auto")``, an
   experiment file's ``algorithm: auto`` and a search left unnamed (the package default,
   which *is* auto) default to :data:`DEFAULT_COMPUTE_LIMIT` = 25 one-shot runs, the compute
   cap of the study's package-default rule (section 7.1) — a newcomer's search never costs
   more than 25 training runs' worth of compute unless they allow it.
4. **The row**: of the table's rows at (ε band, space class), the one with the largest compute
   band ≤ L; with ``max_trials``, the largest such band whose setting's expected trials are
   ≤ ``max_trials`` (for a grid search: the user's grid size). Each row's setting is the
   maximiser of S(m, ε) — the 10th-percentile per-seed RERR on the worst dataset — among the
   applicable settings whose compute multiple G is within the band, ties within 0.05 going to
   less compute. No row within the limits → :class:`~raydp_hpo.errors.InvalidParameterError`
   naming the limit and the cheapest applicable setting's G.

The result, :class:`AutoChoice`, names the searcher and its settings, exactly as if the user had
named them (``DPTuner(search=choice)`` runs them; ``DPTuner(search="auto")`` chooses and runs),
with the table row, S and a sentence saying why; the certificate and ``release.json`` carry it
(:meth:`AutoChoice.to_dict`). Every input is public configuration (the budget, the space, the
limits, the declared sizes): the choice reads no data and costs no privacy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from raydp_hpo.searchers.plan import PRIVACY_KEYS
from raydp_hpo.searchers.space import finite_values

if TYPE_CHECKING:
    from raydp_hpo.searchers import SearchAlgorithm

__all__ = [
    "AUTO",
    "AUTO_SETTINGS",
    "DEFAULT_COMPUTE_LIMIT",
    "AutoChoice",
    "AutoRow",
    "AutoTable",
    "AutoTableError",
    "SpaceClass",
    "MEASURED_EPSILONS",
    "MEASURED_RANGE",
    "PACKAGED_TABLE",
    "auto_table_path",
    "choose_auto",
    "epsilon_band",
    "is_auto",
    "load_auto_table",
    "one_run_gradient_evaluations",
    "resolve_auto",
    "space_class",
]

#: ``search=`` value (and experiment files' ``search.algorithm``) that chooses from the table.
AUTO = "auto"
#: The settings ``search="auto"`` takes (its compute limit); the chosen searcher's own
#: settings come from the table.
AUTO_SETTINGS = ("max_gradient_evaluations", "max_trials", "compute_limit")

#: L of ``search="auto"`` when none of :data:`AUTO_SETTINGS` is given (one-shot runs): the
#: compute cap G ≤ 25 of the defaults study's package-default rule (preregistration 7.1)
DEFAULT_COMPUTE_LIMIT = 25.0
#: The budgets the table was measured at, and the ε range it is said to cover.
MEASURED_EPSILONS = (1.0, 3.0, 8.0)
MEASURED_RANGE = (0.5, 16.0)
#: The package's table (regenerated by ``benchmarks/defaults_study.py report
#: --install-auto-table``).
PACKAGED_TABLE = "auto_table.json"
TABLE_FORMAT = "raydp-hpo auto table"
TABLE_VERSION = 1
#: Settings of the table in a form relative to the run: ``round_epsilon_fraction`` (SVT's ε'
#: as a fraction of the search's ε) and ``u0_chance`` (SVT's u₀ = 1 / number of classes).
RELATIVE_SETTINGS = ("round_epsilon_fraction", "u0_chance")


class AutoTableError(RayDPHPOError):
    """``auto_table.json`` is malformed: ``search="auto"`` refuses to choose from it."""


class SpaceClass(Enum):
    """The kinds of search space the table distinguishes (:func:`space_class`)."""

    LR_ONLY = "lr_only"
    FINITE_GRID = "finite_grid"
    OTHER = "other"


#: Which searchers apply to which space class (preregistration section 7.3).
APPLICABLE: dict[SpaceClass, tuple[str, ...]] = {
    SpaceClass.LR_ONLY: ("one_shot_random", "random_stopping", "subsampled_transfer",
                         "linear_scaling"),
    SpaceClass.FINITE_GRID: ("one_shot_random", "random_stopping", "subsampled_transfer",
                             "svt_threshold", "grid_composed"),
    SpaceClass.OTHER: ("one_shot_random", "random_stopping", "subsampled_transfer"),
}


def is_auto(search: Any) -> bool:
    """Whether ``search`` asks for :func:`choose_auto` (the string ``"auto"``)."""
    return isinstance(search, str) and search == AUTO


# ------------------------------------------------------------------------------ the table


@dataclass(frozen=True)
class AutoRow:
    """One row of the table: at (ε band, compute band, space class), the setting chosen.

    ``setting`` is ``None`` where no setting was eligible (no measured setting fits the band);
    ``score`` is S (the 10th-percentile per-seed RERR on the worst dataset at that ε), ``G`` the
    setting's mean gradient evaluations ÷ one-shot's (max over datasets), ``expected_trials``
    the trials it ran on average (max over datasets)."""

    epsilon_band: float
    compute_limit: float  # math.inf: no limit
    space_class: SpaceClass
    setting: str | None
    searcher: str | None
    settings: dict[str, Any] = field(default_factory=dict)
    score: float | None = None
    G: float | None = None
    expected_trials: float | None = None
    runner_up: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"epsilon_band": self.epsilon_band,
                "compute_limit": "inf" if math.isinf(self.compute_limit) else self.compute_limit,
                "space_class": self.space_class.value, "setting": self.setting,
                "searcher": self.searcher, "settings": dict(self.settings), "score": self.score,
                "G": self.G, "expected_trials": self.expected_trials,
                "runner_up": self.runner_up}


@dataclass(frozen=True)
class AutoTable:
    """The checked table (:func:`load_auto_table`): its rows and where it came from."""

    rows: tuple[AutoRow, ...]
    compute_bands: tuple[float, ...]
    provisional: bool
    source: str
    note: str = ""

    def rows_for(self, band: float, space: SpaceClass) -> list[AutoRow]:
        """The rows at ε band ``band`` and ``space``, by compute band ascending."""
        return sorted((r for r in self.rows if r.epsilon_band == band and r.space_class is space),
                      key=lambda r: r.compute_limit)


def auto_table_path() -> Path:
    """The packaged ``auto_table.json``."""
    return Path(__file__).with_name(PACKAGED_TABLE)


def _bad(source: str, message: str) -> AutoTableError:
    return AutoTableError(
        f"{source} is not a valid search='auto' table: {message}. Regenerate it with "
        "'python benchmarks/defaults_study.py report --install-auto-table'")


def _number(value: Any, what: str, source: str, *, allow_inf: bool = False) -> float:
    if allow_inf and value == "inf":
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        alternative = " or 'inf'" if allow_inf else ""
        raise _bad(source, f"{what} must be a finite number{alternative}, got {value!r}")
    return float(value)


def _row(raw: Any, i: int, source: str) -> AutoRow:
    from raydp_hpo.searchers import SearchAlgorithm, check_search_settings

    where = f"rows[{i}]"
    if not isinstance(raw, Mapping):
        raise _bad(source, f"{where} must be an object, got {raw!r}")
    keys = {"epsilon_band", "compute_limit", "space_class", "setting", "searcher", "settings",
            "score", "G", "expected_trials", "runner_up"}
    if set(raw) != keys:
        missing, extra = sorted(keys - set(raw)), sorted(set(raw) - keys)
        raise _bad(source, f"{where} keys: missing {missing}, unknown {extra}")
    band = _number(raw["epsilon_band"], f"{where}.epsilon_band", source)
    if band not in MEASURED_EPSILONS:
        raise _bad(source, f"{where}.epsilon_band {band:g} is not one of {MEASURED_EPSILONS}")
    limit = _number(raw["compute_limit"], f"{where}.compute_limit", source, allow_inf=True)
    if limit <= 0:
        raise _bad(source, f"{where}.compute_limit must be > 0, got {limit:g}")
    try:
        space = SpaceClass(raw["space_class"])
    except ValueError:
        raise _bad(source, f"{where}.space_class {raw['space_class']!r} is not one of "
                           f"{[c.value for c in SpaceClass]}") from None
    setting = raw["setting"]
    if setting is None:
        if any(raw[k] is not None for k in ("searcher", "settings", "score", "G")):
            raise _bad(source, f"{where} has no setting but a searcher, settings, score or G")
        return AutoRow(band, limit, space, None, None)
    if not isinstance(setting, str) or not setting:
        raise _bad(source, f"{where}.setting must be a name or null, got {setting!r}")
    searcher = raw["searcher"]
    try:
        algorithm = SearchAlgorithm(searcher)
    except ValueError:
        raise _bad(source, f"{where}.searcher {searcher!r} is not one of "
                           f"{[a.value for a in SearchAlgorithm]}") from None
    if algorithm.value not in APPLICABLE[space]:
        raise _bad(source, f"{where}: {algorithm.value} does not apply to a space of class {space.value} "
                           f"(applicable: {', '.join(APPLICABLE[space])})")
    settings = raw["settings"]
    if not isinstance(settings, Mapping):
        raise _bad(source, f"{where}.settings must be an object, got {settings!r}")
    try:  # the settings the searcher will get (relative ones stand in for theirs)
        check_search_settings(algorithm, _absolute(dict(settings), 1.0, None))
    except (InvalidParameterError, TypeError) as exc:
        raise _bad(source, f"{where}.settings: {exc}") from None
    score = _number(raw["score"], f"{where}.score", source)
    g = _number(raw["G"], f"{where}.G", source)
    if g <= 0 or g > limit * (1 + 1e-9):
        raise _bad(source, f"{where}.G = {g:g} must be in (0, compute_limit = {limit:g}]")
    trials = raw["expected_trials"]
    trials = None if trials is None else _number(trials, f"{where}.expected_trials", source)
    runner_up = raw["runner_up"]
    if runner_up is not None and not isinstance(runner_up, str):
        raise _bad(source, f"{where}.runner_up must be a name or null, got {runner_up!r}")
    return AutoRow(band, limit, space, setting, algorithm.value, dict(settings), score, g,
                   trials, runner_up)


def load_auto_table(path: str | Path | None = None) -> AutoTable:
    """Read and check ``auto_table.json`` (default: the packaged one, :func:`auto_table_path`).

    Refused with :class:`AutoTableError` (naming the file, the entry and the fix): not JSON,
    another format or version, a row with unknown keys, an ε band other than 1, 3, 8, a
    compute band that is not a positive number or ``"inf"``, an unknown space class or
    searcher, a searcher that does not apply to its space class, settings its searcher does
    not take, a G above its band, and a missing or repeated (ε band, compute band, class)."""
    p = Path(path) if path is not None else auto_table_path()
    source = str(p)
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise AutoTableError(f"cannot read the search='auto' table {source}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise _bad(source, f"not JSON ({exc})") from None
    if not isinstance(doc, Mapping):
        raise _bad(source, "the top level must be an object")
    if doc.get("format") != TABLE_FORMAT or doc.get("version") != TABLE_VERSION:
        raise _bad(source, f"format {doc.get('format')!r} version {doc.get('version')!r}; "
                           f"this raydp-hpo reads {TABLE_FORMAT!r} version {TABLE_VERSION}")
    bands_raw = doc.get("compute_bands")
    if not isinstance(bands_raw, list) or not bands_raw:
        raise _bad(source, "compute_bands must be a non-empty list")
    bands = tuple(_number(b, "compute_bands[]", source, allow_inf=True) for b in bands_raw)
    if list(bands) != sorted(set(bands)) or bands[-1] != math.inf:
        raise _bad(source, f"compute_bands must be increasing and end with 'inf', got {bands_raw}")
    raw_rows = doc.get("rows")
    if not isinstance(raw_rows, list):
        raise _bad(source, "rows must be a list")
    rows = tuple(_row(r, i, source) for i, r in enumerate(raw_rows))
    seen: set[tuple[float, float, SpaceClass]] = set()
    for r in rows:
        key = (r.epsilon_band, r.compute_limit, r.space_class)
        if r.compute_limit not in bands:
            raise _bad(source, f"row {key} has a compute band not in compute_bands")
        if key in seen:
            raise _bad(source, f"(ε band {key[0]:g}, compute band {key[1]:g}, "
                               f"{key[2].value}) appears twice")
        seen.add(key)
    want = {(e, b, c) for e in MEASURED_EPSILONS for b in bands for c in SpaceClass}
    if seen != want:
        first = sorted(want - seen, key=lambda k: (k[0], k[1], k[2].value))[0]
        raise _bad(source, f"{len(want - seen)} (ε band, compute band, space class) rows are "
                           f"missing, e.g. ({first[0]:g}, {first[1]:g}, {first[2].value})")
    provisional = doc.get("provisional")
    if not isinstance(provisional, bool):
        raise _bad(source, f"provisional must be true or false, got {provisional!r}")
    return AutoTable(rows, bands, provisional, source, str(doc.get("note", "")))


# ------------------------------------------------------------------------------ inputs


def epsilon_band(epsilon: float) -> float:
    """The measured ε whose rows ``epsilon`` uses: the nearest of 1, 3, 8 on a log scale
    (ε < √3 → 1, ε < √24 → 3, else 8)."""
    if epsilon < math.sqrt(3.0):
        return 1.0
    if epsilon < math.sqrt(24.0):
        return 3.0
    return 8.0


def _tuned(key: str, value: Any) -> bool:
    """Whether a space entry varies: a continuous domain, or more than one finite value."""
    values = finite_values(key, value)
    return values is None or len(values) > 1


def space_class(space: Mapping[str, Any], lr_key: str = "lr") -> tuple[SpaceClass, str]:
    """The :class:`SpaceClass` of ``space`` and a phrase saying why.

    A key is *tuned* when it is a continuous domain or takes more than one value (a constant,
    or a choice / grid of one value, is not). ``finite_grid`` when every tuned key is finite
    (so are spaces with nothing tuned), else ``lr_only`` when ``lr_key`` is the one tuned key,
    else ``other``."""
    if not isinstance(space, Mapping) or not space:
        raise InvalidParameterError(
            f"search='auto' classifies the search space, which must be a non-empty dict; got "
            f"{space!r}")
    tuned = [k for k, v in space.items() if _tuned(str(k), v)]
    continuous = [k for k in tuned if finite_values(str(k), space[k]) is None]
    if not continuous:
        size = 1
        for k in tuned:
            size *= len(finite_values(str(k), space[k]) or [])
        what = (f"every tuned key ({', '.join(map(str, tuned))}) takes finitely many values: "
                f"{size} configuration(s)") if tuned else "no key is tuned: 1 configuration"
        return SpaceClass.FINITE_GRID, what
    if tuned == [lr_key]:
        return SpaceClass.LR_ONLY, f"{lr_key!r} is the one tuned key (a range)"
    return SpaceClass.OTHER, (f"tuned keys {', '.join(map(repr, tuned))}; continuous: "
                              f"{', '.join(map(repr, continuous))}")


def _grid_size(space: Mapping[str, Any]) -> int:
    size = 1
    for k, v in space.items():
        size *= len(finite_values(str(k), v) or [None])
    return size


def one_run_gradient_evaluations(space: Mapping[str, Any], dataset_size: int) -> float:
    """Planned per-example gradient evaluations of one training run of ``space`` (the unit of
    a compute limit): steps · q · n (× 2 for ADADP) at the public training size n, the largest
    over the finite values of the space's privacy keys (epochs, sample rate or batch size,
    optimizer), as the searchers plan it (:meth:`~raydp_hpo.trial.privacy.DPSGDPrivacy.
    expected_gradient_evaluations`)."""
    import itertools

    from raydp_hpo.searchers.plan import NOISE_KEYS
    from raydp_hpo.trial.privacy import privacy_from_config

    # the noise does not change the compute: a placeholder where the searcher calibrates it
    noise = {} if any(k in space for k in NOISE_KEYS) else {"noise_multiplier": 1.0}
    keys, values = [], []
    for key in PRIVACY_KEYS:
        if key not in space:
            continue
        vals = finite_values(key, space[key])
        if vals is None:
            raise InvalidParameterError(
                f"search='auto' with max_gradient_evaluations needs the cost of one training run, "
                f"but search space key {key!r} is a continuous domain; use a constant or "
                "tune.choice([...])")
        keys.append(key)
        values.append(vals)
    out = 0.0
    for combo in itertools.product(*values):
        config = {**noise, **dict(zip(keys, combo))}
        try:
            p = privacy_from_config(config, dataset_size)
        except InvalidParameterError as exc:
            raise InvalidParameterError(
                f"search='auto' with max_gradient_evaluations needs the cost of one training "
                f"run of the space ({config}): {exc}") from None
        out = max(out, p.expected_gradient_evaluations(dataset_size))
    return out


def _absolute(settings: dict[str, Any], epsilon: float, num_classes: int | None
              ) -> dict[str, Any]:
    """The table's settings for a search of budget ``epsilon``: the relative ones
    (:data:`RELATIVE_SETTINGS`) resolved, lists of pairs as tuples."""
    out: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}
    fraction = out.pop("round_epsilon_fraction", None)
    if fraction is not None:
        out["round_epsilon"] = float(fraction) * float(epsilon)
    if out.pop("u0_chance", False) and num_classes:
        out["u0"] = 1.0 / int(num_classes)
    return out


# ------------------------------------------------------------------------------ the choice


@dataclass(frozen=True)
class AutoChoice:
    """What ``search="auto"`` chose: ``algorithm`` with ``settings`` (the searcher's keyword
    settings, run exactly as if named), the table ``row`` it comes from, and the inputs.

    Pass it as ``DPTuner(search=choice)`` to run it (what ``search="auto"`` does)."""

    algorithm: SearchAlgorithm
    settings: dict[str, Any]
    row: AutoRow
    epsilon: float
    epsilon_band: float
    outside_measured_range: bool
    space_class: SpaceClass
    compute_limit: float  # one-shot units; math.inf: none
    max_trials: int | None
    max_gradient_evaluations: float | None
    table: str
    table_provisional: bool
    reason: str

    @property
    def setting(self) -> str:
        """The name of the chosen setting in the study (e.g. ``"ls_refined"``)."""
        assert self.row.setting is not None
        return self.row.setting

    def to_dict(self) -> dict[str, Any]:
        """The public record of the choice (the certificate's ``auto_search``)."""

        def num(x: float) -> float | str:
            return "inf" if math.isinf(x) else x

        return {
            "setting": self.setting,
            "searcher": self.algorithm.value,
            "settings": {k: list(v) if isinstance(v, tuple) else v
                         for k, v in self.settings.items()},
            "table_row": {"epsilon_band": self.row.epsilon_band,
                          "compute_band": num(self.row.compute_limit),
                          "space_class": self.row.space_class.value},
            "S": self.row.score,
            "G": self.row.G,
            "runner_up": self.row.runner_up,
            "epsilon": self.epsilon,
            "outside_measured_range": self.outside_measured_range,
            "compute_limit": num(self.compute_limit),
            "max_trials": self.max_trials,
            "max_gradient_evaluations": self.max_gradient_evaluations,
            "table": Path(self.table).name,
            "table_provisional": self.table_provisional,
            "reason": self.reason,
        }


def _limit(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) \
            or value <= 0:
        raise InvalidParameterError(
            f"search='auto': {name} must be a positive number, got {value!r}")
    return float(value)


def choose_auto(
    epsilon: float,
    space: Mapping[str, Any],
    compute_limit: float | None = None,
    *,
    max_trials: int | None = None,
    table: AutoTable | str | Path | None = None,
    num_classes: int | None = None,
    max_gradient_evaluations: float | None = None,
    lr_key: str = "lr",
) -> AutoChoice:
    """The setting ``search="auto"`` runs for a search of budget ``epsilon`` over ``space``
    within ``compute_limit`` one-shot runs (``None``: no limit) and ``max_trials`` trials
    (``None``: no limit), read off ``table`` (default: the packaged one). See the module
    docstring for the rule; ``num_classes`` (public) fixes SVT's u₀ = 1/classes where its
    setting asks for it (else u₀ = 0, the searcher's default).
    ``max_gradient_evaluations`` is only recorded (the caller converted it into
    ``compute_limit``: :func:`resolve_auto`).

    >>> from ray import tune
    >>> c = choose_auto(3.0, {"lr": tune.loguniform(1e-3, 10), "epochs": 15})
    >>> c.row.space_class.value, c.row.epsilon_band
    ('lr_only', 3.0)
    """
    from raydp_hpo.searchers import SearchAlgorithm

    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or \
            not math.isfinite(epsilon) or epsilon <= 0:
        raise InvalidParameterError(f"search='auto' needs a positive finite ε, got {epsilon!r}")
    limit = math.inf if compute_limit is None else _limit(compute_limit, "the compute limit")
    if max_trials is not None and (isinstance(max_trials, bool) or not isinstance(
            max_trials, int) or max_trials < 1):
        raise InvalidParameterError(
            f"search='auto': max_trials must be an integer >= 1, got max_trials={max_trials!r}")
    if not isinstance(table, AutoTable):
        table = load_auto_table(table)
    band = epsilon_band(float(epsilon))
    outside = not (MEASURED_RANGE[0] <= epsilon <= MEASURED_RANGE[1])
    cls, why_space = space_class(space, lr_key)
    rows = table.rows_for(band, cls)
    grid = _grid_size(space) if cls is SpaceClass.FINITE_GRID else None

    def trials(row: AutoRow) -> float | None:
        if row.searcher == SearchAlgorithm.GRID_COMPOSED.value and grid is not None:
            return float(grid)  # a grid search trains exactly the user's grid
        return row.expected_trials

    within = [r for r in rows if r.compute_limit <= limit and r.setting is not None]
    if max_trials is not None:
        within = [r for r in within if (t := trials(r)) is not None and t <= max_trials]
    limits = " and ".join(
        [*([] if math.isinf(limit) else [f"the compute limit L = {limit:.4g} one-shot runs"]),
         *([] if max_trials is None else [f"max_trials = {max_trials}"])]) or "no limit"
    if not within:
        named = [r for r in rows if r.setting is not None]
        if not named:
            raise InvalidParameterError(
                f"search='auto': the table {table.source} has no measured setting for ε = "
                f"{epsilon:g} (the ε = {band:g} rows) and a space of class {cls.value}"
                + (" — it is provisional: " + table.note if table.provisional else "")
                + "; name a search instead (e.g. search='random_stopping')")
        cheapest = min(named, key=lambda r: (r.G or math.inf, r.compute_limit))
        smallest = min(r.compute_limit for r in named)
        fixes = []
        if limit < smallest:
            fixes.append(f"a compute limit of at least {smallest:g} one-shot runs "
                         f"(max_gradient_evaluations ≥ {smallest:g}× one training run)")
        fitting = [t for r in named if r.compute_limit <= limit and (t := trials(r)) is not None]
        if max_trials is not None and fitting:
            fixes.append(f"max_trials ≥ {math.ceil(min(fitting))}")
        trials_note = ("" if max_trials is None or trials(cheapest) is None else
                       f", {trials(cheapest):.3g} expected trials")
        raise InvalidParameterError(
            f"search='auto': no measured setting fits {limits} at ε = {epsilon:g} with a "
            f"space of class {cls.value}: the cheapest setting the table names for it, "
            f"{cheapest.setting} ({cheapest.searcher}), costs G = {cheapest.G:.3g} one-shot "
            f"runs{trials_note}. Allow {' or '.join(fixes) or 'more compute'}, or name a "
            "search (e.g. search='one_shot_random')")
    row = max(within, key=lambda r: r.compute_limit)
    assert row.searcher is not None and row.setting is not None
    algorithm = SearchAlgorithm(row.searcher)
    settings = _absolute(dict(row.settings), float(epsilon), num_classes)
    band_text = "no limit" if math.isinf(row.compute_limit) else f"G ≤ {row.compute_limit:g}"
    reason = (
        f"ε = {epsilon:g} uses the ε = {band:g} rows"
        + (f" (OUTSIDE the measured range [{MEASURED_RANGE[0]:g}, {MEASURED_RANGE[1]:g}]: "
           "the table was measured at ε = 1, 3, 8 only)" if outside else "")
        + f"; the space is {cls.value} ({why_space}); {limits} → the row ({band:g}, "
        f"{band_text}, {cls.value}): {row.setting} = {algorithm.value} {settings or '(defaults)'}"
        f", S = {row.score:.3f} (10th-percentile per-seed RERR on the worst measured dataset), "
        f"G = {row.G:.3g} one-shot runs"
        + (f", runner-up {row.runner_up}" if row.runner_up else "")
        + (" [provisional table]" if table.provisional else ""))
    return AutoChoice(
        algorithm=algorithm, settings=settings, row=row, epsilon=float(epsilon),
        epsilon_band=band, outside_measured_range=outside, space_class=cls,
        compute_limit=limit, max_trials=max_trials,
        max_gradient_evaluations=max_gradient_evaluations, table=table.source,
        table_provisional=table.provisional, reason=reason)


def resolve_auto(
    space: Mapping[str, Any],
    epsilon: float,
    settings: Mapping[str, Any] | None,
    *,
    dataset_size: int | None,
    num_classes: int | None = None,
    table: AutoTable | str | Path | None = None,
) -> AutoChoice:
    """:func:`choose_auto` from ``search="auto"``'s own settings (:data:`AUTO_SETTINGS`:
    ``max_gradient_evaluations``, ``max_trials``, ``compute_limit``), as ``DPTuner`` and
    experiment files pass them; with none of them the compute limit is
    :data:`DEFAULT_COMPUTE_LIMIT` (the most restrictive of those given applies). ``max_gradient_evaluations`` becomes a compute limit in one-shot units through
    :func:`one_run_gradient_evaluations` at the public training size ``dataset_size``
    (required then). Any other setting is refused: the table fixes the chosen searcher's."""
    from raydp_hpo._validation import did_you_mean

    settings = dict(settings or {})
    unknown = [k for k in settings if k not in AUTO_SETTINGS]
    if unknown:
        k = str(unknown[0])
        raise InvalidParameterError(
            f"unknown search='auto' setting{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}{did_you_mean(k, AUTO_SETTINGS)}: auto takes "
            f"{', '.join(AUTO_SETTINGS)} (its compute limit) and chooses the searcher's own "
            "settings from the measured table; to set them, name the searcher "
            "(e.g. search='random_stopping', search_kwargs={...})")
    max_evals = settings.get("max_gradient_evaluations")
    limit: float | None = None
    if not any(settings.get(k) is not None for k in AUTO_SETTINGS):
        limit = DEFAULT_COMPUTE_LIMIT
    given = settings.get("compute_limit")
    if given is not None:
        limit = math.inf if given in ("inf", math.inf) else _limit(given, "compute_limit")
    if max_evals is not None:
        max_evals = _limit(max_evals, "max_gradient_evaluations")
        if dataset_size is None:
            raise InvalidParameterError(
                "search='auto' with max_gradient_evaluations needs the declared public "
                "training-set size (one training run's gradient evaluations are steps · q · n): "
                "declare it (DPTuner(dataset_size=...), data.declared_train_size)")
        per_run = one_run_gradient_evaluations(space, dataset_size)
        limit = max_evals / per_run if limit is None else min(limit, max_evals / per_run)
    return choose_auto(epsilon, space, limit, max_trials=settings.get("max_trials"),
                       table=table, num_classes=num_classes,
                       max_gradient_evaluations=max_evals)
