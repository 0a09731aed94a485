"""The ledger's journal under damage: corruption at every position, truncation, empty and
header-only files, torn tails, deleted or replaced journals under a live ledger, forged
records, version-1 journals, stored RDP curves, `ledger verify`, and restart time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from raydp_hpo.accounting import rdp as rdp_module
from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Gaussian, SubsampledGaussian, mechanism_to_dict
from raydp_hpo.accounting.rdp import rdp_profile
from raydp_hpo.cli.main import EXIT_BAD_INPUT, EXIT_OK, main
from raydp_hpo.errors import (
    JournalReplacedError,
    LedgerClosedError,
    LedgerCorruptedError,
    LedgerMismatchError,
    RayDPHPOError,
)
from raydp_hpo.ledger.filter import ORDERS_FINGERPRINT, CurveCheck, PrivacyLedger
from raydp_hpo.ledger.journal import Journal, read_journal, scan_journal, seal_path

BUDGET = PrivacyBudget(3.0, 1e-5)
CHEAP = Gaussian(20.0)  # ~0.03 ε per charge under the filter: many fit in the budget


def _journal(tmp_path: Path, n: int = 5, mech=CHEAP) -> tuple[Path, float]:
    path = tmp_path / "ledger.journal"
    with PrivacyLedger(BUDGET, path) as ledger:
        for i in range(n):
            ledger.charge(f"c{i}", mech, owner="o")
        return path, ledger.spent()


def _line_starts(raw: bytes) -> list[int]:
    starts = [0]
    for i, b in enumerate(raw):
        if b == 0x0A and i + 1 < len(raw):
            starts.append(i + 1)
    return starts


def _files(tmp_path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(tmp_path.iterdir()) if p.is_file()}


# -- corruption at every position ----------------------------------------------------------
@pytest.mark.parametrize("line", [1, 2, 4, 6], ids=["header", "first", "middle", "last"])
@pytest.mark.parametrize("damage", ["edit", "flip"])
def test_a_bad_complete_line_is_corruption_at_any_position(
    tmp_path: Path, line: int, damage: str
) -> None:
    """Old code: a bad *last* complete record was taken for a torn write and cut off."""
    path, _ = _journal(tmp_path)
    raw = bytearray(path.read_bytes())
    start = _line_starts(bytes(raw))[line - 1]
    end = raw.index(b"\n", start)
    if damage == "edit":  # still valid JSON: what a forger (or a bit in a digit) does
        old, new = (b'"epsilon":3.0', b'"epsilon":9.0') if line == 1 else (b'"o"', b'"p"')
        at = raw.index(old, start, end)
        raw[at : at + len(old)] = new
    else:
        raw[(start + end) // 2] ^= 0x04
    path.write_bytes(bytes(raw))
    before = _files(tmp_path)
    for opener in (lambda: PrivacyLedger(BUDGET, path), lambda: PrivacyLedger.open(path),
                   lambda: PrivacyLedger.read_only(path)):
        with pytest.raises(LedgerCorruptedError) as err:
            opener()
        msg = str(err.value)
        assert str(path) in msg and f"line {line}" in msg and f"byte offset {start}" in msg
    assert _files(tmp_path) == before  # nothing cut, moved or written


def test_header_only_and_header_less(tmp_path: Path) -> None:
    path, _ = _journal(tmp_path, n=0)
    with PrivacyLedger.open(path) as ledger:
        assert ledger.charges() == () and ledger.budget == BUDGET
    with pytest.raises(LedgerMismatchError, match="budget"):
        PrivacyLedger(PrivacyBudget(30.0, 1e-5), path)
    header = path.read_bytes()
    for data, words in [(header[:-1], "no complete header"),  # torn header (no newline)
                        (header[:20], "no complete header"),
                        (b'{"kind":"charge","seq":1}\n', "header")]:
        path.write_bytes(data)
        with pytest.raises(LedgerCorruptedError, match=words):
            PrivacyLedger(BUDGET, path)
        assert path.read_bytes() == data


def test_empty_journal_is_an_error_not_a_fresh_budget(tmp_path: Path) -> None:
    """Old code: a 0-byte journal opened as a new ledger with the full budget."""
    path = tmp_path / "ledger.journal"
    path.write_bytes(b"")
    for opener in (lambda: PrivacyLedger(BUDGET, path), lambda: PrivacyLedger.open(path),
                   lambda: PrivacyLedger.read_only(path), lambda: read_journal(path)):
        with pytest.raises(LedgerCorruptedError, match="empty"):
            opener()
    assert path.read_bytes() == b""


def test_journal_appears_with_its_header_only(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.journal"
    with PrivacyLedger(BUDGET, path):
        header, records = read_journal(path)
        assert header is not None and header["budget"] == BUDGET.to_dict() and records == []
        # no temporary file is left behind
        assert sorted(p.name for p in path.parent.iterdir()) == [
            "ledger.journal", "ledger.journal.seal"]


# -- truncation and torn tails ----------------------------------------------------------------
@pytest.mark.parametrize("where", ["inside record 3", "at a line boundary"])
def test_truncated_journal_is_an_error(tmp_path: Path, where: str) -> None:
    """Old code: a journal cut inside record 3 of 5 opened with 2 charges and was then cut
    back for good ("torn last record")."""
    path, _ = _journal(tmp_path)
    raw = path.read_bytes()
    starts = _line_starts(raw)
    cut = starts[3] + 40 if where == "inside record 3" else starts[3]
    path.write_bytes(raw[:cut])
    before = _files(tmp_path)
    for opener in (lambda: PrivacyLedger.open(path), lambda: PrivacyLedger.read_only(path)):
        with pytest.raises(LedgerCorruptedError, match="5 were written") as err:
            opener()
        assert "has 2 complete charge records" in str(err.value)
    assert _files(tmp_path) == before


def test_torn_tail_is_moved_to_a_side_file(tmp_path: Path) -> None:
    """Old code: the torn bytes were truncated away on open (destroyed)."""
    path, spent = _journal(tmp_path, n=2)
    clean = path.read_bytes()
    torn = b'{"charge_id":"c2","epsilon_after":0.1,"kind":"charge","mech'  # crash mid-write
    with open(path, "ab") as fh:
        fh.write(torn)
    with pytest.warns(RuntimeWarning, match="moved to") as rec:
        ledger = PrivacyLedger.open(path)
    side = [p for p in tmp_path.iterdir() if p.name.startswith("ledger.journal.torn-")]
    assert len(side) == 1 and str(side[0]) in str(rec[0].message)
    assert side[0].read_bytes() == torn and path.read_bytes() == clean
    assert ledger.spent() == spent and len(ledger.charges()) == 2
    ledger.charge("c2", CHEAP)  # appends cleanly after the last complete record
    ledger.close()
    assert [c.charge_id for c in PrivacyLedger.read_only(path).charges()] == ["c0", "c1", "c2"]


def test_reader_skips_a_torn_tail_without_touching_it(tmp_path: Path) -> None:
    path, spent = _journal(tmp_path, n=2)
    with open(path, "ab") as fh:
        fh.write(b'{"charge_id":"c2"')
    before = _files(tmp_path)
    with pytest.warns(RuntimeWarning, match="incomplete final line"):
        assert PrivacyLedger.read_only(path).spent() == spent
    assert _files(tmp_path) == before


# -- a journal deleted or replaced under a live ledger -------------------------------------------
def _spend_all(ledger: PrivacyLedger, prefix: str) -> int:
    n = 0
    while ledger.try_charge(f"{prefix}{n}", SubsampledGaussian(1.0, 0.01, 500)).admitted:
        n += 1
    return n


def test_deleted_journal_under_a_live_ledger(tmp_path: Path) -> None:
    """Old code: a second ledger opened a fresh file at the path with the whole budget again,
    and the first kept appending to the deleted file."""
    path = tmp_path / "ledger.journal"
    first = PrivacyLedger(BUDGET, path)
    first.charge("a", CHEAP)
    first_spent = first.spent()
    os.unlink(path)
    with pytest.raises(LedgerCorruptedError, match="deleted or moved"):
        PrivacyLedger(BUDGET, path)  # the seal remembers: no fresh budget under this name
    assert not path.exists()
    with pytest.raises(JournalReplacedError, match="deleted"):
        first.try_charge("b", CHEAP)
    assert first.spent() == first_spent and len(first.charges()) == 1
    with pytest.raises(JournalReplacedError):  # and it stays refused
        first.try_charge("b", CHEAP)
    first.close()


@pytest.mark.parametrize("replacement", ["copy", "fresh journal"])
def test_replaced_journal_under_a_live_ledger_never_doubles_the_budget(
    tmp_path: Path, replacement: str
) -> None:
    path = tmp_path / "ledger.journal"
    first = PrivacyLedger(BUDGET, path)
    admitted_first = _spend_all(first, "a")
    assert admitted_first > 0
    other = tmp_path / "elsewhere" / "x.journal"
    if replacement == "copy":
        other.parent.mkdir()
        shutil.copyfile(path, other)
    else:
        PrivacyLedger(BUDGET, other).close()
    os.replace(other, path)  # rename over the live journal
    replaced = path.read_bytes()
    with pytest.raises(JournalReplacedError, match="replaced"):
        first.try_charge("late", CHEAP)
    assert path.read_bytes() == replaced
    if replacement == "fresh journal":
        with pytest.raises(LedgerCorruptedError, match="replaced"):
            PrivacyLedger(BUDGET, path)
    else:
        with PrivacyLedger(BUDGET, path) as second:
            admitted_second = _spend_all(second, "b")
            assert admitted_second == 0 and second.spent() == first.spent()
    first.close()


def test_foreign_append_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.journal"
    with PrivacyLedger(BUDGET, path) as ledger:
        ledger.charge("a", CHEAP)
        with open(path, "ab") as fh:  # someone writes without the lock
            fh.write(b"{}\n")
        with pytest.raises(JournalReplacedError, match="changed size"):
            ledger.charge("b", CHEAP)
        assert len(ledger.charges()) == 1


def test_lock_is_per_open_file_and_survives_readers(tmp_path: Path) -> None:
    path, _ = _journal(tmp_path, n=1)
    with PrivacyLedger.open(path) as ledger:
        PrivacyLedger.read_only(path)  # opening and closing the file elsewhere in the process
        scan_journal(path)
        with pytest.raises(RayDPHPOError, match="already open"):
            PrivacyLedger.open(path)  # ... does not release the writer's lock
        ledger.charge("x", CHEAP)


# -- clear messages ----------------------------------------------------------------------------
def test_charging_a_closed_ledger(tmp_path: Path) -> None:
    """Old code: ValueError "seek of closed file"."""
    path, _ = _journal(tmp_path, n=1)
    ledger = PrivacyLedger.open(path)
    ledger.close()
    before = path.read_bytes()
    with pytest.raises(LedgerClosedError, match=f"closed.*{path}|{path}.*closed"):
        ledger.try_charge("x", CHEAP)
    assert ledger.spent() > 0 and path.read_bytes() == before  # reading still works


def _v1_line(record: dict) -> bytes:
    """A record as raydp-hpo ≤ 0.1 wrote it (CRC-32 of the canonical JSON, no chain)."""
    canon = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return (json.dumps({**record, "crc": zlib.crc32(canon.encode())}, sort_keys=True,
                       separators=(",", ":")) + "\n").encode()


def _v1_journal(path: Path, mechanisms: list) -> None:
    lines = [_v1_line({"kind": "header", "version": 1, "budget": BUDGET.to_dict(),
                       "adaptivity": "adaptive", "accountant": "rdp", "created": 1.0})]
    for i, mech in enumerate(mechanisms, start=1):
        lines.append(_v1_line({"kind": "charge", "seq": i, "charge_id": f"v{i}", "owner": "",
                               "time": 2.0, "mechanism": mech, "epsilon_after": 0.1}))
    path.write_bytes(b"".join(lines))


def test_forged_record_names_path_and_line(tmp_path: Path) -> None:
    """Old code: an InvalidParameterError naming neither the journal nor the line."""
    path = tmp_path / "v1.journal"
    good = mechanism_to_dict(CHEAP)
    _v1_journal(path, [good, {"type": "gaussian", "noise_multiplier": -1.0, "count": 1}])
    with pytest.raises(LedgerCorruptedError, match=f"{path}: line 3 \\(record 2"):
        PrivacyLedger.open(path)
    # the same in a version-2 journal: a record with a valid chain that no ledger wrote
    path2 = tmp_path / "v2.journal"
    header = {**_settings(), "created": 1.0, "rdp_orders": ORDERS_FINGERPRINT}
    journal = Journal.open(path2, create_header=header)
    journal.append_charge({"charge_id": "x", "owner": "", "time": 1.0, "epsilon_after": 0.1,
                           "mechanism": {"type": "nonsense"}})
    journal.close()
    with pytest.raises(LedgerCorruptedError, match=f"{path2}: line 2 \\(record 1, byte offset"):
        PrivacyLedger.read_only(path2)


def test_version_1_journal_still_opens_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "v1.journal"
    _v1_journal(path, [mechanism_to_dict(CHEAP)] * 2)
    with PrivacyLedger.open(path) as ledger:
        assert ledger.spent() == pytest.approx(
            PrivacyLedger(BUDGET).epsilon_if_charged(Gaussian(20.0, 2)), rel=1e-12)
        ledger.charge("v3", CHEAP)
    lines = path.read_bytes().splitlines()
    assert len(lines) == 4 and b'"crc"' in lines[-1] and b'"chain"' not in lines[-1]
    assert [c.charge_id for c in PrivacyLedger.read_only(path).charges()] == ["v1", "v2", "v3"]
    raw = bytearray(path.read_bytes())
    raw[raw.rindex(b'"v3"') + 2] = ord("4")  # a changed byte in the last complete record
    path.write_bytes(bytes(raw))
    with pytest.raises(LedgerCorruptedError, match="line 4"):
        PrivacyLedger.open(path)


def _settings() -> dict:
    return {"budget": BUDGET.to_dict(), "adaptivity": "adaptive", "accountant": "rdp"}


# -- stored RDP curves -------------------------------------------------------------------------
def _write_with_curve(path: Path, mech, values: np.ndarray, orders: str = ORDERS_FINGERPRINT
                      ) -> None:
    import base64

    header = {**_settings(), "created": 1.0, "rdp_orders": orders}
    journal = Journal.open(path, create_header=header)
    journal.append_charge({
        "charge_id": "c", "owner": "", "time": 1.0, "epsilon_after": 0.1,
        "mechanism": mechanism_to_dict(mech),
        "rdp": {"orders": orders, "side_epsilon": 0.0, "side_delta": 0.0,
                "f64le": base64.b64encode(np.asarray(values, "<f8").tobytes()).decode()},
    })
    journal.close()


def test_reopen_sums_stored_curves(tmp_path: Path) -> None:
    path = tmp_path / "ledger.journal"
    true = rdp_profile(CHEAP).values
    _write_with_curve(path, CHEAP, 2 * true)  # above the truth: conservative, kept as charged
    with PrivacyLedger.open(path, curve_check=CurveCheck.EAGER) as ledger:
        assert ledger.verify_stored_curves() == ()
        assert ledger.spent() == pytest.approx(
            PrivacyLedger(BUDGET).epsilon_if_charged(Gaussian(20.0, 2)), rel=1e-12)


@pytest.mark.parametrize("check", list(CurveCheck))
def test_a_stored_curve_below_the_mechanism_is_caught_and_added(
    tmp_path: Path, check: CurveCheck
) -> None:
    path = tmp_path / "ledger.journal"
    true = rdp_profile(CHEAP).values
    _write_with_curve(path, CHEAP, 0.5 * true)
    with pytest.warns(RuntimeWarning, match="below what Gaussian gives"):
        ledger = PrivacyLedger.open(path, curve_check=check)  # the last record is spot-checked
    issues = ledger.verify_stored_curves()
    assert len(issues) == 1 and "'c'" in issues[0]
    assert ledger.spent() >= PrivacyLedger(BUDGET).epsilon_if_charged(CHEAP) - 1e-12
    ledger.close()
    assert main(["ledger", "verify", str(path)]) == EXIT_BAD_INPUT


def test_curves_on_another_order_grid_are_recomputed(tmp_path: Path) -> None:
    path = tmp_path / "ledger.journal"
    _write_with_curve(path, CHEAP, np.zeros(304), orders="another-grid")
    with PrivacyLedger.open(path) as ledger:
        assert ledger.curves_verified
        assert ledger.spent() == pytest.approx(
            PrivacyLedger(BUDGET).epsilon_if_charged(CHEAP), rel=1e-12)


def _distinct(n: int, seed: int = 0) -> list[SubsampledGaussian]:
    rng = np.random.default_rng(seed)
    return [SubsampledGaussian(float(rng.uniform(5, 50)), float(rng.uniform(0.001, 0.05)),
                               int(rng.integers(50, 2000))) for _ in range(n)]


def _clear_rdp_caches() -> None:
    rdp_module._rdp_cached.cache_clear()  # noqa: SLF001 - a fresh process has no cache
    rdp_module._subsampled_gaussian_rdp_cached.cache_clear()  # noqa: SLF001


def _charge_then_reopen(tmp_path: Path, n: int) -> tuple[float, float]:
    path = tmp_path / "ledger.journal"
    _clear_rdp_caches()
    start = time.perf_counter()
    with PrivacyLedger(PrivacyBudget(1e6, 1e-5), path) as ledger:
        for i, mech in enumerate(_distinct(n)):
            ledger.charge(f"c{i}", mech)
        spent = ledger.spent()
    charging = time.perf_counter() - start
    _clear_rdp_caches()
    start = time.perf_counter()
    with PrivacyLedger.open(path) as again:
        reopening = time.perf_counter() - start
        assert again.spent() == spent
    return charging, reopening


def test_reopen_does_not_recompute_every_curve(tmp_path: Path) -> None:
    """Old code recomputed every curve on open: reopening took about as long as charging."""
    charging, reopening = _charge_then_reopen(tmp_path, 40)
    assert reopening < 0.5 * charging, (charging, reopening)


@pytest.mark.slow
def test_reopen_after_2000_distinct_charges_is_fast(tmp_path: Path) -> None:
    charging, reopening = _charge_then_reopen(tmp_path, 2000)
    assert reopening < 2.0, (charging, reopening)


# -- the CLI -----------------------------------------------------------------------------------
def test_ledger_verify_cli(tmp_path: Path, capsys) -> None:
    path, spent = _journal(tmp_path)
    before = _files(tmp_path)
    assert main(["ledger", "verify", str(path)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "ok" in out and "5 charge records" in out and "vouches for 5" in out
    assert main(["ledger", "verify", str(path), "--json", "--quick"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["charges"] == 5 and report["spent_epsilon"] == spent
    with open(path, "ab") as fh:
        fh.write(b'{"charge')
    assert main(["ledger", "verify", str(path)]) == EXIT_OK
    assert "torn tail   8 bytes" in capsys.readouterr().out
    raw = bytearray(path.read_bytes())
    raw[raw.index(b'"c3"') + 2] = ord("9")
    path.write_bytes(bytes(raw))
    before = _files(tmp_path)
    assert main(["ledger", "verify", str(path)]) == EXIT_BAD_INPUT
    out = capsys.readouterr().out
    assert "CORRUPTED" in out and "line 5" in out and str(path) in out
    assert _files(tmp_path) == before  # verify changes nothing
    assert main(["ledger", "verify", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "is a directory" in capsys.readouterr().err


def test_ledger_show_on_a_directory(tmp_path: Path, capsys) -> None:
    """Old code: an IsADirectoryError traceback."""
    assert main(["ledger", "show", str(tmp_path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "is a directory" in err and "ledger list" in err


# -- a writer killed at the worst moments ------------------------------------------------------
_KILLER = textwrap.dedent("""
    import os, signal, sys
    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.ledger.filter import PrivacyLedger
    from raydp_hpo.accounting.mechanisms import Gaussian
    path, when, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ledger = PrivacyLedger(PrivacyBudget(3.0, 1e-5), path)
    real_write, real_fsync, n = os.write, os.fsync, [0]
    def write(fd, data):  # the journal's append: die after writing half of record `at`
        if when == "write" and n[0] == at:
            real_write(fd, bytes(data[: len(data) // 2]))
            os.kill(os.getpid(), signal.SIGKILL)
        return real_write(fd, data)
    def fsync(fd):  # die inside the fsync of record `at` (its bytes are written)
        if when == "fsync" and n[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_fsync(fd)
    os.write, os.fsync = write, fsync
    for i in range(10):
        n[0] = i
        ledger.charge(f"c{i}", Gaussian(20.0))
        print(f"acked c{i}", flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("when", ["write", "fsync"])
def test_writer_killed_mid_append_loses_no_acknowledged_charge(tmp_path: Path, when: str) -> None:
    """SIGKILL at a chosen point of the append of record 4 (deterministic, no Ray: the ledger
    actor is this same code in a process). Every acknowledged charge must be in the journal;
    the one being written may be (its complete line counts: conservative) or not (a torn
    tail, moved to a side file)."""
    path = tmp_path / "ledger.journal"
    proc = subprocess.run([sys.executable, "-c", _KILLER, str(path), when, "4"],
                          capture_output=True, text=True, env={**os.environ,
                          "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == -9, proc.stderr
    acked = [line.split()[1] for line in proc.stdout.splitlines()]
    assert acked == ["c0", "c1", "c2", "c3"]
    with PrivacyLedger.open(path) as ledger:
        ids = [c.charge_id for c in ledger.charges()]
    assert ids[:4] == acked and ids in (acked, [*acked, "c4"])
    if when == "write":
        assert ids == acked and any(p.name.startswith("ledger.journal.torn-")
                                    for p in tmp_path.iterdir())
    else:
        assert ids == [*acked, "c4"]  # written, not acknowledged: counted (never undercounts)
    assert seal_path(path).exists()


def test_background_check_finishes_and_stops_on_close(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "ledger.journal"
    with PrivacyLedger(PrivacyBudget(1e6, 1e-5), path) as ledger:
        for i, mech in enumerate(_distinct(12, seed=1)):
            ledger.charge(f"c{i}", mech)
    _clear_rdp_caches()
    with PrivacyLedger.open(path) as ledger:  # 4 spot checks, 8 left to the thread
        assert ledger.verify_stored_curves() == () and ledger.curves_verified
    _clear_rdp_caches()
    ledger = PrivacyLedger.open(path)
    ledger.close()  # stops the thread after at most the curve it is computing
    assert not [t for t in threading.enumerate() if t.name == "ledger-curve-check"]


def test_a_torn_seal_slot_is_no_false_alarm(tmp_path: Path) -> None:
    path, spent = _journal(tmp_path, n=3)
    seal = seal_path(path)
    raw = bytearray(seal.read_bytes())
    raw[256 + 10] ^= 0x01  # the slot for 3 records (odd: second slot) is torn
    seal.write_bytes(bytes(raw))
    with PrivacyLedger.open(path) as ledger:  # the slot for 2 records still vouches
        assert ledger.spent() == spent
        ledger.charge("c3", CHEAP)
    raw = path.read_bytes()
    path.write_bytes(raw[: raw.rindex(b"\n", 0, len(raw) - 1) + 1])  # drop the last record
    with pytest.raises(LedgerCorruptedError, match="seal"):
        PrivacyLedger.open(path)


@pytest.mark.parametrize(("slots", "words"), [
    ((0, 1), ("no valid slot", "slot 1 is damaged", "slot 2 is damaged")),
    ((1,), ("slot 2 is damaged", "the other slot still vouches")),
])
def test_ledger_verify_reports_damaged_seal_slots(tmp_path: Path, capsys, slots: tuple[int, ...],
                                                  words: tuple[str, ...]) -> None:
    """A damaged seal slot is reported (exit 2, the seal file named), never "ok": with both
    slots gone the seal vouches for nothing and a truncation would go unnoticed."""
    path, _ = _journal(tmp_path, n=3)
    seal = seal_path(path)
    raw = bytearray(seal.read_bytes())
    for slot in slots:
        raw[slot * 256 + 10] ^= 0x01
    seal.write_bytes(bytes(raw))
    before = _files(tmp_path)
    assert main(["ledger", "verify", str(path)]) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert "CORRUPTED" in captured.out and str(seal) in captured.err
    assert all(w in captured.out for w in words), captured.out
    assert main(["ledger", "verify", str(path), "--json"]) == EXIT_BAD_INPUT
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"] and len(report["seal_problems"]) == len(slots) + (len(slots) == 2)
    assert _files(tmp_path) == before  # verify changes nothing
