"""The ``raydp-hpo ledger`` subcommands: ``show``, ``verify``, ``list``, ``migrate`` and ``init``.

One concern: what each ``ledger`` subcommand does with a journal file or a PostgreSQL ledger
(read-only replays, integrity checks, listings, migration and schema set-up). The parser that
routes to these handlers, and the exit-code handling around them, stay in
:mod:`raydp_hpo.cli.main`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raydp_hpo.cli.exit_codes import EXIT_BAD_INPUT, EXIT_OK
from raydp_hpo.errors import RayDPHPOError


def _cmd_ledger_show(args: argparse.Namespace) -> int:
    from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger
    from raydp_hpo.ledger.pg import is_postgres_uri, parse_uri

    path: Path | str = Path(args.journal)
    if is_postgres_uri(args.journal):
        path = parse_uri(args.journal).uri  # refuses a URI with a password
    # Default: read-only replay (no lock, no writes), so a live ledger's journal can be shown.
    # Stored curves are spot-checked only (`ledger verify` checks them all).
    check = CurveCheck.ON_DEMAND
    ledger = (PrivacyLedger.open(path, curve_check=check) if args.lock
              else PrivacyLedger.read_only(path, curve_check=check))
    report = ledger.report()
    ledger.close()
    print(json.dumps(report.to_dict(), indent=2) if args.json else f"ledger {path}\n{report.format()}")
    return EXIT_OK


def _cmd_ledger_verify(args: argparse.Namespace) -> int:
    """Check a journal without changing it: every line's checksum/chain and sequence, its seal,
    and (unless ``--quick``) every stored RDP curve against a recomputation."""
    from raydp_hpo.ledger.journal import inspect_seal, read_seal, scan_journal, seal_path
    from raydp_hpo.ledger.pg import is_postgres_uri, scan_ledger

    if is_postgres_uri(args.journal):
        return _verify_postgres(args, scan_ledger)
    path = Path(args.journal)
    result: dict[str, object] = {"journal": str(path)}
    checked = _scan_and_check(lambda: scan_journal(path), f"journal {path}", args, result)
    if isinstance(checked, int):
        return checked
    scan, ledger, issues = checked
    claim = read_seal(path)
    seal_problems = inspect_seal(path).problems()
    ok = not issues and not seal_problems
    stored = scan.header.get("rdp_orders") is not None
    result.update(
        ok=ok,
        version=scan.version,
        charges=len(ledger.charges()),
        releases=len(ledger.releases()),
        bytes=scan.end + (scan.torn.length if scan.torn else 0),
        seal_records=None if claim is None else claim.records,
        seal_problems=seal_problems,
        torn_tail=None if scan.torn is None else {"offset": scan.torn.offset,
                                                  "length": scan.torn.length},
        curves="not checked (--quick)" if args.quick else (
            "stored curves match a recomputation" if stored else "recomputed (none stored)"),
        curve_issues=list(issues),
        spent_epsilon=ledger.spent(),
        budget=ledger.budget.to_dict(),
    )
    if args.json:
        print(json.dumps(result))
    else:
        chain = "hash-chained" if scan.version >= 2 else "CRC-32 per record, no chain"
        lines = [
            f"journal {path}: {'ok' if ok else 'CORRUPTED'}",
            f"  format      version {scan.version} ({chain}), {len(ledger.charges())} charge "
            f"records{_releases_note(ledger)}",
            "  seal        " + (f"vouches for {claim.records} records ({seal_path(path)})"
                                if claim else "none (no truncation check)"),
            *(f"    DAMAGED: {problem}" for problem in seal_problems),
            "  torn tail   " + ("none" if scan.torn is None else
                                f"{scan.torn.length} bytes at byte offset {scan.torn.offset}: an "
                                "interrupted, never-acknowledged write (opening the ledger moves "
                                "it to a side file)"),
            f"  RDP curves  {result['curves'] if not issues else 'MISMATCH'}",
            *(f"    {issue}" for issue in issues),
            f"  spent       ε={ledger.spent():.4f} of ε={ledger.budget.epsilon:g} "
            f"(δ={ledger.budget.delta:g})",
        ]
        print("\n".join(lines))
    if seal_problems:  # also on stderr, where the CLI's errors go
        print(f"raydp-hpo: error: {'; '.join(seal_problems)}", file=sys.stderr)
    return EXIT_OK if ok else EXIT_BAD_INPUT


def _releases_note(ledger: Any) -> str:
    """', 2 run releases (markers: no charge)' when the ledger holds release markers."""
    n = len(ledger.releases())
    return f", {n} run release(s) (markers: no charge)" if n else ""


def _scan_and_check(scan_of: Callable[[], Any], label: str, args: argparse.Namespace,
                    result: dict[str, object]) -> tuple[Any, Any, tuple[str, ...]] | int:
    """``ledger verify``'s common part for a journal file and a PostgreSQL ledger: scan it,
    replay it, recompute its stored curves (unless ``--quick``); a corrupted one is printed
    and answers :data:`EXIT_BAD_INPUT`. Returns (scan, ledger, curve issues)."""
    from raydp_hpo.errors import LedgerCorruptedError
    from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger

    try:
        scan = scan_of()
        ledger = PrivacyLedger.from_scan(scan, curve_check=CurveCheck.ON_DEMAND)
        issues = () if args.quick else tuple(ledger.verify_stored_curves())
    except LedgerCorruptedError as exc:
        result.update(ok=False, reason=str(exc))
        print(json.dumps(result) if args.json else f"{label}: CORRUPTED\n  {exc}")
        return EXIT_BAD_INPUT
    return scan, ledger, issues


def _verify_postgres(args: argparse.Namespace, scan_ledger: Any) -> int:
    """``ledger verify`` of a PostgreSQL ledger: its rows are checked as journal lines (chain,
    seq) and against their ``seq``/``chain`` columns, then every stored curve (no seal: the
    database's transactions and the chain stand in for it)."""
    from raydp_hpo.ledger.pg import parse_uri

    uri = parse_uri(args.journal).uri
    result: dict[str, object] = {"journal": uri}
    checked = _scan_and_check(lambda: scan_ledger(uri), f"ledger {uri}", args, result)
    if isinstance(checked, int):
        return checked
    scan, ledger, issues = checked
    from raydp_hpo.ledger.pg import head_mac_status, ledger_head

    ok = not issues
    mac = head_mac_status(ledger_head(uri))  # scan_ledger has checked the head against the rows
    result.update(ok=ok, version=scan.version, charges=len(ledger.charges()),
                  releases=len(ledger.releases()), head=f"{len(scan.records)} records, matches the rows", head_mac=mac,
                  curve_issues=list(issues), spent_epsilon=ledger.spent(),
                  budget=ledger.budget.to_dict())
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join([
            f"ledger {uri}: {'ok' if ok else 'CORRUPTED'}",
            f"  format      version {scan.version} (hash-chained), {len(ledger.charges())} charge "
            f"records{_releases_note(ledger)} in PostgreSQL",
            f"  head        {result['head']}; MAC {mac}",
            f"  RDP curves  {'not checked (--quick)' if args.quick else 'MISMATCH' if issues else 'ok'}",
            *(f"    {issue}" for issue in issues),
            f"  spent       ε={ledger.spent():.4f} of ε={ledger.budget.epsilon:g} "
            f"(δ={ledger.budget.delta:g})",
        ]))
    return EXIT_OK if ok else EXIT_BAD_INPUT


def _cmd_ledger_migrate(args: argparse.Namespace) -> int:
    """Move a version-2 journal file into a new PostgreSQL ledger, chain intact (once)."""
    from raydp_hpo.ledger.pg import migrate_journal, parse_uri

    uri = parse_uri(args.uri).uri
    n = migrate_journal(args.journal, uri)
    print(f"migrated {n} charge record(s) from {args.journal} into {uri}; the journal file is "
          "unchanged: stop using it, charge through the URI from now on")
    return EXIT_OK


def _cmd_ledger_init(args: argparse.Namespace) -> int:
    """Create or upgrade the PostgreSQL ledger schema and grant the ledger roles."""
    from raydp_hpo.ledger.pg import init_ledger_database, parse_uri

    uri = parse_uri(args.uri, need_ledger=False).uri
    before, after = init_ledger_database(uri, roles=args.role or [],
                                         read_only_roles=args.read_only_role or [])
    done = "up to date" if before == after else "created" if before == 0 else "upgraded"
    print(f"ledger schema of {uri}: version {after} ({done}; was {before or 'none'})")
    for role in args.role or []:
        print(f"  {role}: SELECT, INSERT on the ledger tables, UPDATE of ledger heads (which only "
              "grow)")
    for role in args.read_only_role or []:
        print(f"  {role}: SELECT (read only)")
    return EXIT_OK


def _default_ledger_roots(actor_root: Path) -> list[Path]:
    """Where ledgers are created by default, each folder once: the ledger actor's default
    journal folder; the default storage of ``raydp-hpo run`` / DPTuner (``~/raydp_results``,
    or ``$RAYDP_HPO_STORAGE``), which holds dataset ledgers (``ledgers/*.journal``) and each
    experiment's dedicated ``ledger.journal``; ``~/raydp_results`` and the working dir's
    ``./raydp_results`` (the default before, and of runs made with the variable unset)."""
    from raydp_hpo._storage import default_storage_path, legacy_storage_paths

    roots: list[Path] = []
    for root in (actor_root, default_storage_path(), *legacy_storage_paths()):
        resolved = root.expanduser().resolve()
        if resolved not in roots:
            roots.append(resolved)
    return roots


def _cmd_ledger_list(args: argparse.Namespace) -> int:
    from raydp_hpo.ledger.actor import DEFAULT_NAMESPACE, default_journal_path
    from raydp_hpo.ledger.pg import is_postgres_uri, list_ledgers, parse_uri

    if args.dir and is_postgres_uri(args.dir):
        base = parse_uri(args.dir, need_ledger=False)
        targets: list[Path | str] = [base.with_ledger(name) for name in list_ledgers(base.uri)]
        if not targets:
            print(f"no ledgers in the database of {base.uri}")
            return EXIT_OK
        return _print_ledger_list(targets)
    if args.dir:
        if not Path(args.dir).is_dir():
            what = "is not a directory" if Path(args.dir).exists() else "does not exist"
            raise RayDPHPOError(
                f"ledger list: {args.dir!r} {what}; pass the folder that holds the journals "
                "(a run's storage_path, or ~/.raydp_hpo/ledgers)"
            )
        roots = [Path(args.dir)]
    else:
        roots = _default_ledger_roots(default_journal_path("x", DEFAULT_NAMESPACE).parent.parent)
    journals = sorted({p.resolve() for root in roots if root.is_dir()
                       for p in root.rglob("*.journal")})
    if not journals:
        where = " or ".join(str(r) for r in roots)
        print(f"no ledger journals under {where}; pass the storage path: "
              "raydp-hpo ledger list DIR")
        return EXIT_OK
    return _print_ledger_list(list(journals))


def _print_ledger_list(journals: list[Path | str]) -> int:
    from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger

    print(f"{'journal':<60} {'ε budget':>9} {'δ':>9} {'spent':>8} {'remaining':>9} {'charges':>7}")
    for path in journals:
        try:
            report = PrivacyLedger.read_only(path, curve_check=CurveCheck.ON_DEMAND).report()
        except RayDPHPOError as exc:
            print(f"{str(path):<60} unreadable: {exc}")
            continue
        print(
            f"{str(path):<60} {report.budget.epsilon:>9.4g} {report.budget.delta:>9.2g} "
            f"{report.spent_epsilon:>8.4f} {report.remaining_epsilon:>9.4f} "
            f"{len(report.charges):>7}"
        )
    return EXIT_OK
