"""MkDocs hook: links from the docs to files of the repository outside ``docs/``.

The pages link to examples, cluster files and benchmark summaries with paths relative to their
own place in the repository (``../../examples/own_mlp_parquet.py`` from ``docs/how-to/``), so
the same Markdown works on GitHub. MkDocs only knows ``docs/``: this hook copies every such
target into the site under ``repo/`` (following the links of copied Markdown pages too, e.g. a
benchmark summary's plots) and rewrites the links to it. A link to a file that does not exist
is left alone, so ``mkdocs build --strict`` still fails on it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

_LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")
_REPO_PREFIX = "repo"


def _roots(config: Any) -> tuple[Path, Path]:
    docs = Path(config["docs_dir"]).resolve()
    return docs, Path(config["config_file_path"]).resolve().parent


def _real_path(src_uri: str, docs: Path, root: Path) -> Path:
    """Where the page with this ``src_uri`` lies in the repository."""
    if src_uri.startswith(_REPO_PREFIX + "/"):
        return root / src_uri[len(_REPO_PREFIX) + 1:]
    return docs / src_uri


def _outside_target(page: Path, target: str, docs: Path, root: Path) -> Path | None:
    """The repository file a relative link of ``page`` names, when it lies outside docs/."""
    if "://" in target or target.startswith(("/", "mailto:")):
        return None
    path = (page.parent / target).resolve()
    if not path.is_file() or path.is_relative_to(docs) or not path.is_relative_to(root):
        return None
    return path


def on_files(files: Files, config: Any) -> Files:
    docs, root = _roots(config)
    pending = [docs / f.src_uri for f in files if f.src_uri.endswith(".md")]
    seen: set[Path] = set()
    while pending:
        page = pending.pop()
        for _, target, _ in _LINK.findall(page.read_text(encoding="utf-8")):
            path = _outside_target(page, target, docs, root)
            if path is None or path in seen:
                continue
            seen.add(path)
            rel = path.relative_to(root).as_posix()
            files.append(File.generated(config, f"{_REPO_PREFIX}/{rel}", abs_src_path=str(path)))
            if path.suffix == ".md":
                pending.append(path)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    docs, root = _roots(config)
    src_uri = page.file.src_uri
    real = _real_path(src_uri, docs, root)

    def rewrite(match: re.Match[str]) -> str:
        path = _outside_target(real, match.group(2), docs, root)
        if path is None:
            return match.group(0)
        target = f"{_REPO_PREFIX}/{path.relative_to(root).as_posix()}"
        link = posixpath.relpath(target, posixpath.dirname(src_uri) or ".")
        return f"{match.group(1)}{link}{match.group(3)}"

    return _LINK.sub(rewrite, markdown)
