"""One release per run: the marker a run claims on its ledger before it publishes anything.

A run's charges are named ``<experiment>@<run id>/...`` (:func:`~raydp_hpo.tune.ledger_rules.
charge_prefix`) and a resume proves the run id, so only the run that paid continues. That
proves *which* run continues, not that it releases once: a run directory copied (mid-run, or
after it finished) and resumed twice continues one run, under one charge, twice. Each copy
would publish its own selection (hyperparameters, model, certificate): two releases for one
charge, which the certificate does not cover (a second independent draw of the DP selection
is a second mechanism run on the data).

So before anything of a release is written (``public/``: release.json, the released model,
the certificate), the run claims its release on the ledger that holds its charge (a dataset
ledger's point, a shared ledger's charges, or its dedicated ledger):
:meth:`~raydp_hpo.ledger.filter.PrivacyLedger.claim_release` appends a ``release`` record
(``<experiment>@<run id>``, the time, host and ``public/`` folder, a nonce of this attempt)
in the same serialised step as an admission: the ledger actor runs one call at a time over a
journal it holds under an exclusive lock, and a PostgreSQL ledger takes the admission
transaction's advisory lock, absorbing every record others made, before deciding. Of any
number of copies racing, exactly one is granted; every other raises
:class:`~raydp_hpo.errors.ReleaseAlreadyPublishedError` and writes nothing to its
``public/`` (the first release is the one to use). The marker charges nothing: no ε, no δ,
no slot of a dataset ledger; the spend is unchanged either way.

Every release claims, a search that selected nothing too (its ``release.json`` saying
``"selected": false`` and why is that run's one release: a copy may not publish a selection
after it). A resume of a run whose release is on its ledger is refused up front, before any
trial runs (:func:`refuse_if_released`). A run that claimed and then crashed before
``public/`` was complete stays released: fail closed, it is never published twice; its
``where`` says where the first attempt was writing. A run's dedicated ledger lives in its run
directory, so a copy of such a run copies its ledger too: the marker then stops a resume of
the same directory after it released, not a copy (shared and dataset ledgers are where
copies meet).
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from raydp_hpo.errors import ReleaseAlreadyPublishedError

if TYPE_CHECKING:
    from raydp_hpo.ledger.actor import LedgerHandle
    from raydp_hpo.ledger.records import ReleaseRecord

__all__ = ["claim_release", "refuse_if_released", "released_error"]


def released_error(experiment: str, run: str, first: ReleaseRecord, ledger: str, *,
                   after_training: bool) -> ReleaseAlreadyPublishedError:
    """The error of a run whose release is already on ``ledger`` (named in the message)."""
    import time

    run_id = run.split("@", 1)[1] if "@" in run else "(none: from before run ids)"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(first.time))
    when = ("This run's search has run again, but publishes nothing: nothing was written to "
            "its public/ folder" if after_training else "Nothing was run")
    return ReleaseAlreadyPublishedError(
        f"experiment {experiment!r}, run {run_id}: the release of this run is already "
        f"published: recorded on {ledger} (record {first.seq}) at {stamp}, publishing to "
        f"{first.where or '(not recorded)'}. At most one release is published per run: "
        f"one charge pays for one release, and a run directory copied or resumed again "
        f"continues the same run. {when}, and the ledger's spend is unchanged. Use the first "
        "release, or start a new run (without --resume / DPTuner.restore, under a new "
        "experiment name or after removing this run directory): it pays again.",
        run=run, first=first)


def refuse_if_released(ledger: LedgerHandle | None, journal: str | Path | None,
                       experiment: str, run: str) -> None:
    """Before a resume runs anything: raise :class:`ReleaseAlreadyPublishedError` if run
    ``run`` (``<experiment>@<run id>``) has a release marker on ``ledger`` (a live ledger
    actor) or, without one, on the ledger at ``journal`` (read-only; a missing journal is
    left to the resume's own checks). Changes nothing."""
    if ledger is not None:
        first = ledger.release_of(run)
        where = f"the ledger {ledger.name!r}"
    elif journal is not None:
        from raydp_hpo.ledger.filter import CurveCheck, PrivacyLedger
        from raydp_hpo.ledger.pg import is_postgres_uri

        if not is_postgres_uri(journal) and not Path(journal).exists():
            return
        replay = PrivacyLedger.read_only(journal, curve_check=CurveCheck.ON_DEMAND)
        first = replay.release_of(run)
        where = f"the ledger {journal}"
    else:
        return
    if first is not None:
        raise released_error(experiment, run, first, where, after_training=False)


def claim_release(ledger: LedgerHandle, experiment: str, run: str, public_dir: Path) -> None:
    """Claim run ``run``'s one release on ``ledger`` right before anything is published to
    ``public_dir``; raise :class:`ReleaseAlreadyPublishedError` (nothing written, spend
    unchanged) if another attempt holds it."""
    where = f"{socket.gethostname()}:{public_dir}"
    claim = ledger.claim_release(run, where, owner=experiment, token=secrets.token_hex(16))
    if not claim.granted:
        raise released_error(experiment, run, claim.record, f"the ledger {ledger.name!r}",
                             after_training=True)
