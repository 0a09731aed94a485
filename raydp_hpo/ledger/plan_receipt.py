"""Plan receipts: a trial checks *locally* that the plan charge covering it is durable.

Why: a trial covered by an admitted plan used to ask the ledger actor ``has_charge(plan)``
before touching data — one actor round trip (plus a GCS look-up of the actor) per trial,
~3-5 ms, most of DPTuner's overhead on short trials. The answer never changes once the plan
is admitted (charges are never refunded), so the orchestrator asks once, after admitting the
plan, for a :class:`PlanReceipt`: where the plan's record lies in the ledger's journal. Every
plan-covered trial gets the receipt with its config and checks it against the journal file,
without any Ray call (:func:`check_receipt`).

The guarantee kept: **no trial touches data before the charge covering it is durable**
(written and ``fsync``'d in the journal). The argument, for a trial that is admitted by a
receipt (``ReceiptCheck.DURABLE``):

1. The seal of the journal (:mod:`raydp_hpo.ledger.journal`) is written only *after* the records it
   vouches for are ``fsync``'d. A seal claim of ``records ≥ seq`` with the journal's header
   hash therefore says that records ``1..seq`` of that journal are durable.
2. The bytes of the journal at the receipt's offset are one complete (newline-terminated)
   version-2 line whose chain hash is ``SHA-256(prev_chain ‖ body)`` (recomputed here) and
   whose body is a ``charge`` record with the receipt's ``seq`` and ``charge_id``. So the
   durable record number ``seq`` is the charge covering the trial (its charge id equals the
   trial's ``covered_by``).
3. When the seal's head is that very record (``records == seq``), its chain must equal the
   record's: the seal vouches for exactly these bytes.

Nothing in a receipt is trusted by itself: a forged or stale receipt (another charge id, a
sequence number or offset where that record is not, another journal) fails 2 or 3 and the
trial is refused (:class:`~raydp_hpo.errors.RayDPHPOError`); nothing is trained. Where the
local evidence is merely *missing* — the journal is not on this node's file system (a
multi-node cluster without shared storage), the seal is absent, or the seal lags (it is not
itself ``fsync``'d, so a power loss can leave it behind) — the check returns
``ReceiptCheck.ASK_LEDGER`` and the trial falls back to the ledger actor round trip, the
authoritative answer. Version-1 journals have no seal: they always fall back.

Trials not covered by a plan (they charge their own mechanism: adaptive searches, grids
composed trial by trial, a retry that pays again) still make their charge by a round trip:
their charge does not exist until the ledger admits it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError

__all__ = ["PlanReceipt", "ReceiptCheck", "check_receipt", "receipt_for"]

_HEX64 = frozenset("0123456789abcdef")


def _is_hash(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX64


@dataclass(frozen=True)
class PlanReceipt:
    """Where an admitted charge lies in its ledger's journal (version 2).

    Attributes:
        charge_id: the admitted charge (a plan's id, ``"<experiment>/plan"``).
        seq: its record number in the journal (1-based, as the journal counts).
        journal: absolute path of the journal file.
        offset, length: byte offset of the record's line and its length with the newline.
        prev_chain: the journal's chain hash before the record; ``chain`` the one after it.
        header: the journal's header hash (chain₀): identifies the journal its seal belongs to.
        delta: the ledger budget's δ (the figure a trial reports its own ε at).

    Nothing here is secret: a journal records configuration only.
    """

    charge_id: str
    seq: int
    journal: str
    offset: int
    length: int
    prev_chain: str
    chain: str
    header: str
    delta: float

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.charge_id, str) or not self.charge_id:
            problems.append(f"charge_id={self.charge_id!r} (a non-empty string)")
        for name, low in (("seq", 1), ("offset", 1), ("length", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                problems.append(f"{name}={value!r} (an integer >= {low})")
        if not isinstance(self.journal, str) or not os.path.isabs(self.journal):
            problems.append(f"journal={self.journal!r} (an absolute path)")
        for name in ("prev_chain", "chain", "header"):
            if not _is_hash(getattr(self, name)):
                problems.append(f"{name}={getattr(self, name)!r} (64 lower-case hex digits)")
        if not isinstance(self.delta, float) or not 0.0 <= self.delta < 1.0:
            problems.append(f"delta={self.delta!r} (a float in [0, 1))")
        if problems:
            raise InvalidParameterError(
                "invalid plan receipt: " + "; ".join(problems)
                + ". Receipts come from LedgerHandle.receipt(charge_id); do not write them by hand."
            )

    @classmethod
    def from_dict(cls, raw: Any) -> PlanReceipt:
        """A receipt from its dict form (``dataclasses.asdict``); unknown keys are errors."""
        if isinstance(raw, cls):
            return raw
        if not isinstance(raw, dict):
            raise InvalidParameterError(f"a plan receipt must be a dict, got {raw!r}")
        fields = set(cls.__dataclass_fields__)
        if set(raw) != fields:
            raise InvalidParameterError(
                f"plan receipt keys {sorted(raw)} differ from {sorted(fields)}"
            )
        return cls(**raw)


class ReceiptCheck(Enum):
    """What :func:`check_receipt` found."""

    #: the journal on this node durably holds the covering charge: no ledger round trip needed
    DURABLE = "durable"
    #: no local evidence either way (no journal here, no seal, seal behind): ask the ledger
    ASK_LEDGER = "ask_ledger"


def receipt_for(journal: str | os.PathLike[str], charge_id: str) -> PlanReceipt | None:
    """The receipt of admitted charge ``charge_id`` in ``journal`` (read and fully checked),
    or ``None`` where a receipt cannot be given (a version-1 journal, no such charge).

    Called by the ledger's owner (the ledger actor) after the charge was admitted, so the
    record is durable; the trial re-checks that against the file anyway."""
    from raydp_hpo.ledger.journal import scan_journal

    scan = scan_journal(journal)
    if scan.version != 2:
        return None
    for index, record in enumerate(scan.records):
        if record.get("charge_id") != charge_id:
            continue
        offset = scan.offsets[index]
        end = scan.offsets[index + 1] if index + 1 < len(scan.offsets) else scan.end
        budget = scan.header.get("budget") or {}
        return PlanReceipt(
            charge_id=charge_id,
            seq=int(record["seq"]),
            journal=str(Path(scan.path).resolve()),
            offset=offset,
            length=end - offset,
            prev_chain=scan.chains[index],
            chain=scan.chains[index + 1],
            header=scan.chains[0],
            delta=float(budget.get("delta", 0.0)),
        )
    return None


def _refuse(receipt: PlanReceipt, what: str) -> RayDPHPOError:
    return RayDPHPOError(
        f"plan receipt for charge {receipt.charge_id!r} (record {receipt.seq} of journal "
        f"{receipt.journal}) does not match the journal: {what}. The trial cannot show that "
        "the charge covering it is durable; nothing was trained."
    )


def check_receipt(receipt: PlanReceipt, covered_by: str) -> ReceiptCheck:
    """Check locally that ``receipt`` shows a durable charge ``covered_by`` (module docstring).

    Returns :attr:`ReceiptCheck.DURABLE` (the trial may proceed without the ledger) or
    :attr:`ReceiptCheck.ASK_LEDGER` (no local evidence: ask the ledger actor). Raises
    :class:`~raydp_hpo.errors.RayDPHPOError` when the journal contradicts the receipt.
    Reads the seal (two 256-byte slots) and one journal line; no Ray call.
    """
    from raydp_hpo.ledger.journal import _chain, _v2_split, read_seal

    if receipt.charge_id != covered_by:
        raise RayDPHPOError(
            f"the trial is covered by {covered_by!r} but its plan receipt is for "
            f"{receipt.charge_id!r}; nothing was trained"
        )
    path = Path(receipt.journal)
    claim = read_seal(path)  # before the journal: the seal never runs ahead of the file
    if claim is None:
        return ReceiptCheck.ASK_LEDGER  # not on this node, or no seal (version 1, removed)
    if claim.header != receipt.header:
        raise _refuse(receipt, "its seal belongs to a journal with another header")
    if claim.records < receipt.seq:
        return ReceiptCheck.ASK_LEDGER  # the seal lags (it is not fsync'd): no evidence
    try:
        with open(path, "rb") as fh:
            fh.seek(receipt.offset)
            line = fh.read(receipt.length)
    except FileNotFoundError:
        raise _refuse(receipt, "the journal is missing although its seal is there") from None
    except OSError as exc:
        raise _refuse(receipt, f"cannot read it ({exc.strerror or exc})") from None
    if len(line) != receipt.length or not line.endswith(b"\n"):
        raise _refuse(receipt, f"no complete line at byte offset {receipt.offset}")
    split = _v2_split(line[:-1])
    if split is None:
        raise _refuse(receipt, f"no journal record at byte offset {receipt.offset}")
    body, stored = split
    if stored != receipt.chain or _chain(receipt.prev_chain, body) != stored:
        raise _refuse(receipt, f"the record at byte offset {receipt.offset} has another chain hash")
    try:
        record = json.loads(body)
    except ValueError:
        raise _refuse(receipt, "the record is not valid JSON") from None
    if not (
        isinstance(record, dict)
        and record.get("kind") == "charge"
        and record.get("seq") == receipt.seq
        and record.get("charge_id") == receipt.charge_id
    ):
        raise _refuse(receipt, "the record there is another charge")
    if claim.records == receipt.seq and claim.chain != receipt.chain:
        raise _refuse(receipt, "the seal vouches for other bytes at that record")
    return ReceiptCheck.DURABLE
