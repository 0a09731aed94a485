"""Every code block of the documentation (README.md and docs/) runs as written.

Blocks are read in page order. ``python`` blocks of a page run in one namespace (a page's
blocks build on each other); ``bash`` blocks may hold only ``raydp-hpo`` commands, each run
in-process through the CLI's ``main`` and expected to exit 0; ``yaml`` blocks that are
experiment files must parse; ``text`` blocks are output and trees, not code. A block that
cannot run here is marked in the Markdown, on the line before its fence:

    <!-- skip: why (e.g. needs a PostgreSQL server) -->   never run by the tests
    <!-- slow: why -->                                     run by `make test-slow` only

Each skipped block is reported as one skipped test (``-rs`` lists them with their reasons).
Pages run in a sandbox: a temporary working directory and ``$HOME``, results under
``~/raydp_results``. The search of docs/getting-started.md runs once per module and is the one
docs/how-to/read-a-certificate.md reads; the README's example is that block, verbatim.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(p for p in DOCS.rglob("*.md"))]
GETTING_STARTED = DOCS / "getting-started.md"
CERTIFICATE_PAGE = DOCS / "how-to" / "read-a-certificate.md"
OWN_LOOP_PAGE = DOCS / "how-to" / "own-training-loop.md"

_FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```\n", re.S | re.M)
_MARK = re.compile(r"<!--\s*(skip|slow):\s*(.*?)\s*-->\s*$", re.S)
LANGUAGES = {"python", "bash", "yaml", "text"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    mark: str | None  # None, "skip" or "slow"
    reason: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    out = []
    for match in _FENCE.finditer(text):
        before = text[:match.start()]
        previous = before.rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(previous)
        out.append(Block(page, before.count("\n") + 1, match.group(1), match.group(2),
                         mark.group(1) if mark else None, mark.group(2) if mark else ""))
    return out


ALL_BLOCKS = [block for page in PAGES for block in _blocks(page)]


def _commands(code: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments and blanks dropped."""
    joined = code.replace("\\\n", " ")
    return [line for line in joined.splitlines()
            if shlex.split(line, comments=True)]


def _run_cli(command: str, sandbox: Path) -> tuple[int, str]:
    from raydp_hpo.cli.main import main

    args = shlex.split(command, comments=True)
    assert args[0] == "raydp-hpo", command
    args = [os.path.expanduser(os.path.expandvars(a)).replace("/tmp/results",
                                                               str(sandbox / "results"))
            for a in args[1:]]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(args)
    return code, out.getvalue()


def _run_page(page: Path, sandbox: Path, *, slow: bool) -> tuple[dict[str, Any], dict[str, str]]:
    """Run a page's blocks in order (``slow``: the slow-marked ones too); returns the python
    namespace and each bash command's output."""
    scope: dict[str, Any] = {"__name__": "__docs__"}
    outputs: dict[str, str] = {}
    for block in _blocks(page):
        if block.mark == "skip" or (block.mark == "slow" and not slow):
            continue
        if block.lang == "python":
            exec(compile(block.code, block.id, "exec"), scope)  # noqa: S102 - the docs' code
        elif block.lang == "bash":
            for command in _commands(block.code):
                code, out = _run_cli(command, sandbox)
                assert code == 0, f"{block.id}: `{command}` exited {code}\n{out}"
                outputs[command] = out
        elif block.lang == "yaml":
            _check_yaml(block)
    return scope, outputs


def _check_yaml(block: Block) -> None:
    import yaml

    from raydp_hpo.cli.experiment import parse_experiment

    raw = yaml.safe_load(block.code)
    if isinstance(raw, dict) and "experiment" in raw and raw.get("kind") != "federated":
        parse_experiment(raw)


@contextlib.contextmanager
def _sandbox(path: Path) -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(path))
        mp.delenv("RAYDP_HPO_STORAGE", raising=False)  # the pages' ~/raydp_results
        mp.chdir(path)
        yield path


@pytest.fixture(scope="module")
def first_search(tmp_path_factory: pytest.TempPathFactory, ray_session: object
                 ) -> Iterator[tuple[Path, dict[str, Any], dict[str, str]]]:
    """docs/getting-started.md run once (its fast blocks: the first search and the CLI's
    checks) in a sandbox the pages that read its results share."""
    sandbox = tmp_path_factory.mktemp("docs")
    with _sandbox(sandbox):
        os.symlink(ROOT / "cluster", sandbox / "cluster")  # the pages run from the repo root
        scope, outputs = _run_page(GETTING_STARTED, sandbox, slow=False)
        yield sandbox, scope, outputs


# --- every block is run or marked ---------------------------------------------------------


def test_every_block_has_a_language_and_every_mark_a_reason() -> None:
    assert ALL_BLOCKS, "no code blocks found"
    for block in ALL_BLOCKS:
        assert block.lang in LANGUAGES, f"{block.id}: fence language {block.lang!r}"
        assert block.mark is None or block.reason, f"{block.id}: a mark needs its reason"
        if block.mark is not None:
            assert block.lang in {"python", "bash"}, f"{block.id}: only code is marked"


def test_unmarked_bash_blocks_hold_only_raydp_hpo_commands() -> None:
    """What the tests run in-process; any other command (make, ray, pip, ...) is marked."""
    for block in ALL_BLOCKS:
        if block.lang == "bash" and block.mark != "skip":
            for command in _commands(block.code):
                assert shlex.split(command, comments=True)[0] == "raydp-hpo", (
                    f"{block.id}: `{command}` is not run by the tests: mark the block "
                    "<!-- skip: why --> or make it a raydp-hpo command")


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.mark == "skip"],
                         ids=lambda b: b.id)
def test_skipped_block(block: Block) -> None:
    pytest.skip(f"{block.id}: {block.reason}")


# --- the pages run ------------------------------------------------------------------------


RUN_ALONE = [p for p in PAGES
             if p not in (README, GETTING_STARTED, CERTIFICATE_PAGE)
             and any(b.lang in {"python", "bash", "yaml"} and b.mark is None
                     for b in _blocks(p))]


@pytest.mark.ray
@pytest.mark.parametrize("page", RUN_ALONE, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_runs(page: Path, tmp_path: Path, ray_session: object) -> None:
    with _sandbox(tmp_path):
        os.symlink(ROOT / "cluster", tmp_path / "cluster")
        scope, _ = _run_page(page, tmp_path, slow=False)
    if page == DOCS / "concepts.md":  # the figures in its comments hold
        from raydp_hpo import Accountant, calibrate_analytic_gaussian, epsilon

        assert round(epsilon(scope["trial"], delta=1e-5, accountant=Accountant.RDP), 3) == 2.597
        assert abs(calibrate_analytic_gaussian(1.0, 1e-5) - 3.7306) < 5e-5
        assert abs(scope["search_sigma"] - 0.973) < 1e-3
        assert (tmp_path / "ledger.journal").exists()
        assert scope["ledger"].report().spent_epsilon > 0


@pytest.mark.ray
def test_getting_started_runs_and_its_search_releases_within_budget(first_search) -> None:
    sandbox, scope, outputs = first_search
    result = scope["result"]
    assert result.certificate.epsilon <= 3.0 and result.certificate.within_budget
    assert Path(result.experiment_path) == sandbox / "raydp_results" / "first-search"
    inverted = [out for cmd, out in outputs.items() if "--epsilon 3" in cmd]
    # the figure in its comment: the default law (truncated negative binomial, η = 2)
    assert len(inverted) == 1 and "0.993165" in inverted[0]


@pytest.mark.ray
def test_the_readme_example_is_the_first_search_verbatim(first_search) -> None:
    """The README's one example is the first python block of Getting started, which runs
    above; its other blocks are marked."""
    readme = [b for b in _blocks(README) if b.mark is None and b.lang == "python"]
    started = [b for b in _blocks(GETTING_STARTED) if b.lang == "python"]
    assert len(readme) == 1 and readme[0].code == started[0].code


@pytest.mark.ray
def test_reading_a_certificate_runs_on_the_first_search(first_search) -> None:
    sandbox, _, _ = first_search
    with _sandbox(sandbox):
        _, outputs = _run_page(CERTIFICATE_PAGE, sandbox, slow=False)
    verify = [out for cmd, out in outputs.items() if "ledger verify" in cmd]
    assert len(verify) == 1 and ": ok" in verify[0]
    published = sandbox / "published" / "first-search"
    assert sorted(p.name for p in published.iterdir()) == [
        "certificate.json", "release.json", "released_model.pt"]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("page", [p for p in PAGES if any(b.mark == "slow" for b in _blocks(p))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_slow_blocks_run(page: Path, tmp_path: Path, ray_session: object) -> None:
    with _sandbox(tmp_path), _ledger_actors_of_this_page():
        os.symlink(ROOT / "cluster", tmp_path / "cluster")
        _run_page(page, tmp_path, slow=True)


@contextlib.contextmanager
def _ledger_actors_of_this_page() -> Iterator[None]:
    """Two pages run the same experiment file into their own sandboxes: the dataset ledger's
    actor the first page started in the suite's shared Ray session holds the first sandbox's
    journal, so the second page's run (another storage path) would be refused as a ledger
    mismatch. A user's second machine has no such actor; the page's actors go with the page."""
    import ray

    from raydp_hpo.ledger.actor import DEFAULT_NAMESPACE

    def named() -> set[str]:
        return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == DEFAULT_NAMESPACE}

    before = named()
    try:
        yield
    finally:
        for name in named() - before:
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(name, namespace=DEFAULT_NAMESPACE))


# --- the own-training-loop excerpt --------------------------------------------------------


def test_your_own_training_loop_matches_the_example_and_its_count() -> None:
    """The guide's trainable is that of examples/own_mlp_parquet.py (run with --smoke by
    tests/test_examples.py), and the diff the guide states is the diff of its two blocks:
    counted with difflib over non-blank lines, indentation ignored."""
    import difflib

    (after,) = [b.code for b in _blocks(OWN_LOOP_PAGE) if "trial_session(" in b.code]
    (before,) = [b.code for b in _blocks(OWN_LOOP_PAGE) if "PrivacyEngine()" in b.code]

    raw_old = [line for line in before.splitlines() if line.strip()]
    raw_new = [line for line in after.splitlines() if line.strip()]
    old, new = [line.strip() for line in raw_old], [line.strip() for line in raw_new]
    added = replaced = replacing = indented = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new,
                                                       autojunk=False).get_opcodes():
        assert tag != "delete"
        added += (j2 - j1) if tag == "insert" else 0
        replaced += (i2 - i1) if tag == "replace" else 0
        replacing += (j2 - j1) if tag == "replace" else 0
        if tag == "equal":
            indented += sum(a != b for a, b in zip(raw_old[i1:i2], raw_new[j1:j2]))
    text = " ".join(OWN_LOOP_PAGE.read_text(encoding="utf-8").split())
    assert (f"**{added} line added** (the `with`), **{replaced} lines replaced by "
            f"{replacing}**") in text
    assert f"{indented} lines re-indented under `with`" in text
    assert f"{len(old)} non-blank lines become {len(new)}" in text

    example = (ROOT / "examples" / "own_mlp_parquet.py").read_text(encoding="utf-8")
    example_lines = {re.sub(r"\s+#\s*raydp.*$", "", line).strip()
                     for line in example.splitlines()}
    for line in after.split("tuner = ")[0].splitlines():
        if line.strip():
            assert line.strip() in example_lines, line


# --- links and the API reference ----------------------------------------------------------


def test_relative_links_resolve() -> None:
    """Every relative link of the README and the docs names a file of this checkout (so they
    work on GitHub as well as in the site)."""
    link = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
    for page in PAGES:
        for target in link.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: {target}"


def test_the_api_reference_covers_the_public_api() -> None:
    """Every name of ``raydp_hpo.__all__`` is documented from its public path."""
    import raydp_hpo

    reference = "\n".join(p.read_text(encoding="utf-8")
                          for p in (DOCS / "reference").glob("*.md"))
    documented = set(re.findall(r"^::: raydp_hpo\.(\w+)\s*$", reference, re.M))
    missing = set(raydp_hpo.__all__) - documented - {"errors"}
    errors_page = "::: raydp_hpo.errors" in reference
    missing = {name for name in missing
               if not (errors_page and name.endswith("Error"))}
    assert not missing, f"not in docs/reference: {sorted(missing)}"
