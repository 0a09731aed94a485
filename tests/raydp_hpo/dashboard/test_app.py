"""``raydp-hpo dashboard``, server side (Starlette's TestClient, real journaled ledgers, no Ray):
the figures equal ``ledger show``, integrity equals ``ledger verify``, pages paginate, nothing
private or machine-specific is shown, nothing is written, tokens are enforced."""

from __future__ import annotations

import json
import re
import sys
from html import escape as html_escape
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from raydp_hpo.accounting.budget import PrivacyBudget
from raydp_hpo.accounting.mechanisms import Gaussian
from raydp_hpo.cli.main import EXIT_BAD_INPUT, EXIT_OK, main
from raydp_hpo.dashboard.app import build_app, json_safe
from raydp_hpo.dashboard.data import PAGE_SIZE
from raydp_hpo.dashboard.server import is_local, resolve_token
from raydp_hpo.errors import InvalidParameterError, RayDPHPOError
from raydp_hpo.ledger.filter import PrivacyLedger
from tests.raydp_hpo.dashboard.storage import (
    PRIVATE_ACCURACY,
    PRIVATE_SCORE,
    make_storage,
    tamper,
)


@pytest.fixture()
def storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A storage folder named ``store`` relative to the working dir (as a user would type it)."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "store"
    make_storage(root)
    return root


def _show(target: str | Path, capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()
    assert main(["ledger", "show", "--json", str(target)]) == EXIT_OK
    return json.loads(capsys.readouterr().out)


def _verify(target: str | Path, capsys: pytest.CaptureFixture[str]) -> int:
    capsys.readouterr()
    code = main(["ledger", "verify", str(target)])
    capsys.readouterr()
    return code


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``root`` with its mode and bytes (to prove nothing was written)."""
    return {str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


def _all_pages(client: TestClient) -> list[str]:
    """The text of every page and JSON answer the dashboard has for its ledgers/experiments."""
    data = client.get("/api/ledgers").json()
    texts = [client.get("/").text, json.dumps(data)]
    for row in data["ledgers"]:
        texts += [client.get(f"/ledgers/{row['id']}").text,
                  client.get(f"/api/ledgers/{row['id']}").text]
    for exp in data["experiments"]:
        texts += [client.get(f"/experiments/{exp['id']}").text,
                  client.get(f"/api/experiments/{exp['id']}").text]
    return texts


def test_ledgers_show_the_figures_of_ledger_show(storage: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    client = TestClient(build_app(["store"]))
    rows = {r["ledger"]: r for r in client.get("/api/ledgers").json()["ledgers"]}
    assert set(rows) == {"store/ledgers/data-digits-0123456789ab.journal",
                         "store/exp-c/ledger.journal"}
    page = client.get("/").text
    for shown, row in rows.items():
        show = _show(storage.parent / shown, capsys)
        assert row["budget"] == show["budget"]
        assert row["spent_epsilon"] == show["spent_epsilon"]
        assert row["remaining_epsilon"] == show["remaining_epsilon"]
        assert row["charges"] == len(show["charges"])
        assert row["releases"] == len(show.get("releases", []))
        assert row["last_charge"] == show["charges"][-1]["time"]
        assert row["halting_rule"] == f"{show['adaptivity']} / {show['halting_accountant']}"
        assert row["integrity"]["status"] == "ok"
        # the HTML row shows the same figures, as `ledger show` prints them (4 decimals)
        html_row = page.split(f'data-ledger-id="{row["id"]}"')[1].split("</tr>")[0]
        assert f"{show['spent_epsilon']:.4f}" in html_row
        assert f"{show['remaining_epsilon']:.4f}" in html_row
        assert f"ε={show['budget']['epsilon']:g}, δ={show['budget']['delta']:g}" in html_row
    assert rows["store/exp-c/ledger.journal"]["binding"].startswith("experiment exp-c")
    assert rows["store/ledgers/data-digits-0123456789ab.journal"]["binding"] == (
        "dataset ledger data-digits-0123456789ab")


def test_a_release_marker_is_shown_as_a_release_not_a_charge(storage: Path) -> None:
    """A run's release marker (one per run, ε = 0) is counted apart: the ledger's charges,
    spend and rows are those of its charges alone."""
    journal = storage / "ledgers" / "data-digits-0123456789ab.journal"
    client = TestClient(build_app(["store"]))
    before = {r["ledger"]: r for r in client.get("/api/ledgers").json()["ledgers"]}
    with PrivacyLedger.open(journal) as ledger:
        assert ledger.claim_release("exp-a@0123456789abcdef", "host:/runs/exp-a/public").granted
    client = TestClient(build_app(["store"]))
    rows = {r["ledger"]: r for r in client.get("/api/ledgers").json()["ledgers"]}
    row = rows["store/ledgers/data-digits-0123456789ab.journal"]
    old = before["store/ledgers/data-digits-0123456789ab.journal"]
    assert old["releases"] == 0 and row["releases"] == 1
    assert (row["charges"], row["spent_epsilon"]) == (old["charges"], old["spent_epsilon"])
    assert row["integrity"]["status"] == "ok"
    page = client.get(f"/ledgers/{row['id']}").text
    assert '<dd id="release-count">1 ' in page
    assert f'<dd id="charge-count">{old["charges"]}</dd>' in page
    data = client.get(f"/api/ledgers/{row['id']}").json()
    assert all(not r["charge_id"].endswith("/release") for r in data["charge_rows"])


def test_a_ledger_page_lists_its_charges_and_experiments(storage: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    client = TestClient(build_app(["store"]))
    row = next(r for r in client.get("/api/ledgers").json()["ledgers"]
               if "data-digits" in r["ledger"])
    show = _show(storage / "ledgers" / "data-digits-0123456789ab.journal", capsys)
    data = client.get(f"/api/ledgers/{row['id']}").json()
    assert [c["seq"] for c in data["charge_rows"]] == [3, 2, 1]  # newest first
    for shown, charge in zip(data["charge_rows"][::-1], show["charges"]):
        assert shown["epsilon_after"] == charge["epsilon_after"]
        assert shown["charge_id"] == charge["charge_id"] and shown["owner"] == charge["owner"]
    owners = {o["owner"]: o for o in data["experiments"]}
    assert set(owners) == {"exp-a", "exp-b"} and owners["exp-a"]["charges"] == 2
    html = client.get(f"/ledgers/{row['id']}").text
    assert 'id="spend-plot"' in html and "/static/plotly.min.js" in html
    # the plot's data: from ε=0 at the ledger's creation, then ε after each charge
    block = re.search(r'<script type="application/json" id="spend-data">(.*?)</script>', html)
    assert block is not None
    plot = json.loads(block.group(1))
    assert plot["epsilon_after"] == [0.0] + [c["epsilon_after"] for c in show["charges"]]
    assert plot["time"][1:] == [c["time"] for c in show["charges"]]
    assert plot["budget"] == show["budget"]["epsilon"]
    for charge in show["charges"]:
        assert f"{charge['epsilon_after']:.4f}" in html
    # the experiments that charged it link to their pages
    link = re.search(r'class="experiment-link" href="(/experiments/\w+)">exp-a<', html)
    assert link is not None
    exp = client.get(link.group(1))
    assert exp.status_code == 200 and 'id="experiment-name">exp-a<' in exp.text
    # plotly is served from the installed package, not a CDN
    js = client.get("/static/plotly.min.js")
    assert js.status_code == 200 and len(js.content) > 1_000_000
    assert "cdn" not in html.lower()


def test_charges_paginate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    make_storage(root, dataset_charges=2 * PAGE_SIZE + 7)
    client = TestClient(build_app([str(root)]))
    row = next(r for r in client.get("/api/ledgers").json()["ledgers"]
               if "data-digits" in r["ledger"])
    n = 2 * PAGE_SIZE + 7
    first = client.get(f"/api/ledgers/{row['id']}").json()
    assert first["pages"] == 3 and len(first["charge_rows"]) == PAGE_SIZE
    assert first["charge_rows"][0]["seq"] == n
    second = client.get(f"/api/ledgers/{row['id']}?page=2").json()["charge_rows"]
    assert [c["seq"] for c in second] == list(range(n - PAGE_SIZE, n - 2 * PAGE_SIZE, -1))
    last = client.get(f"/api/ledgers/{row['id']}?page=3").json()["charge_rows"]
    assert [c["seq"] for c in last] == list(range(7, 0, -1))
    html = client.get(f"/ledgers/{row['id']}?page=2").text
    assert f"page 2 of 3 (charges {n - 2 * PAGE_SIZE + 1}–{n - PAGE_SIZE} of {n}" in html
    assert 'id="next"' in html and 'id="prev"' in html
    for bad in ("4", "0", "x"):
        answer = client.get(f"/api/ledgers/{row['id']}?page={bad}")
        assert answer.status_code == 400 and "page" in answer.json()["error"]


def test_the_experiment_page_shows_the_release_and_nothing_private(
        storage: Path, capsys: pytest.CaptureFixture[str]) -> None:
    client = TestClient(build_app(["store"]))
    exps = {e["name"]: e for e in client.get("/api/ledgers").json()["experiments"]}
    assert set(exps) == {"exp-a", "exp-b", "exp-c"}
    data = client.get(f"/api/experiments/{exps['exp-a']['id']}").json()
    certificate = json.loads((storage / "exp-a" / "public" / "certificate.json").read_text())
    assert data["certificate"] == json_safe(certificate)  # the content of certificate.json
    assert data["hyperparameters"] == {"lr": 0.125, "epochs": 3, "noise_multiplier": 1.0}
    assert data["accuracy_vs_epsilon"][0]["accuracy"] == 0.75
    assert data["accuracy_vs_epsilon"][0]["epsilon"] == certificate["epsilon"]["certified"]
    assert data["public_files"] == ["certificate.json", "release.json"]
    assert {p["name"] for p in data["private_artefacts"]} == {
        "tune", "evaluation_private.json", "run.json"}
    html = client.get(f"/experiments/{exps['exp-a']['id']}").text
    assert f"{certificate['epsilon']['certified']:.4f}" in html
    assert html_escape(certificate["paper"]) in html and 'id="accuracy-plot"' in html
    assert "0.7500" in html  # the released DP test accuracy
    # a released file can be downloaded; a private one cannot, by any name
    cert = client.get(f"/experiments/{exps['exp-a']['id']}/public/certificate.json")
    assert cert.status_code == 200 and cert.json() == certificate
    for name in ("evaluation_private.json", "..%2Fevaluation_private.json", "run.json"):
        assert client.get(f"/experiments/{exps['exp-a']['id']}/public/{name}").status_code == 404
    # no page shows a private value, a credential, or a machine path the user did not give
    everything = "\n".join(_all_pages(client))
    for secret in (str(PRIVATE_SCORE), str(PRIVATE_ACCURACY), "0.9877", "0.8765"):
        assert secret not in everything
    assert str(storage.parent) not in everything
    assert "store/exp-a" in everything


def test_a_tampered_journal_fails_integrity_as_ledger_verify_does(
        storage: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = storage / "ledgers" / "data-digits-0123456789ab.journal"
    client = TestClient(build_app(["store"]))
    assert {r["integrity"]["status"] for r in client.get("/api/ledgers").json()["ledgers"]} == {
        "ok"}
    tamper(journal)
    assert _verify(journal, capsys) == EXIT_BAD_INPUT
    rows = {r["ledger"]: r for r in client.get("/api/ledgers").json()["ledgers"]}
    bad = rows["store/ledgers/data-digits-0123456789ab.journal"]
    assert bad["integrity"]["status"] == "CORRUPTED" and bad["spent_epsilon"] is None
    assert "chain" in bad["integrity"]["problems"][0]
    assert str(storage.parent) not in json.dumps(bad)  # the message names the path as given
    assert rows["store/exp-c/ledger.journal"]["integrity"]["status"] == "ok"
    html = client.get("/").text
    row = html.split(f'data-ledger-id="{bad["id"]}"')[1].split("</tr>")[0]
    assert '<span class="CORRUPTED">CORRUPTED</span>' in row
    assert client.get(f"/ledgers/{bad['id']}").status_code == 200
    # filter and sort: the failing ledger is found by its status
    assert [r["id"] for r in client.get("/api/ledgers?q=corrupted").json()["ledgers"]] == [
        bad["id"]]


def test_a_truncated_journal_fails_on_its_seal(storage: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    journal = storage / "exp-c" / "ledger.journal"
    lines = journal.read_bytes().split(b"\n")
    journal.write_bytes(b"\n".join(lines[:-2]) + b"\n")  # drop the last charge (at a line end)
    assert _verify(journal, capsys) == EXIT_BAD_INPUT
    row = next(r for r in TestClient(build_app(["store"])).get("/api/ledgers").json()["ledgers"]
               if r["ledger"] == "store/exp-c/ledger.journal")
    assert row["integrity"]["status"] == "CORRUPTED"
    assert "seal" in row["integrity"]["problems"][0]


def test_read_only_no_writes_no_locks_no_changing_methods(storage: Path) -> None:
    before = _snapshot(storage)
    client = TestClient(build_app(["store"]))
    _all_pages(client)
    journal = storage / "exp-c" / "ledger.journal"
    # a live writer holds the journal's lock: the dashboard still reads it, and takes no lock
    with PrivacyLedger.open(journal) as live:
        row = next(r for r in client.get("/api/ledgers").json()["ledgers"]
                   if r["ledger"] == "store/exp-c/ledger.journal")
        assert row["integrity"]["status"] == "ok" and row["charges"] == 2
        live.charge("exp-c/later", Gaussian(50.0), owner="exp-c")
    after_charge = next(r for r in client.get("/api/ledgers").json()["ledgers"]
                        if r["ledger"] == "store/exp-c/ledger.journal")
    assert after_charge["charges"] == 3  # a changed journal is read again
    for method in ("post", "put", "delete", "patch"):
        for path in ("/", "/api/ledgers", f"/api/ledgers/{row['id']}"):
            assert getattr(client, method)(path).status_code == 405
    after = _snapshot(storage)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    # only the live writer's own files changed (its charge, seal and PLD snapshot)
    assert changed <= {"exp-c/ledger.journal", "exp-c/ledger.journal.seal",
                       "exp-c/ledger.journal.pld"}
    before2 = _snapshot(storage)
    _all_pages(client)
    assert _snapshot(storage) == before2


def test_sorting_filtering_and_bad_parameters(storage: Path) -> None:
    client = TestClient(build_app(["store"]))
    spent = [r["spent_epsilon"] for r in
             client.get("/api/ledgers?sort=spent&order=desc").json()["ledgers"]]
    assert spent == sorted(spent, reverse=True) and len(spent) == 2
    assert [r["ledger"] for r in client.get("/api/ledgers?q=exp-c").json()["ledgers"]] == [
        "store/exp-c/ledger.journal"]
    answer = client.get("/api/ledgers?sort=nope")
    assert answer.status_code == 400 and "sort='nope' is not a column" in answer.json()["error"]
    assert client.get("/?sort=nope").status_code == 400
    assert client.get("/api/ledgers/000000000000").status_code == 404
    assert client.get("/experiments/000000000000").status_code == 404


def test_a_token_is_required_when_set(storage: Path) -> None:
    token = "s3cret-token-0123456789"
    client = TestClient(build_app(["store"], token=token))
    refused = client.get("/api/ledgers")
    assert refused.status_code == 401 and "access token is required" in refused.text
    assert client.get("/api/ledgers", headers={"Authorization": "Bearer wrong-token-xxxxxxx"}
                      ).status_code == 401
    ok = client.get("/api/ledgers", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200
    first = client.get(f"/?token={token}&q=exp", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == "/?q=exp"
    assert "httponly" in first.headers["set-cookie"].lower()
    assert client.get("/?q=exp").status_code == 200  # the cookie carries it from now on
    assert token not in client.get("/").text


def test_binding_beyond_this_machine_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYDP_HPO_DASHBOARD_TOKEN", raising=False)
    said: list[str] = []
    assert is_local("127.0.0.1") and is_local("::1") and is_local("localhost")
    assert not is_local("0.0.0.0") and not is_local("192.168.1.5")
    assert resolve_token("127.0.0.1", None, said.append) is None
    generated = resolve_token("0.0.0.0", None, said.append)
    assert generated is not None and len(generated) >= 16 and "access token" in said[0]
    assert resolve_token("0.0.0.0", "my-own-long-token-123", said.append) == (
        "my-own-long-token-123")
    monkeypatch.setenv("RAYDP_HPO_DASHBOARD_TOKEN", "from-the-environment-1234")
    assert resolve_token("0.0.0.0", None, said.append) == "from-the-environment-1234"
    with pytest.raises(InvalidParameterError, match="at least 16 characters"):
        resolve_token("127.0.0.1", "short", said.append)


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", str(tmp_path / "nope")]) == EXIT_BAD_INPUT
    assert "does not exist; pass a storage path" in capsys.readouterr().err
    assert main(["dashboard", str(tmp_path), "--port", "70000"]) == EXIT_BAD_INPUT
    assert "--port 70000 is not a port" in capsys.readouterr().err
    assert main(["dashboard", "postgresql://u:pw@localhost/db"]) == EXIT_BAD_INPUT
    assert "may not hold a secret" in capsys.readouterr().err
    with pytest.raises(RayDPHPOError, match="no location"):
        build_app([])


def test_without_the_extra_the_error_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("uvicorn", "starlette", "starlette.applications"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    assert main(["dashboard", str(tmp_path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "pip install 'raydp-hpo[dashboard]'" in err and "uvicorn is missing" in err
    with pytest.raises(RayDPHPOError, match=r"pip install 'raydp-hpo\[dashboard\]'"):
        build_app([str(tmp_path)])
    # and the rest of the CLI works without it
    assert main(["ledger", "list", str(tmp_path)]) == EXIT_OK


def test_default_location_is_the_default_storage(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from raydp_hpo.dashboard import server

    monkeypatch.setenv("RAYDP_HPO_STORAGE", str(tmp_path))
    make_storage(tmp_path)
    seen: dict[str, object] = {}

    def fake_build(locations: list[str], *, token: str | None = None) -> object:
        seen["locations"] = locations
        raise RayDPHPOError("stop here")

    monkeypatch.setattr("raydp_hpo.dashboard.app.build_app", fake_build)
    assert main(["dashboard"]) == EXIT_BAD_INPUT
    assert seen["locations"] == [str(tmp_path.resolve())]
    monkeypatch.delenv("RAYDP_HPO_STORAGE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["dashboard"]) == EXIT_BAD_INPUT
    assert seen["locations"] == ["~/raydp_results"]  # shown as the user's shorthand
    assert server.DEFAULT_PORT == 8765


def test_an_unreachable_database_is_named_not_fatal(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    client = TestClient(build_app(["postgresql://127.0.0.1:1/nodb", str(tmp_path)]))
    data = client.get("/api/ledgers").json()
    assert data["ledgers"] == [] and "postgresql://127.0.0.1:1/nodb" in data["errors"][0]
    assert "cannot list postgresql://127.0.0.1:1/nodb" in client.get("/").text


def test_a_large_ledger_shows_checking_until_its_curves_are_recomputed(
        storage: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("raydp_hpo.dashboard.data.CURVE_CHECK_INLINE", 2)
    app = build_app(["store"])
    client = TestClient(app)
    status = {r["ledger"]: r["integrity"] for r in client.get("/api/ledgers").json()["ledgers"]}
    big = status["store/ledgers/data-digits-0123456789ab.journal"]  # 3 charges > 2
    assert big["status"] in ("checking", "ok")  # "ok" only once the check is done
    assert status["store/exp-c/ledger.journal"]["status"] == "ok"  # 2 charges: checked inline
    app.catalogue.settle(timeout=60)
    status = {r["ledger"]: r["integrity"] for r in client.get("/api/ledgers").json()["ledgers"]}
    done = status["store/ledgers/data-digits-0123456789ab.journal"]
    assert done["status"] == "ok" and done["curves"] == "stored curves match a recomputation"


def test_names_from_a_journal_cannot_inject_markup(tmp_path: Path) -> None:
    root = tmp_path / "store"
    journal = root / "ledgers" / "data-x.journal"
    journal.parent.mkdir(parents=True)
    evil = '</script><script>alert(1)</script><b onmouseover="x">'
    with PrivacyLedger(PrivacyBudget(5.0, 1e-5), journal) as ledger:
        ledger.charge(evil, Gaussian(30.0), owner=evil)
    client = TestClient(build_app([str(root)]))
    row = client.get("/api/ledgers").json()["ledgers"][0]
    html = client.get(f"/ledgers/{row['id']}").text
    assert "<script>alert(1)" not in html and "<b onmouseover" not in html
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in html  # shown, as text
    block = re.search(r'<script type="application/json" id="spend-data">(.*?)</script>', html)
    assert block is not None and json.loads(block.group(1))["charge_id"][-1] == evil
    answer = client.get("/")
    assert "default-src 'self'" in answer.headers["content-security-policy"]
