"""The searcher-trial privacy contract ``config["raydp"]`` (raydp_hpo.trial.settings)."""

from __future__ import annotations

import json
import pickle

import pytest

from raydp_hpo.errors import InvalidParameterError
from raydp_hpo.trial.settings import RaydpSettings

CHARGING = {"ledger": "L", "experiment": "exp", "charge": True, "charge_id": "exp/t1",
            "data_view": {"kind": "full"}, "score_epsilon": 0.1}


def test_dict_and_object_blocks_read_the_same() -> None:
    from_dict = RaydpSettings.from_config({"lr": 0.1, "raydp": CHARGING})
    obj = RaydpSettings(**CHARGING)
    assert from_dict == obj
    assert RaydpSettings.from_config({"raydp": obj}) is obj  # passed through, not rebuilt
    assert obj.needs_ledger and obj.to_dict()["charge_id"] == "exp/t1"
    assert RaydpSettings.from_config({}) == RaydpSettings()  # no block: unaccounted
    assert not RaydpSettings().needs_ledger


def test_one_value_in_tune_logs_and_picklable() -> None:
    """Tune writes unknown objects in result.json as their str (SafeFallbackEncoder) and ships
    configs by pickle; the block must survive both as one value."""
    from ray.tune.utils.util import SafeFallbackEncoder

    obj = RaydpSettings(**CHARGING)
    line = json.loads(json.dumps({"config": {"raydp": obj}}, cls=SafeFallbackEncoder))
    assert isinstance(line["config"]["raydp"], str) and "exp/t1" in line["config"]["raydp"]
    assert pickle.loads(pickle.dumps(obj)) == obj


def test_repr_withholds_the_view_seed_and_is_made_once() -> None:
    """Tune formats a trial's config ~10 times: the text is cached on the value. The cached
    text withholds the secret seed of the data view like the first, and a pickled copy (what
    a trial receives) carries fields only and formats to the same text."""
    obj = RaydpSettings(**{**CHARGING, "data_view": {"kind": "subsample", "seed": 987654321}})
    text = repr(obj)
    assert "987654321" not in text and "'seed': '<secret>'" in text
    assert repr(obj) is text  # cached
    state = pickle.dumps(obj)
    assert b"<secret>" not in state  # the cached text is not shipped
    copy = pickle.loads(state)
    assert copy == obj and repr(copy) == text
    assert obj.data_view == {"kind": "subsample", "seed": 987654321}  # the value keeps it


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"charge": True}, "charge_id is empty"),
        ({"charge": True, "charge_id": "a", "covered_by": "p"}, "either raydp.charge"),
        ({"covered_by": "p"}, "needs raydp.base"),
        ({"charge": True, "charge_id": "a", "nonprivate": True}, "nonprivate run cannot charge"),
        ({"charge": True, "charge_id": "a", "score_epsilon": -1.0}, "score_epsilon"),
        ({"chrage": True}, r"unknown config\['raydp'\] keys \['chrage'\]"),
    ],
)
def test_invalid_blocks_are_refused_in_both_forms(block: dict, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        RaydpSettings.from_config({"raydp": block})
    if "chrage" not in block:
        with pytest.raises(InvalidParameterError, match=message):
            RaydpSettings(**block)


def test_a_block_of_another_type_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="must be a RaydpSettings or a dict"):
        RaydpSettings.from_config({"raydp": "charge"})
