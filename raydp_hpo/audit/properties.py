"""Property checks on the real searchers and trainable, and the white-box crafted partition pair.

**Property checks**: :func:`check_fresh_secrets` (no secret reproducible from public inputs:
two searchers built from identical public inputs and no seed must hold different secrets),
:func:`check_one_record_one_partition` (one added record changes exactly one SVT partition, and
a subsample and its complement by at most that record), :func:`check_train_dp_releases` (a
tiny real :func:`raydp_hpo.trainables.training.train_dp` run's releases equal its declared mechanism).
:func:`craft_partition_canary` builds the neighbouring pair an adversary who could
reproduce a searcher's secrets would choose.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import (
    Mechanism,
    SubsampledGaussian,
)
from raydp_hpo.audit.cheap_trial import CANARY, neighbouring_datasets
from raydp_hpo.audit.scenarios import AuditScenario, _fresh_rng, run_search
from raydp_hpo.trial.settings import RAYDP_KEY, RaydpSettings

#: Feature of the records a crafted dataset plants where a partition leak would expose them.
PLANTED = 0.999


def craft_partition_canary(scenario: AuditScenario) -> tuple[AuditScenario, int]:
    """White-box variant of a partition scenario: an adversary who can reproduce a searcher's
    secrets from public inputs builds one searcher, reads the partition view of its first
    candidate, and plants records of feature ``PLANTED`` wherever adding the canary would put
    a record *other than the canary* into some partition's training set. Returns the crafted
    scenario and the number of training sets the canary changes under that view.

    With fresh secrets the crafting searcher's view is independent of the audited runs', so
    the crafted pair is just one more fixed pair of neighbours and every bound stays valid.
    Where one record changes one partition nothing is planted (all records stay 0).
    """
    from ray.tune.search import Searcher

    from raydp_hpo.trainables.training import training_sets

    config = scenario.build_searcher().suggest("craft_00000")
    if config is None or config == Searcher.FINISHED:
        return scenario, 0
    settings = RaydpSettings.from_config(config)
    if (settings.data_view or {}).get("kind") != "partitions":
        return scenario, 0
    n = scenario.n_train
    ids = np.linspace(-0.9, 0.9, n).astype(np.float32).astype(np.float64)  # as stored
    x, x2 = neighbouring_datasets(n, scenario.n_val, train_features=ids)
    gained: set[float] = set()
    for a, b in zip(training_sets(x.train, settings), training_sets(x2.train, settings)):
        gained |= set(_records(b).tolist()) - set(_records(a).tolist())
    gained -= {CANARY}
    # records (other than the canary) that join some training set when the canary is added
    planted = np.where(np.isin(ids, sorted(gained)), PLANTED, 0.0)
    crafted = AuditScenario(
        scenario.algorithm,
        scenario.searcher_kwargs,
        scenario.budget,
        scenario.n_train,
        scenario.n_val,
        scenario.description + ", crafted from a searcher built from the same public inputs",
        tuple(float(f) for f in planted),
        scenario.name,
    )
    c, c2 = crafted.datasets()
    changed = sum(
        not np.array_equal(_records(a), _records(b))
        for a, b in zip(training_sets(c.train, settings), training_sets(c2.train, settings))
    )
    return crafted, int(changed)


#: Attributes of the searchers that hold secrets drawn at construction.
_SECRET_ATTRIBUTES = ("_k", "_subsample_seed", "_partition_seed")


def _secrets_of(searcher: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in vars(searcher).items():
        if name in _SECRET_ATTRIBUTES:
            out[name] = value
        elif isinstance(value, np.random.Generator):  # the stream future secrets come from
            out[name + ".state"] = repr(value.bit_generator.state)
    return out


@dataclass(frozen=True)
class SecretCheck:
    """For each secret: in how many of ``pairs`` pairs of identically built searchers it was
    equal. ``reproducible`` lists the secrets equal in every pair."""

    algorithm: str
    pairs: int
    equal_in: dict[str, int]

    @property
    def reproducible(self) -> list[str]:
        return [k for k, v in self.equal_in.items() if v == self.pairs]

    @property
    def passed(self) -> bool:
        return bool(self.equal_in) and not self.reproducible


def check_fresh_secrets(scenario: AuditScenario, *, pairs: int = 8) -> SecretCheck:
    """Build ``pairs`` pairs of searchers from identical public inputs (no seed) and compare
    their secrets (K, subsample and partition seeds, the state of the RNG that future secret
    draws — SVT noise, sampled configurations — come from). A secret equal in every pair is
    reproducible from the public inputs (probability ≤ max_k P[K=k]^pairs for fresh K)."""
    equal: dict[str, int] = {}
    for _ in range(pairs):
        a, b = _secrets_of(scenario.build_searcher()), _secrets_of(scenario.build_searcher())
        for name in a.keys() | b.keys():
            equal[name] = equal.get(name, 0) + int(a.get(name) == b.get(name))
    return SecretCheck(scenario.label, pairs, equal)


@dataclass(frozen=True)
class PartitionCheck:
    """One record, one partition: how many views were checked and how many broke the rule,
    with the number of changed training sets of each broken partition view."""

    algorithm: str
    views: int
    violations: int
    changed_sets: tuple[int, ...] = ()
    details: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.views > 0 and self.violations == 0


def _records(d: Any) -> np.ndarray:
    return np.sort(np.asarray(d.features, np.float64).reshape(-1))


def check_one_record_one_partition(
    scenario: AuditScenario, *, searches: int = 20
) -> PartitionCheck:
    """Run ``searches`` real searches, and for every data view they emit compare the training
    sets (:func:`raydp_hpo.trainables.training.training_sets`) on X (distinct records) and on
    X' = X + canary under the same view: exactly one training set may change, and only by
    gaining the canary (partitions); a subsample / complement may differ by at most the canary.

    The coupling (same view seed, canary appended last) is the natural one: records are
    assigned to partitions / subsamples independently, so every other record keeps its place.
    """
    from raydp_hpo.trainables.training import training_sets

    n = scenario.n_train
    feats = np.linspace(-0.9, 0.9, n)
    x, x2 = neighbouring_datasets(n, scenario.n_val, train_features=feats)
    views: list[RaydpSettings] = []
    rng = _fresh_rng()
    for _ in range(searches):
        run_search(scenario, x, rng,
                   on_config=lambda c: views.append(RaydpSettings.from_config(c)))
    checked, violations = 0, 0
    changed_counts: list[int] = []
    details: list[str] = []
    for settings in views:
        kind = (settings.data_view or {"kind": "full"}).get("kind")
        a = [_records(d) for d in training_sets(x.train, settings)]
        b = [_records(d) for d in training_sets(x2.train, settings)]
        checked += 1
        changed = [i for i, (u, w) in enumerate(zip(a, b)) if not np.array_equal(u, w)]
        gained_canary_only = all(
            np.array_equal(np.sort(np.append(a[i], CANARY)), b[i]) for i in changed
        )
        ok = gained_canary_only and (
            len(changed) == 1 if kind in ("partitions", "full") else len(changed) <= 1
        )
        if not ok:
            violations += 1
            changed_counts.append(len(changed))
            if len(details) < 5:
                view = {**(settings.data_view or {}), "seed": "<secret>"}
                details.append(
                    f"view {view}: {len(changed)} of {len(a)} training sets "
                    f"changed{'' if gained_canary_only else ' (not only by the canary)'}"
                )
    return PartitionCheck(scenario.label, checked, violations, tuple(changed_counts),
                          tuple(details))


@dataclass(frozen=True)
class ReleaseCheck:
    """A tiny real DP-SGD run: releases per model vs the declared training mechanism."""

    declared: Mechanism
    ran: tuple[Mechanism, ...]

    @property
    def passed(self) -> bool:
        return len(self.ran) > 0 and all(m == self.declared for m in self.ran)


def check_train_dp_releases(*, num_partitions: int = 2) -> ReleaseCheck:
    """Run :func:`raydp_hpo.trainables.training.train_dp` once on 40 records (``num_partitions`` models,
    Poisson-sampled DP-SGD, 1 epoch at q = 0.5) and compare each model's counted noisy
    releases with ``privacy_from_config(config, n).mechanism()``."""
    from raydp_hpo.ledger.filter import PrivacyLedger
    from raydp_hpo.trainables.data import Dataset, DataSplits
    from raydp_hpo.trainables.training import declared_privacy, train_dp

    rng = _fresh_rng()
    x = rng.uniform(-1, 1, (40, 1)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    train = Dataset(x, y, 2)
    data = DataSplits(train, train, train)
    config = {
        "model": "mlp",
        "model_kwargs": {"hidden": [4]},
        "optimizer": "sgd",
        "sample_rate": 0.5,
        "epochs": 1,
        "noise_multiplier": 2.0,
        "lr": 0.1,
        RAYDP_KEY: {
            "charge": True,
            "charge_id": "audit/t0",
            "data_view": {"kind": "partitions", "num_partitions": num_partitions,
                          "seed": secrets.randbits(31)},
        },
    }
    ledger = PrivacyLedger(PrivacyBudget(epsilon=50.0, delta=1e-5))
    result = train_dp(config, data, ledger=ledger, device="cpu")
    declared = declared_privacy(config, data)[0].mechanism()
    ran = tuple(
        SubsampledGaussian(log.noise_multiplier, log.sample_rate, log.releases)
        for log in result.releases
    )
    return ReleaseCheck(declared, ran)
