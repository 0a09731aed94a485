"""The ``raydp-hpo`` command line.

Subcommands:

* ``account``  — ε of DP-SGD settings (or a ``--search random_stopping`` plan over them) under
  every accountant, the headline being the tightest valid figure; with ``--epsilon E`` instead
  of ``--noise-multiplier``, the smallest σ whose run / plan is within E
  (:func:`~raydp_hpo.accounting.calibration.calibrate_search`); with ``--mechanism laplace|gaussian``
  the noise scale that makes a one-shot release (ε[, δ])-DP (:mod:`raydp_hpo.accounting.calibration`).
* ``ledger show JOURNAL`` / ``ledger list [DIR]`` — a ledger's budget, spend and charges.
* ``ledger verify JOURNAL|URI`` — integrity of a journal or PostgreSQL ledger, read-only (exit 0 intact, 2
  corrupted); ``ledger migrate JOURNAL URI`` moves a journal into PostgreSQL (once).
* ``demo``     — the main job on the built-in default (see :mod:`raydp_hpo.cli.demo`).
* ``run EXPERIMENT.yaml`` — run an experiment file (:mod:`raydp_hpo.cli.experiment`).
* ``schema [--kind experiment|federated|any] [--output FILE]`` — the JSON Schema of
  experiment files, federated experiment files, or either, for editors
  (:mod:`raydp_hpo.cli.config`).
* ``report RUN_DIR`` — certificate, plots and ``report.md`` of a run (:mod:`raydp_hpo.cli.report`).
* ``publish RUN_DIR OUT_DIR`` — copy exactly the public part of a finished run (release.json,
  certificate.json, released_model.pt) into a new or empty folder (:mod:`raydp_hpo.tune.publish`).
* ``dashboard [LOCATION …]`` — read-only web view of ledgers and experiments
  (:mod:`raydp_hpo.dashboard`; ``pip install 'raydp-hpo[dashboard]'``).
* ``audit``    — empirical privacy audit of every search algorithm, of the DP-SGD step and
  of client-level DP FedAvg (:mod:`raydp_hpo.audit`): an ε lower bound per algorithm against its claim, plus the
  property checks; exit 1 when any
  bound exceeds its claim or a check fails.

Exit codes: 0 success; 2 bad input (nothing charged); 3 the budget cannot pay (the plan does
not fit the experiment's or the dataset's budget, so nothing ran, or the ledger refused trials
mid-search); 1 anything else (a crash, or a failed final run: nothing released).

The parser and one short handler per subcommand, which share the parser's helpers; the
``ledger`` subcommands' handlers live in :mod:`raydp_hpo.cli.ledger_commands` and the exit
codes in :mod:`raydp_hpo.cli.exit_codes` (both re-exported here).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from raydp_hpo.cli.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_BUDGET_EXHAUSTED,
    EXIT_ERROR,
    EXIT_OK,
)
from raydp_hpo.cli.ledger_commands import (
    _cmd_ledger_init,
    _cmd_ledger_list,
    _cmd_ledger_migrate,
    _cmd_ledger_show,
    _cmd_ledger_verify,
)
from raydp_hpo.errors import BudgetExhaustedError, BudgetTooSmallError, RayDPHPOError

if TYPE_CHECKING:
    from raydp_hpo.accounting.mechanisms import Mechanism

__all__ = ["main", "EXIT_OK", "EXIT_ERROR", "EXIT_BAD_INPUT", "EXIT_BUDGET_EXHAUSTED"]

_SGD_ARGS = ("noise_multiplier", "sample_rate", "steps")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _round_up(value: float, digits: int = 6) -> str:
    """``value`` rounded *up* to ``digits`` significant digits (a printed scale never
    understates the calibrated noise)."""
    exponent = math.floor(math.log10(value)) - digits + 1
    up = math.ceil(value / 10.0**exponent) * 10.0**exponent
    while up < value:  # float error of the scaling
        up = math.nextafter(up, math.inf)
    return f"{up:.{digits}g}"


def _cmd_account_release(args: argparse.Namespace) -> int:
    """Noise scale of a one-shot Laplace or Gaussian release (``--mechanism``)."""
    from raydp_hpo.accounting.calibration import (
        calibrate_analytic_gaussian,
        calibrate_laplace,
        classic_gaussian_sigma,
    )

    sensitivity = 1.0 if args.sensitivity is None else args.sensitivity
    classic: float | None = None
    if args.mechanism == "laplace":
        if args.delta is not None:
            raise RayDPHPOError("--mechanism laplace is pure ε-DP (δ = 0): drop --delta, or use "
                                "--mechanism gaussian for an (ε, δ) release")
        delta = 0.0
        scale = calibrate_laplace(args.epsilon, sensitivity)
        label = ("Laplace scale b = Δ₁/ε (Dwork, McSherry, Nissim & Smith 2006)", "b")
    else:
        if args.delta is None:
            raise RayDPHPOError("--mechanism gaussian needs --delta (in (0, 1))")
        delta = args.delta
        scale = calibrate_analytic_gaussian(args.epsilon, delta, sensitivity)
        if args.epsilon < 1.0:
            classic = classic_gaussian_sigma(args.epsilon, delta, sensitivity)
        label = ("analytic Gaussian σ (Balle & Wang 2018, Thm. 8)", "σ")
    if args.json:
        print(json.dumps({"mechanism": args.mechanism, "epsilon": args.epsilon, "delta": delta,
                          "sensitivity": sensitivity, "scale": scale, "classic_sigma": classic}))
        return EXIT_OK
    norm = "ℓ₁" if args.mechanism == "laplace" else "ℓ₂"
    target = f"ε={args.epsilon:g}" + (f", δ={delta:g}" if delta else " (pure DP)")
    print(f"{args.mechanism} release, {norm} sensitivity {sensitivity:g}, {target}")
    print(f"  {label[0]:<62} {label[1]} = {_round_up(scale)}")
    if classic is not None:
        print(f"  {'classic σ = Δ√(2 ln(1.25/δ))/ε (Dwork & Roth 2014, Thm. A.1)':<62} "
              f"σ = {_round_up(classic)}")
    print("  (printed values are rounded up; --json gives the exact float)")
    return EXIT_OK


def _cmd_account(args: argparse.Namespace) -> int:
    """ε of DP-SGD settings, or of a random-stopping search over them (``--search``); with
    ``--epsilon`` instead of ``--noise-multiplier``, the smallest σ that meets that target; with
    ``--mechanism``, the calibrated noise of a one-shot release instead."""
    if args.mechanism is not None:
        extra = [_flag(n) for n in _SGD_ARGS if getattr(args, n) is not None]
        if (args.search is not None or args.mean is not None or args.shape is not None
                or args.distribution is not None):
            extra.append("--search/--mean/--distribution/--shape")
        if args.accountant is not None:
            extra.append("--accountant")
        if extra:
            raise RayDPHPOError(f"--mechanism {args.mechanism} prices a one-shot release: "
                                f"{', '.join(extra)} belong to DP-SGD accounting; drop them")
        if args.epsilon is None:
            raise RayDPHPOError(f"--mechanism {args.mechanism} needs --epsilon (> 0)")
        return _cmd_account_release(args)
    if args.sensitivity is not None:
        raise RayDPHPOError("--sensitivity calibrates a one-shot release: add "
                            "--mechanism laplace|gaussian")
    invert = args.epsilon is not None
    if invert and args.noise_multiplier is not None:
        raise RayDPHPOError(f"give --noise-multiplier (to get ε) or --epsilon (to get σ), not "
                            f"both: got --noise-multiplier {args.noise_multiplier:g} and "
                            f"--epsilon {args.epsilon:g}")
    if args.accountant is not None and not invert:
        raise RayDPHPOError("--accountant chooses the figure --epsilon calibrates σ on: add "
                            "--epsilon (ε under every accountant is printed anyway)")
    needed = ("sample_rate", "steps") if invert else _SGD_ARGS
    missing = [_flag(n) for n in (*needed, "delta") if getattr(args, n) is None]
    if missing:
        what = "σ for a target --epsilon" if invert else "DP-SGD accounting"
        raise RayDPHPOError(f"{what} needs {', '.join(missing)} (or use --mechanism "
                            "laplace|gaussian to calibrate a one-shot release)")
    plan_of = _account_plan(args)
    if invert:
        return _cmd_account_invert(args, plan_of)
    mech = plan_of(args.noise_multiplier)
    rows = _account_rows(mech, args.delta)
    if args.json:
        print(json.dumps({"mechanism": repr(mech), "delta": args.delta, "epsilon": rows}))
        return EXIT_OK
    print(f"{mech!r} at δ={args.delta:g}")
    _print_account_rows(mech, rows)
    return EXIT_OK


def _account_plan(args: argparse.Namespace) -> Callable[[float], Mechanism]:
    """The priced plan as a function of σ: one DP-SGD run, or a random-stopping search over
    such runs (``--search random_stopping``). Checks the search flags up front."""
    from raydp_hpo.accounting.mechanisms import (
        Gaussian,
        RandomStopping,
        StoppingDistribution,
        SubsampledGaussian,
    )

    if args.search == "random_stopping":
        if args.mean is None:
            raise RayDPHPOError("--search random_stopping needs --mean (E[K], >= 1)")
    elif args.mean is not None or args.shape is not None or args.distribution is not None:
        raise RayDPHPOError("--mean/--shape/--distribution price a search: add "
                            "--search random_stopping")
    from raydp_hpo._stopping_defaults import default_law

    # no --distribution: random stopping's default law (η too, unless --shape gives it)
    distribution, shape = default_law(args.distribution, args.shape)
    law = StoppingDistribution(distribution)

    def plan_of(sigma: float) -> Mechanism:
        trial: Gaussian | SubsampledGaussian
        if args.sample_rate == 1.0:
            trial = Gaussian(sigma, args.steps)
        else:
            trial = SubsampledGaussian(sigma, args.sample_rate, args.steps)
        if args.search == "random_stopping":
            return RandomStopping(trial, law, args.mean, shape)
        return trial

    return plan_of


def _account_rows(mech: Mechanism, delta: float) -> dict[str, float]:
    """ε of ``mech`` at ``delta`` under each accountant and the headline ``tightest`` (their
    minimum: every row is a valid upper bound for the fixed plan)."""
    from raydp_hpo.accounting.accountants import Accountant, epsilon, epsilon_or_inf
    from raydp_hpo.accounting.mechanisms import RandomStopping
    from raydp_hpo.accounting.rdp import classic_rdp_to_epsilon, rdp_profile

    # PLD in bounded memory for every valid input (raydp_hpo.accounting.pld.discretisation_interval);
    # inf (no claim) where an accountant cannot bound the mechanism
    rows = {
        "rdp": epsilon(mech, delta, Accountant.RDP),
        "rdp_classic": classic_rdp_to_epsilon(rdp_profile(mech).values, delta),
        "pld": epsilon_or_inf(mech, delta, Accountant.PLD),
    }
    if isinstance(mech, RandomStopping):
        rows["profile"] = epsilon_or_inf(mech, delta, Accountant.TIGHTEST)
    rows["tightest"] = min(rows.values())
    return rows


def _print_account_rows(mech: Mechanism, rows: dict[str, float]) -> None:
    from raydp_hpo.accounting.mechanisms import RandomStopping

    selection = isinstance(mech, RandomStopping)
    labels = {
        "rdp": "RDP (Canonne–Kamath–Steinke conversion)"
        + (", P&S 2022 selection" if selection else ""),
        "rdp_classic": "RDP (classic conversion, Mironov 2017)",
        "pld": "PLD (dp-accounting, pessimistic)"
        + (": selection via its RDP (ε, δ) point" if selection else ""),
        "profile": "privacy profiles (Koskela, Redberg & Wang 2024)",
        "tightest": "tightest valid bound (Accountant.TIGHTEST)",
    }
    for key, value in rows.items():
        print(f"  {labels[key]:<58} ε = {value:.4f}")


def _cmd_account_invert(args: argparse.Namespace, plan_of: Callable[[float], Mechanism]) -> int:
    """``account --epsilon E``: the smallest σ whose plan (one DP-SGD run, or the whole
    random-stopping search) is within ε = E at δ (:func:`~raydp_hpo.accounting.calibration.calibrate_search`)."""
    from raydp_hpo.accounting.accountants import Accountant
    from raydp_hpo.accounting.calibration import calibrate_search

    accountant = Accountant(args.accountant or Accountant.TIGHTEST.value)
    sigma = calibrate_search(plan_of, args.epsilon, args.delta, accountant)
    mech = plan_of(sigma)
    rows = _account_rows(mech, args.delta)
    if args.json:
        print(json.dumps({"mechanism": repr(mech), "delta": args.delta,
                          "target_epsilon": args.epsilon, "accountant": accountant.value,
                          "noise_multiplier": sigma, "epsilon": rows}))
        return EXIT_OK
    what = "the whole search" if args.search is not None else "one DP-SGD run"
    print(f"σ for {what} within ε={args.epsilon:g} at δ={args.delta:g} "
          f"(accountant {accountant.value}):")
    print(f"  noise multiplier σ = {_round_up(sigma)}  (rounded up; --json gives the exact float)")
    print(f"{mech!r} at δ={args.delta:g}")
    _print_account_rows(mech, rows)
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from raydp_hpo.cli.demo import run_accounting_walkthrough, run_demo

    if args.accounting:
        return run_accounting_walkthrough(quick=args.quick)
    return run_demo(quick=args.quick, storage_path=args.storage_path)


def _cmd_run(args: argparse.Namespace) -> int:
    """Exit codes: 0 released, 2 bad input (nothing ran), 3 budget exhausted (plan refused:
    nothing ran; or the search was cut short by the ledger: the release is still written,
    or, when nothing could be selected, the certificate of what was spent), 1 crash (Ray
    failures) or a search that selected nothing (:class:`~raydp_hpo.errors.
    SearchFailedError`: every trial failed, K = 0 drawn, ...; its certificate is written and
    its message says why)."""
    from raydp_hpo.cli.experiment import format_summary, load_experiment, run_experiment
    from raydp_hpo.errors import (
        ConfigError,
        LedgerMismatchError,
        ReleaseAlreadyPublishedError,
        SearchFailedError,
    )

    spec = load_experiment(args.experiment)  # ConfigError -> EXIT_BAD_INPUT, before anything
    if args.storage_path:
        spec = spec.model_copy(  # a validated path: absolute, as validation makes it
            update={"storage_path": str(Path(args.storage_path).expanduser().resolve())})
    if args.dry_run:
        # Every check `run` makes before its first charge, without Ray or a ledger: the space
        # against the trainable, the search settings and the plan against the budget.
        from raydp_hpo.cli.experiment import describe_sizes, preflight

        checked = preflight(spec)  # the same checks as run, every error at once
        from raydp_hpo._storage import warn_if_ephemeral

        warn_if_ephemeral(spec.storage, "storage_path", print)
        if isinstance(spec.ledger_journal(), Path):  # not for a PostgreSQL ledger
            warn_if_ephemeral(spec.ledger_journal(), "ledger journal", print)
        print(f"experiment file {args.experiment} is valid: {spec.experiment} -> {spec.run_dir} "
              f"(ledger {spec.ledger_name}, journal {spec.ledger_journal()})")
        for line in describe_sizes(spec, checked):
            print(line)
        if checked.auto is not None:  # search: {algorithm: auto}: what run will run
            print(f"search 'auto' chooses {checked.auto.setting}: {checked.auto.reason}")
        return EXIT_OK
    try:
        outcome = run_experiment(spec, progress_interval_s=args.progress_interval,
                                 resume=args.resume, num_cpus=args.num_cpus,
                                 ray_temp_dir=args.ray_temp_dir)
    except (BudgetExhaustedError, ConfigError, LedgerMismatchError, ReleaseAlreadyPublishedError,
            ValueError):
        raise  # mapped by main(): 3 / 2
    except SearchFailedError as exc:  # ran, spent, selected nothing: its certificate is written
        print(exc.result.certificate.format())
        print(f"raydp-hpo: {exc}", file=sys.stderr)
        return EXIT_BUDGET_EXHAUSTED if exc.result.budget_exhausted else EXIT_ERROR
    except Exception as exc:  # Ray or system failure: not the user's input
        print(f"raydp-hpo: run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(format_summary(outcome))
    result = outcome.result
    if result.budget_exhausted:
        print("raydp-hpo: the ledger refused further trials (budget exhausted); the release "
              "above covers what ran", file=sys.stderr)
        return EXIT_BUDGET_EXHAUSTED
    return EXIT_OK


def _cmd_federated(args: argparse.Namespace) -> int:
    """``federated --config FILE.yaml`` runs a federated experiment file
    (:mod:`raydp_hpo.cli.federated_experiment`); other options go to raydp_hpo.trainables.federated."""
    rest = list(args.args)
    rest = rest[1:] if rest[:1] == ["--"] else rest
    if any(a == "--config" or a.startswith("--config=") for a in rest):
        cfg = argparse.ArgumentParser(prog="raydp-hpo federated")
        cfg.add_argument("--config", required=True, help="federated experiment YAML file")
        cfg.add_argument("--dry-run", action="store_true",
                         help="only validate the file, run nothing")
        opts = cfg.parse_args(rest)
        from raydp_hpo.cli.federated_experiment import load_federated, run_federated_experiment

        spec = load_federated(opts.config)  # ConfigError -> EXIT_BAD_INPUT in main()
        if opts.dry_run:
            print(f"{opts.config}: valid federated experiment {spec.experiment!r} "
                  f"({spec.clients.count} clients, {spec.training.rounds} rounds)")
            return EXIT_OK
        run_federated_experiment(spec)
        return EXIT_OK
    from raydp_hpo.trainables.federated import main as federated_main

    return int(federated_main(rest))


def _cmd_schema(args: argparse.Namespace) -> int:
    """The JSON Schema of experiment files (``--kind federated``: federated experiment files;
    ``any``: either, told apart by ``kind``), printed or written to ``--output``."""
    from raydp_hpo.cli.config import json_schema

    text = json.dumps(json_schema(args.kind), indent=2, ensure_ascii=False) + "\n"
    if args.output is None:
        print(text, end="")
        return EXIT_OK
    out = Path(args.output)
    if out.is_dir():
        raise RayDPHPOError(f"--output {str(out)!r} is a directory; name a file, e.g. "
                            f"{str(out / 'experiment.schema.json')!r}")
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise RayDPHPOError(f"cannot write the schema to {str(out)!r}: {exc}") from None
    what, files = {"experiment": ("experiment file", "an experiment file"),
                   "federated": ("federated experiment file", "a federated experiment file"),
                   "any": ("config file", "an experiment or federated experiment file"),
                   }[args.kind]
    print(f"wrote the {what} schema to {out} (editors: add the line "
          f"'# yaml-language-server: $schema={out.resolve()}' at the top of {files})")
    return EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    from raydp_hpo.cli.report import write_report
    from raydp_hpo.tune.publish import find_release

    files = write_report(args.run_dir, args.out)
    release = find_release(args.run_dir)
    print(release.read_text(encoding="utf-8") if args.json and release is not None
          else files.markdown.read_text(encoding="utf-8"))
    print(f"\nwrote {files.markdown}, {files.budget_plot}"
          + (f", {files.trials_plot} (PRIVATE ARTEFACT)" if files.trials_plot else ""))
    return EXIT_OK


def _cmd_publish(args: argparse.Namespace) -> int:
    """Copy exactly the public part of a finished run into a new or empty folder (the function
    behind ``DPResult.save_public``): refused (exit 2, nothing written) for a folder inside the
    run dir or one that holds files."""
    from raydp_hpo.tune.publish import publish_run

    written = publish_run(args.run_dir, args.out_dir)
    print(f"published {len(written)} files to {Path(args.out_dir).expanduser().resolve()}: "
          + ", ".join(p.name for p in written)
          + " (covered by the certificate; no per-trial results, no paths of this machine)")
    return EXIT_OK


def _cmd_audit(args: argparse.Namespace) -> int:
    from raydp_hpo.audit import format_report, run_audit

    report = run_audit(
        args.algorithm or None,
        runs=args.runs,
        selection_runs=args.selection_runs,
        alpha=args.alpha,
        properties=not args.skip_properties,
        progress=None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True)),
    )
    if args.json:
        from dataclasses import asdict

        print(json.dumps({"passed": report.passed, "failures": report.failures,
                          "results": [asdict(r) for r in report.results]}, default=str))
    else:
        print(format_report(report))
    if not report.passed:
        for failure in report.failures:
            print(f"raydp-hpo: audit failed: {failure}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


T = TypeVar("T", int, float)


def _argument_type(cast: Callable[[str], T], valid: Callable[[T], bool],
                   requirement: str) -> Callable[[str], T]:
    """An argparse ``type=``: ``cast(text)`` if it parses and is ``valid``, else an error that
    names the requirement and the value given."""

    def parse(text: str) -> T:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text!r}") from None
        if not valid(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text!r}")
        return value

    return parse


_positive_int = _argument_type(int, lambda v: v >= 1, "an integer >= 1")
_positive_float = _argument_type(float, lambda v: math.isfinite(v) and v > 0,
                                 "a finite number > 0")
_probability = _argument_type(float, lambda v: 0 < v < 1, "a number in (0, 1)")
_rate = _argument_type(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
_at_least_one = _argument_type(float, lambda v: math.isfinite(v) and v >= 1,
                               "a finite number >= 1")
_finite_float = _argument_type(float, math.isfinite, "a finite number")


def _looks_like_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _value_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every ``--flag`` of ``parser`` and its subcommands that takes exactly one value."""
    flags: set[str] = set()
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walk
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sub in action.choices.values():
                flags |= _value_flags(sub)
        elif action.nargs is None and action.option_strings:
            flags.update(f for f in action.option_strings if f.startswith("--"))
    return flags


def _attach_negative_values(argv: list[str], flags: set[str]) -> list[str]:
    """``--delta -1e-5`` as ``--delta=-1e-5``: argparse takes a value that starts with '-'
    for an option unless it looks like a plain negative number (``-1``, ``-.5``; not
    ``-1e-5`` or ``-inf``), and then answers "expected one argument" without naming the value.
    Attached, the value reaches the flag's type check, which names the flag, the value and
    the valid range."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":  # the rest are positionals
            return out + argv[i:]
        if (token in flags and i + 1 < len(argv) and argv[i + 1].startswith("-")
                and _looks_like_number(argv[i + 1])):
            out.append(f"{token}={argv[i + 1]}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def _build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a misspelled or shortened flag (--noise for --noise-multiplier) is an
    # error, not a silent match
    parser = argparse.ArgumentParser(
        prog="raydp-hpo", description="Differentially private hyperparameter optimisation on Ray Tune",
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    acc = sub.add_parser(
        "account", help="ε of DP-SGD settings under every accountant, σ for a target --epsilon, "
                        "or (--mechanism) the noise of a one-shot Laplace/Gaussian release")
    # every numeric flag checks its range here: the error names the flag, the value and the
    # range (a negative value such as `--delta -1e-5` included, see _attach_negative_values)
    acc.add_argument("--noise-multiplier", type=_positive_float, default=None,
                     help="DP-SGD only (> 0)")
    acc.add_argument("--sample-rate", type=_rate, default=None, help="DP-SGD only, in (0, 1]")
    acc.add_argument("--steps", type=_positive_int, default=None, help="DP-SGD only (>= 1)")
    acc.add_argument("--delta", type=_probability, default=None,
                     help="target δ (DP-SGD and --mechanism gaussian)")
    acc.add_argument("--mechanism", choices=["laplace", "gaussian"], default=None,
                     help="calibrate a one-shot release instead: Laplace b or analytic Gaussian σ")
    acc.add_argument("--epsilon", type=_positive_float, default=None,
                     help="target ε (> 0): of --mechanism, or (instead of --noise-multiplier) "
                          "the DP-SGD run / --search plan whose smallest σ is printed")
    acc.add_argument("--accountant", choices=["tightest", "rdp", "pld"], default=None,
                     help="with --epsilon: the figure σ is calibrated on (default tightest, the "
                          "tightest valid one for a plan fixed up front; rdp for a ledger that "
                          "halts on the adaptive RDP filter)")
    acc.add_argument("--sensitivity", type=_positive_float, default=None,
                     help="ℓ₁ (laplace) / ℓ₂ (gaussian) sensitivity of the release (default 1)")
    acc.add_argument("--search", choices=["random_stopping"], default=None,
                     help="price a Papernot–Steinke search over these trials instead of one run")
    acc.add_argument("--mean", type=_at_least_one, default=None, help="E[K] of the search (>= 1)")
    acc.add_argument("--distribution", default=None,
                     choices=["geometric", "logarithmic", "poisson", "truncated_negative_binomial",
                              "binomial"],
                     help="law of the secret number of trials K (default: the default law of "
                          "search='random_stopping', its η included)")
    acc.add_argument("--shape", type=_finite_float, default=None,
                     help="η of the truncated negative binomial, or m (draws) of the binomial")
    acc.add_argument("--json", action="store_true")
    acc.set_defaults(func=_cmd_account)

    led = sub.add_parser("ledger", help="inspect privacy ledgers")
    led_sub = led.add_subparsers(dest="ledger_command", required=True)
    show = led_sub.add_parser("show", help="budget, spend and charges of a ledger journal")
    show.add_argument("journal", help="a journal file or postgresql://host:port/db?ledger=NAME")
    show.add_argument("--json", action="store_true")
    show.add_argument("--lock", action="store_true", help="open with the writer lock (no live ledger)")
    show.set_defaults(func=_cmd_ledger_show)
    ver = led_sub.add_parser(
        "verify", help="check a journal's integrity without changing it (exit 0 ok, 2 corrupted)"
    )
    ver.add_argument("journal", help="a journal file or postgresql://host:port/db?ledger=NAME")
    ver.add_argument("--json", action="store_true")
    ver.add_argument("--quick", action="store_true",
                     help="skip recomputing the stored RDP curves (checksums, chain, seal only)")
    ver.set_defaults(func=_cmd_ledger_verify)
    lst = led_sub.add_parser("list", help="every ledger journal under a directory")
    lst.add_argument("dir", nargs="?", default=None,
                     help="folder to search (default: ~/.raydp_hpo/ledgers, ~/raydp_results or "
                          "$RAYDP_HPO_STORAGE, and ./raydp_results)")
    lst.set_defaults(func=_cmd_ledger_list)
    mig = led_sub.add_parser(
        "migrate", help="move a journal file into a PostgreSQL ledger, chain intact (once)"
    )
    mig.add_argument("journal", help="the version-2 journal file (stop its ledger first)")
    mig.add_argument("uri", help="postgresql://host:port/db?ledger=NAME (a new ledger; "
                                 "credentials from PGUSER/PGPASSWORD, ~/.pgpass or PGSERVICE)")
    mig.set_defaults(func=_cmd_ledger_migrate)
    ini = led_sub.add_parser(
        "init", help="create or upgrade the PostgreSQL ledger schema and grant roles (as owner)")
    ini.add_argument("uri", help="postgresql://host:port/db (run as the database owner)")
    ini.add_argument("--role", action="append", metavar="NAME",
                     help="a role that charges ledgers (repeatable)")
    ini.add_argument("--read-only-role", action="append", metavar="NAME",
                     help="a role that only reads them: ledger show, dashboards (repeatable)")
    ini.set_defaults(func=_cmd_ledger_init)

    demo = sub.add_parser("demo", help="run the main job on the built-in default")
    demo.add_argument("--quick", action="store_true", help="smaller run (for smoke tests)")
    demo.add_argument("--accounting", action="store_true",
                      help="accounting walkthrough only (no training)")
    demo.add_argument("--storage-path", default=None, help="where the run directory goes")
    demo.set_defaults(func=_cmd_demo)

    run = sub.add_parser("run", help="run an experiment file (YAML)")
    run.add_argument("experiment", help="path to EXPERIMENT.yaml")
    run.add_argument("--storage-path", default=None, help="override the file's storage_path")
    run.add_argument("--dry-run", action="store_true", help="validate the file only")
    run.add_argument("--num-cpus", type=_positive_int, default=None,
                     help="CPUs of the local Ray this run starts (default: every core; "
                          "ignored when RAY_ADDRESS names a cluster)")
    run.add_argument("--ray-temp-dir", default=None,
                     help="temp/session dir of the local Ray this run starts (default /tmp/ray)")
    run.add_argument("--resume", action="store_true",
                     help="continue an interrupted run of this experiment (nothing is re-charged)")
    run.add_argument("--progress-interval", type=_positive_float, default=5.0,
                     help="seconds between progress lines")
    run.set_defaults(func=_cmd_run)

    sch = sub.add_parser("schema", help="print the JSON Schema of experiment files (for "
                                        "editors that complete and check YAML)")
    sch.add_argument("--kind", choices=("experiment", "federated", "any"), default="experiment",
                     help="experiment files (`run`), federated experiment files (`federated "
                          "--config`), or any of them (a file with `kind:` is federated)")
    sch.add_argument("--output", default=None, help="write it to this file instead")
    sch.set_defaults(func=_cmd_schema)

    fed = sub.add_parser(
        "federated", add_help=False,
        help="federated averaging with adaptive (ADADP) client learning rates on Ray; not DP "
             "(raydp-hpo federated --help for its options, or --config FILE.yaml)")
    fed.add_argument("args", nargs=argparse.REMAINDER)
    fed.set_defaults(func=_cmd_federated)

    rep = sub.add_parser("report", help="certificate, plots and report.md of a run dir")
    rep.add_argument("run_dir", help="<storage_path>/<experiment>")
    rep.add_argument("--out", default=None, help="output dir (default RUN_DIR/report)")
    rep.add_argument("--json", action="store_true", help="print release.json instead of report.md")
    rep.set_defaults(func=_cmd_report)

    pub = sub.add_parser("publish", help="copy exactly the public part of a finished run "
                                         "(release, certificate, model) into a new folder")
    pub.add_argument("run_dir", help="<storage_path>/<experiment> of a run that released")
    pub.add_argument("out_dir", help="new or empty folder outside the run dir")
    pub.set_defaults(func=_cmd_publish)

    aud = sub.add_parser("audit", help="empirical privacy audit of the search algorithms")
    aud.add_argument("--algorithm", action="append", default=[],
                     help="audit only this algorithm, or dpsgd_step for the DP-SGD training "
                          "step itself, or client_dp_fedavg for client-level DP FedAvg's "
                          "server release (repeatable; default: all of them)")
    aud.add_argument("--runs", type=_positive_int, default=2000,
                     help="fresh searches per neighbouring dataset (default 2000)")
    aud.add_argument("--selection-runs", type=_positive_int, default=None,
                     help="searches per dataset that choose the events (default runs/2)")
    aud.add_argument("--alpha", type=_probability, default=0.05,
                     help="1 - confidence of each lower bound (default 0.05)")
    aud.add_argument("--skip-properties", action="store_true",
                     help="only the lower bounds, no property checks")
    aud.add_argument("--json", action="store_true")
    aud.set_defaults(func=_cmd_audit)
    from raydp_hpo.dashboard import server as dashboard  # the web libraries load on use only

    dashboard.add_parser(sub, dashboard.serve)
    for name, subparser in [*sub.choices.items(), *led_sub.choices.items()]:
        if name != "federated":  # federated parses its own options
            subparser.allow_abbrev = False
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["federated"]:  # its own options (python -m raydp_hpo.trainables.federated)
        argv = ["federated", "--", *argv[1:]]
    parser = _build_parser()
    if argv[:1] != ["federated"]:
        argv = _attach_negative_values(argv, _value_flags(parser))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse printed usage and the error (or --help): its code
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    from raydp_hpo.cli.warning_lines import one_line_warnings

    try:
        with one_line_warnings():  # each warning once, as one [raydp-hpo] WARNING line
            return int(args.func(args))
    except (BudgetExhaustedError, BudgetTooSmallError) as exc:
        print(f"raydp-hpo: budget: {exc}", file=sys.stderr)
        return EXIT_BUDGET_EXHAUSTED
    except (RayDPHPOError, ValueError) as exc:
        print(f"raydp-hpo: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
