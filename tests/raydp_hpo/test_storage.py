"""Default storage (~/raydp_results, $RAYDP_HPO_STORAGE) and the warning for folders that are
likely to be deleted (temporary dirs, Ray working dirs): no Ray started."""

from __future__ import annotations

import tempfile
import uuid
import warnings
from pathlib import Path

import pytest

from raydp_hpo import _storage
from raydp_hpo.errors import EphemeralStorageWarning

#: A durable-looking folder that is never created (nothing here writes to it).
DURABLE = Path("/srv") / f"raydp-hpo-test-{uuid.uuid4().hex[:8]}"


def test_default_storage_is_in_the_home_dir_not_the_working_dir(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(_storage.STORAGE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(DURABLE))
    monkeypatch.chdir(tmp_path)
    assert _storage.default_storage_path() == DURABLE / "raydp_results"
    monkeypatch.setenv(_storage.STORAGE_ENV, str(DURABLE / "elsewhere"))
    assert _storage.default_storage_path() == DURABLE / "elsewhere"
    monkeypatch.setenv(_storage.STORAGE_ENV, "~/via-home")
    assert _storage.default_storage_path() == DURABLE / "via-home"
    monkeypatch.setenv(_storage.STORAGE_ENV, "  ")  # empty: the default
    assert _storage.default_storage_path() == DURABLE / "raydp_results"


@pytest.mark.parametrize("path", [
    Path(tempfile.gettempdir()) / "x" / "store",
    Path("/tmp/raydp/results"),
    Path("/var/tmp/results"),
    DURABLE / "ray/session_1/runtime_resources/working_dir_files/_ray_pkg_ab12/raydp_results",
    DURABLE / "jobs/_ray_pkg_0a1b2c/raydp_results",
])
def test_ephemeral_places_are_recognised(path: Path) -> None:
    assert _storage.ephemeral_reason(path) is not None


def test_durable_places_are_not(monkeypatch) -> None:
    assert _storage.ephemeral_reason(DURABLE / "raydp_results") is None
    assert _storage.ephemeral_reason(DURABLE / "temporary" / "tmp") is None  # a name, not /tmp


def test_the_warning_is_a_user_warning_once_per_path_and_the_cli_line_every_time() -> None:
    """A UserWarning subclass: shown to users by Python's default filters, and filterable by
    its own class (the test suite ignores it in pyproject's filterwarnings)."""
    assert issubclass(EphemeralStorageWarning, UserWarning)
    path = Path(tempfile.gettempdir()) / f"raydp-warn-{uuid.uuid4().hex[:8]}"
    lines: list[str] = []
    with pytest.warns(EphemeralStorageWarning, match="may be deleted.*RAYDP_HPO_STORAGE"):
        message = _storage.warn_if_ephemeral(path, "storage_path", lines.append)
    assert message is not None and str(path) in message
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _storage.warn_if_ephemeral(path, "storage_path", lines.append)  # warned already
    assert not [w for w in caught if issubclass(w.category, EphemeralStorageWarning)]
    assert len(lines) == 2 and all(line.startswith("[raydp-hpo] WARNING:") for line in lines)
    assert _storage.warn_if_ephemeral(DURABLE, "storage_path", lines.append) is None
    assert len(lines) == 2


@pytest.mark.ray
def test_the_current_ray_session_dir_is_ephemeral(ray_session) -> None:
    import ray

    session = Path(ray._private.worker._global_node.get_session_dir_path())
    assert "session dir" in (_storage.ephemeral_reason(session / "results") or "")
