"""``raydp-hpo dashboard`` in a real browser (``make test-browser``): Debian's chromium driven by
Selenium through /usr/bin/chromedriver, against the real command (``--port 0``) over a journal
storage folder holding a real demo run (``raydp-hpo demo --quick``) and over a PostgreSQL
database (a throw-away server). Each page is opened, the figures shown are compared with
``raydp-hpo ledger show``, ledger → experiment is clicked through, a tampered journal shows
as failing integrity, and screenshots are saved (``$RAYDP_HPO_SCREENSHOTS``; ``make
test-browser`` writes them into docs/how-to/img for the how-to page).

``$RAYDP_HPO_DASHBOARD_DEMO``: a storage folder of an earlier ``raydp-hpo demo`` to copy
instead of running the demo again (the quick demo takes a minute or two).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raydp_hpo.cli.main import EXIT_OK, main
from tests.raydp_hpo.dashboard.storage import make_storage, tamper

pytestmark = pytest.mark.browser
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("chromium and chromedriver are not installed (make test-browser installs "
                    "Debian's chromium and chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1360,1000", "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # the driver's path is given: Selenium Manager would try to download one
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("RAYDP_HPO_SCREENSHOTS")
    out = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A storage folder with a real demo run, plus the ledgers and releases of
    :func:`make_storage`."""
    root = tmp_path_factory.mktemp("dash") / "raydp_results"
    earlier = os.environ.get("RAYDP_HPO_DASHBOARD_DEMO")
    if earlier:
        shutil.copytree(earlier, root)
    else:
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        done = subprocess.run([sys.executable, "-m", "raydp_hpo.cli.main", "demo", "--quick",
                               "--storage-path", str(root)], env=env, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (root / "demo" / "public" / "release.json").is_file()
    make_storage(root)
    return root


class Dashboard:
    """``raydp-hpo dashboard LOCATION… --port 0`` as a subprocess; ``url`` as it printed it."""

    def __init__(self, locations: list[str], env: dict[str, str] | None = None,
                 cwd: Path = REPO) -> None:
        import tempfile

        self.log = Path(tempfile.mkstemp(prefix="raydp-dashboard-", suffix=".log")[1])
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "raydp_hpo.cli.main", "dashboard", *locations,
                 "--port", "0"], stdout=out, stderr=subprocess.STDOUT, text=True,
                env={**os.environ, **(env or {})}, cwd=cwd)
        deadline = time.monotonic() + 120
        while " at http://" not in self.output():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.output()
            time.sleep(0.1)
        line = next(ln for ln in self.output().splitlines() if " at http://" in ln)
        assert " at http://127.0.0.1:" in line, line  # local by default
        self.url = line.rsplit(" at ", 1)[1].strip()

    def output(self) -> str:
        return self.log.read_text()

    def check_alive(self) -> None:
        assert self.proc.poll() is None, f"the dashboard exited: {self.output()}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.unlink()


def _show(target: str) -> dict:
    from contextlib import redirect_stdout
    from io import StringIO

    buf = StringIO()
    with redirect_stdout(buf):
        assert main(["ledger", "show", "--json", target]) == EXIT_OK
    return json.loads(buf.getvalue())


def _wait(driver: object, css: str, timeout: float = 60.0) -> object:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(  # type: ignore[arg-type]
        ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def _rows(driver: object) -> dict[str, dict[str, str]]:
    """The ledgers table as shown: ledger (its link text) -> cell texts."""
    from selenium.webdriver.common.by import By

    out = {}
    for tr in driver.find_elements(By.CSS_SELECTOR, "#ledgers tbody tr[data-ledger-id]"):  # type: ignore[attr-defined]
        link = tr.find_element(By.CSS_SELECTOR, "a.ledger-link")
        out[link.text] = {
            "spent": tr.find_element(By.CSS_SELECTOR, "td.spent").text,
            "remaining": tr.find_element(By.CSS_SELECTOR, "td.remaining").text,
            "budget": tr.find_element(By.CSS_SELECTOR, "td.budget").text,
            "charges": tr.find_element(By.CSS_SELECTOR, "td.charges").text,
            "integrity": tr.find_element(By.CSS_SELECTOR, "td.integrity span").text,
        }
    return out


def _shot(driver: object, path: Path) -> None:
    """A screenshot of the whole page (the window grown to the page's height, up to 2400)."""
    height = driver.execute_script("return document.documentElement.scrollHeight")  # type: ignore[attr-defined]
    driver.set_window_size(1360, min(int(height) + 20, 2400))  # type: ignore[attr-defined]
    driver.save_screenshot(str(path))  # type: ignore[attr-defined]
    driver.set_window_size(1360, 1000)  # type: ignore[attr-defined]


def _check_row(row: dict[str, str], show: dict) -> None:
    assert row["spent"] == f"{show['spent_epsilon']:.4f}"
    assert row["remaining"] == f"{show['remaining_epsilon']:.4f}"
    assert row["budget"] == f"ε={show['budget']['epsilon']:g}, δ={show['budget']['delta']:g}"
    assert row["charges"] == str(len(show["charges"]))
    assert row["integrity"] == "ok"


def _no_console_errors(driver: object) -> None:
    """No script error and no refused resource (a CSP violation would show here)."""
    logs = driver.get_log("browser")  # type: ignore[attr-defined]
    severe = [e["message"] for e in logs if e["level"] == "SEVERE"]
    assert severe == []


def _click_to_experiment(driver: object, shots: Path, prefix: str, ledger: str,
                         experiment: str, base: Path | None = None) -> None:
    """From the ledgers page: open ``ledger``, see its plot and charges, open ``experiment``."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.LINK_TEXT, ledger).click()  # type: ignore[attr-defined]
    _wait(driver, "#spend-plot .main-svg")  # Plotly drew the spend over time
    name = driver.find_element(By.ID, "ledger-name").text  # type: ignore[attr-defined]
    show = _show(name if base is None else str(base / name))
    assert driver.find_element(By.ID, "spent").text == f"ε={show['spent_epsilon']:.4f}"  # type: ignore[attr-defined]
    shown = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#charges td.eps-after")]  # type: ignore[attr-defined]
    assert shown == [f"{c['epsilon_after']:.4f}" for c in show["charges"][::-1][:len(shown)]]
    _no_console_errors(driver)
    _shot(driver, shots / f"{prefix}-ledger.png")
    driver.find_element(By.CSS_SELECTOR, "#ledger-experiments a.experiment-link").click()  # type: ignore[attr-defined]
    _wait(driver, "#experiment-name")
    assert driver.find_element(By.ID, "experiment-name").text == experiment  # type: ignore[attr-defined]
    _no_console_errors(driver)


def test_journal_storage_in_a_browser(browser: object, storage: Path, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    # the location as a user types it, from the folder above: pages show paths from there on
    server = Dashboard(["raydp_results"], cwd=storage.parent)
    try:
        driver.get(server.url)  # type: ignore[attr-defined]
        _wait(driver, "#ledgers")
        rows = _rows(driver)
        demo = "raydp_results/demo/ledger.journal"
        assert demo in rows and len(rows) == 3
        for ledger, row in rows.items():
            _check_row(row, _show(str(storage.parent / ledger)))
        assert str(storage.parent) not in driver.page_source  # type: ignore[attr-defined]
        _no_console_errors(driver)
        _shot(driver, shots / "dashboard-ledgers.png")

        _click_to_experiment(driver, shots, "dashboard", demo, "demo", storage.parent)
        cert = json.loads((storage / "demo" / "public" / "certificate.json").read_text())
        shown = driver.find_element(By.ID, "cert-epsilon").text  # type: ignore[attr-defined]
        assert f"{cert['epsilon']['certified']:.4f}" in shown
        hyper = driver.find_element(By.ID, "hyperparameters").text  # type: ignore[attr-defined]
        release = json.loads((storage / "demo" / "public" / "release.json").read_text())
        for key in release["hyperparameters"]:
            assert key in hyper
        private = driver.find_element(By.ID, "private-files").text  # type: ignore[attr-defined]
        assert "evaluation_private.json" in private and "tune" in private
        page = driver.page_source  # type: ignore[attr-defined]
        evaluation = json.loads((storage / "demo" / "evaluation_private.json").read_text())
        assert str(evaluation["test_accuracy"]) not in page
        _shot(driver, shots / "dashboard-experiment.png")

        # a tampered journal: failing integrity on the ledgers page
        tamper(storage / "ledgers" / "data-digits-0123456789ab.journal")
        driver.get(server.url)  # type: ignore[attr-defined]
        _wait(driver, "#ledgers")
        rows = _rows(driver)
        assert rows["raydp_results/ledgers/data-digits-0123456789ab.journal"]["integrity"] == (
            "CORRUPTED")
        assert rows[demo]["integrity"] == "ok"
        _shot(driver, shots / "dashboard-tampered.png")
    finally:
        server.stop()


def test_postgres_ledgers_in_a_browser(browser: object, storage: Path, shots: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from raydp_hpo.accounting.budget import PrivacyBudget
    from raydp_hpo.accounting.mechanisms import Gaussian
    from raydp_hpo.ledger.filter import PrivacyLedger
    from raydp_hpo.ledger.pg import register_dataset
    from tests.raydp_hpo.ledger.pg_server import READER, WRITER, running_server

    pytest.importorskip("psycopg")
    driver = browser
    with running_server() as pg:
        monkeypatch.setenv("PGUSER", WRITER)
        uri = pg.uri("digits")
        with PrivacyLedger(PrivacyBudget(4.0, 1e-5), uri) as ledger:
            for i in range(12):
                owner = "exp-a" if i < 8 else "exp-b"
                ledger.charge(f"{owner}/trial-{i}", Gaussian(12.0 + i), owner=owner)
                time.sleep(0.05)  # a visible spend-over-time curve
        monkeypatch.setenv("PGUSER", pg.superuser)
        register_dataset(uri, "digits:sklearn")
        monkeypatch.setenv("PGUSER", READER)  # the dashboard reads with SELECT only
        server = Dashboard([pg.uri(), str(storage)], env={"PGUSER": READER})
        try:
            server.check_alive()
            driver.get(server.url)  # type: ignore[attr-defined]
            _wait(driver, "#ledgers")
            rows = _rows(driver)
            assert uri in rows
            _check_row(rows[uri], _show(uri))
            _shot(driver, shots / "dashboard-postgres.png")
            _click_to_experiment(driver, shots, "dashboard-postgres", uri, "exp-a")
        finally:
            server.stop()
