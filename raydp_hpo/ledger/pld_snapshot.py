"""PLD snapshots: the composed PLD of a journal's first charges, stored beside it for restarts.

One concern: writing and reading ``<journal>.pld``, a cache bound to the journal's chain hash
(see :func:`pld_snapshot_path`); a snapshot that does not match is ignored and the PLD rebuilt.
Only PLD and BEST halting (and reports) build a PLD at all.
"""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydp_hpo.errors import RayDPHPOError
from raydp_hpo.ledger.curve_checks import CurveCheck
from raydp_hpo.ledger.journal import Journal

if TYPE_CHECKING:
    from raydp_hpo.accounting.pld import PldComposer
    from raydp_hpo.ledger.filter import PrivacyLedger

__all__ = ["PLD_SNAPSHOT_EVERY", "pld_snapshot_path", "read_pld_snapshot", "write_pld_snapshot"]

#: A ledger with a PLD stores it beside the journal every this many charges, and at close.
PLD_SNAPSHOT_EVERY = 256


def pld_snapshot_path(journal: str | Path) -> Path:
    """Where a ledger stores the PLD snapshot of ``journal``: ``<journal>.pld``.

    The snapshot is a cache for restarts (PLD and BEST halting): the composed PLD of the first
    n charges, bound to the journal's header hash, n, and the chain hash after n records, with
    a SHA-256 of its contents. It is used only when all of these match the journal being
    opened; otherwise it is ignored and the PLD rebuilt. Deleting it is always safe.
    """
    p = Path(journal)
    return p.with_name(p.name + ".pld")


def _snapshot_seq_candidates(data: bytes, charges: int) -> list[int]:
    """The record count a snapshot claims (read from its metadata, checked later);
    ``charges`` is the ledger's record count (charges and release markers)."""
    try:
        head = data.split(b"\n", 2)[1]
        seq = int(json.loads(head)["binding"]["seq"])
    except (IndexError, ValueError, KeyError, TypeError):
        return []
    return [seq] if 0 < seq <= charges else []


def _records_through(ledger: PrivacyLedger, charges: int) -> int:
    """The number of records up to and including the ``charges``-th charge (its seq): the
    same number unless release markers, which are records but no charges, come between."""
    return ledger._charges[charges - 1].seq if charges else 0


def pld_binding(ledger: PrivacyLedger, seq: int) -> dict[str, Any] | None:
    """What a PLD snapshot ending with record ``seq`` (a charge's) is bound to: the journal's
    header hash and its chain hash after ``seq`` records (None without a version-2 journal)."""
    if isinstance(ledger._journal, Journal):
        if ledger._journal.version != 2:
            return None
        chains = ledger._journal.scan.chains
        head_seq, head = ledger._journal.head
        if seq == head_seq:
            return {"header": chains[0], "seq": seq, "chain": head}
    else:
        chains = ledger._replayed_chains
    if not chains or seq >= len(chains):
        return None
    return {"header": chains[0], "seq": seq, "chain": chains[seq]}


def read_pld_snapshot(ledger: PrivacyLedger) -> tuple[PldComposer | None, int]:
    """The composer stored beside the journal and the number of charges it covers, or
    (None, 0). Used only if it is bound to this journal's chain at its record count and
    its PLD-capable count matches those records: a stale, foreign or damaged snapshot is
    ignored (the PLD is then rebuilt from every charge)."""
    from raydp_hpo.accounting.pld import PldComposer, has_pld

    if not isinstance(ledger._source, Path) or ledger._curve_check is CurveCheck.EAGER:
        return None, 0  # EAGER trusts nothing derived: the PLD is rebuilt from the charges
    try:
        data = pld_snapshot_path(ledger._source).read_bytes()
    except OSError:
        return None, 0
    for records in _snapshot_seq_candidates(data, ledger._records):
        seq = sum(c.seq <= records for c in ledger._charges)  # the charges it covers
        if seq == 0 or _records_through(ledger, seq) != records:
            continue  # not bound to a charge's record
        binding = pld_binding(ledger, records)
        if binding is None:
            continue
        composer = PldComposer.from_snapshot(data, binding)
        if composer is None:
            continue
        if composer.folded_count != sum(has_pld(c.mechanism) for c in ledger._charges[:seq]):
            continue
        ledger._pld_snapshot_seq = seq
        return composer, seq
    return None, 0


def write_pld_snapshot(ledger: PrivacyLedger) -> None:
    """Store the folded PLD beside the journal (atomically; a cache: failures only warn)."""
    if (not isinstance(ledger._journal, Journal) or ledger._pld_composer is None
            or ledger._journal.closed):
        return  # a PostgreSQL ledger keeps no snapshot file
    seq = len(ledger._charges)
    binding = pld_binding(ledger, _records_through(ledger, seq))
    if binding is None:
        return
    path = pld_snapshot_path(ledger._journal.path)
    tmp = path.with_name(f".{path.name}.tmp-{threading.get_ident()}")
    try:
        tmp.write_bytes(ledger._pld_composer.snapshot(binding))
        tmp.replace(path)
        ledger._pld_snapshot_seq = seq
    except (OSError, RayDPHPOError) as exc:
        warnings.warn(f"journal {ledger._journal.path}: PLD snapshot not written ({exc}); the "
                      "next restart rebuilds the PLD", RuntimeWarning, stacklevel=3)
