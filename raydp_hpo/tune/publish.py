"""Publication: exactly the public part of a DP hyperparameter search, and nothing else.

Only the output of the selection mechanism is public (DESIGN.md, "Released vs private"): the
chosen hyperparameters, the released model, the certificate. An experiment folder
``<storage>/<experiment>/`` is laid out so that this is visible::

    public/                  what may be published, as is (written by DPTuner at release)
      release.json           hyperparameters, certificate, DP test accuracy, file names
      certificate.json       the privacy certificate alone
      released_model.pt      the released model's weights and architecture (when released)
      released_model.pt2     a user model's exported program (torch.export), when it exports
    PRIVATE_README.txt       says that everything else here is private
    tune/  ledger.journal  audit.jsonl  dptuner.pkl  evaluation_private.json  run.json  report/
                             PRIVATE: Tune's trials and checkpoints (secret generator states,
                             unnoised per-trial metrics, the number of trials), the ledger's
                             journal, the restore file, the unnoised evaluation

No file in ``public/`` names a machine path (the released model is named relative to it).
:func:`write_public_files` is the one writer: DPTuner uses it for ``public/``,
:meth:`DPResult.save_public <raydp_hpo.tune.tuner.DPResult.save_public>` and
``raydp-hpo publish RUN_DIR OUT_DIR`` (:func:`publish_run`) use it for a folder of the user's,
which must be new or empty and outside the experiment's private folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from raydp_hpo._atomic_io import atomic_write_bytes, atomic_write_json
from raydp_hpo.errors import InvalidParameterError

__all__ = [
    "PUBLIC_DIR",
    "PUBLIC_RELEASE_FILE",
    "CERTIFICATE_FILE",
    "MODEL_FILE",
    "PRIVATE_NOTE_FILE",
    "public_manifest",
    "machine_paths",
    "write_public_files",
    "write_private_note",
    "check_publication_dir",
    "find_release",
    "publish_run",
]

#: The folder of an experiment that holds what may be published.
PUBLIC_DIR = "public"
#: The public manifest in it: :func:`public_manifest`.
PUBLIC_RELEASE_FILE = "release.json"
#: The certificate alone.
CERTIFICATE_FILE = "certificate.json"
#: The released model (the name :mod:`raydp_hpo.trainables.release` uses).
MODEL_FILE = "released_model.pt"
#: Suffix of a user model's exported program beside it (``released_model.pt2``; see
#: :func:`raydp_hpo.trainables.release.program_path`).
PROGRAM_SUFFIX = ".pt2"
#: The note at the top of an experiment folder that everything but ``public/`` is private.
PRIVATE_NOTE_FILE = "PRIVATE_README.txt"

PUBLIC_NOTE = (
    "PUBLIC: the output of the DP selection (hyperparameters, model, DP test accuracy) and its "
    "privacy certificate, which covers all of it. Publish this folder as it is."
)
#: The note of a search that selected nothing: nothing in the folder reads as a selection.
NOTHING_SELECTED_NOTE = (
    "PUBLIC: this search selected nothing ({reason}): no hyperparameters and no model are "
    "released. The privacy certificate states what the search spent all the same (spent is "
    "spent). Publish this folder as it is."
)
PRIVATE_NOTE = """\
PRIVATE: everything in this experiment folder except public/ must not be published.

  public/                  what may be published (release.json, certificate.json,
                           released_model.pt): covered by the privacy certificate
  tune/                    Tune's trials: unnoised per-trial metrics, the number of trials,
                           checkpoints holding the secret noise generators' states
  ledger.journal, audit.jsonl   the privacy ledger's record and the audit trail (private)
  dptuner.pkl, run.json    settings to restore / of the run (paths of this machine)
  evaluation_private.json  the released model's test accuracy computed WITHOUT noise

Copy the public part elsewhere with DPResult.save_public(DIR) or
`raydp-hpo publish RUN_DIR OUT_DIR`.
"""

_WINDOWS_ABSOLUTE = re.compile(r"^[A-Za-z]:[\\/]")


def public_manifest(*, hyperparameters: Mapping[str, Any] | None, certificate: Mapping[str, Any],
                    budget_exhausted: bool, dp_test_accuracy: Mapping[str, Any] | None,
                    model_released: bool, reason: str | None = None) -> dict[str, Any]:
    """What ``public/release.json`` holds: only what the certificate covers, files named
    relative to the folder (no machine path). ``selected`` says whether the search selected
    a configuration; when it did not, ``reason`` says why (a coarse reason, never a trial's
    error text, which may quote private data) and the note says that nothing but the
    certificate is released."""
    files = [PUBLIC_RELEASE_FILE, CERTIFICATE_FILE, *([MODEL_FILE] if model_released else [])]
    selected = hyperparameters is not None
    why = None if selected else (reason or "no configuration was selected")
    return {
        "selected": selected,
        "reason": why,
        "hyperparameters": None if hyperparameters is None else dict(hyperparameters),
        "model_file": MODEL_FILE if model_released else None,
        "budget_exhausted": bool(budget_exhausted),
        "certificate": dict(certificate),
        # search="auto": what it chose and why (also in the certificate)
        **({"auto_search": certificate["auto_search"]} if certificate.get("auto_search")
           else {}),
        "dp_test_accuracy": None if dp_test_accuracy is None else dict(dp_test_accuracy),
        "files": files,
        "note": PUBLIC_NOTE if selected else NOTHING_SELECTED_NOTE.format(reason=why),
    }


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(str(key), f"{where}.<key>")
            yield from _strings(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _strings(item, f"{where}[{i}]")


def machine_paths(payload: Any, *, private: tuple[str | os.PathLike[str], ...] = ()
                  ) -> list[str]:
    """``key=value`` of every string in ``payload`` that names a place on this machine: an
    absolute path (``/...``, ``~...``, ``C:\\...``) or one containing the home directory or one
    of the ``private`` folders. Empty: nothing in ``payload`` points at this machine."""
    needles = [str(Path(p).expanduser().resolve()) for p in (Path.home(), *private)]
    needles = [n for n in needles if len(Path(n).parts) > 1]  # never "/" itself
    found = []
    for where, text in _strings(payload, "$"):
        if (text.startswith(("/", "~", "\\\\")) or _WINDOWS_ABSOLUTE.match(text)
                or any(n in text for n in needles)):
            found.append(f"{where}={text!r}")
    return found


def check_publication_dir(directory: str | os.PathLike[str],
                          private_dir: str | os.PathLike[str] | None) -> Path:
    """The resolved ``directory`` if it may receive a publication: not inside ``private_dir``
    (the experiment folder) and new or empty; else :class:`InvalidParameterError`."""
    target = Path(directory).expanduser().resolve()
    if private_dir is not None:
        private = Path(private_dir).expanduser().resolve()
        if target == private or target.is_relative_to(private):
            raise InvalidParameterError(
                f"publication dir {str(target)!r} is inside the experiment folder {str(private)!r}, "
                "which is private (Tune's trials, the ledger journal, checkpoints); publish to a "
                "folder outside it"
            )
    if target.exists() and not target.is_dir():
        raise InvalidParameterError(
            f"publication dir {str(target)!r} is a file; name a new or empty folder"
        )
    if target.is_dir() and any(target.iterdir()):
        raise InvalidParameterError(
            f"publication dir {str(target)!r} already holds files; name a new or empty folder "
            "(a publication holds exactly the public files, nothing else)"
        )
    return target


def write_public_files(directory: str | os.PathLike[str], manifest: Mapping[str, Any],
                       model_source: str | os.PathLike[str] | None, *,
                       private: tuple[str | os.PathLike[str], ...] = (),
                       strict: bool = True) -> list[Path]:
    """Write exactly the public files of ``manifest`` into ``directory``: ``release.json``,
    ``certificate.json`` and (when a model is released) the model copied from
    ``model_source``; any other entry of ``directory`` is removed. ``strict`` (default):
    :class:`InvalidParameterError` before writing anything if a string names a machine path
    (:func:`machine_paths`; ``private``: folders whose paths must not appear)."""
    found = machine_paths(manifest, private=private)
    if found and strict:
        raise InvalidParameterError(
            "the public release would name paths of this machine: " + ", ".join(found[:5])
            + "; remove them from the search space's constants (they are released as "
            "hyperparameters) before publishing"
        )
    model_file = manifest.get("model_file")
    source = None if model_source is None else Path(model_source).expanduser().resolve()
    if model_file is not None and (source is None or not source.is_file()):
        raise InvalidParameterError(
            f"the released model file is missing ({model_source!r}); it is written by "
            "DPTuner.fit() into the experiment's public/ folder"
        )
    program = None if source is None else source.with_suffix(PROGRAM_SUFFIX)
    if model_file is not None and program is not None and program.is_file():
        # a user model's exported program (loads where its model_fn does not import)
        files = [f for f in manifest.get("files", []) if f != Path(str(model_file)).with_suffix(
            PROGRAM_SUFFIX).name]
        manifest = {**manifest, "files": [*files, Path(str(model_file)).with_suffix(
            PROGRAM_SUFFIX).name]}
    else:
        program = None
    out = Path(directory).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / PUBLIC_RELEASE_FILE, dict(manifest))
    atomic_write_json(out / CERTIFICATE_FILE, manifest["certificate"])
    written = [out / PUBLIC_RELEASE_FILE, out / CERTIFICATE_FILE]
    if model_file is not None:
        assert source is not None
        target = out / str(model_file)
        if source != target:
            atomic_write_bytes(target, source.read_bytes())
        written.append(target)
        if program is not None:
            program_target = target.with_suffix(PROGRAM_SUFFIX)
            if program != program_target:
                atomic_write_bytes(program_target, program.read_bytes())
            written.append(program_target)
    keep = {p.name for p in written}
    for entry in out.iterdir():  # exactly the public files: nothing stale stays
        if entry.name not in keep:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    return written


def write_private_note(experiment_dir: str | os.PathLike[str]) -> Path:
    """``PRIVATE_README.txt`` at the top of an experiment folder (what is private, and how to
    publish the public part)."""
    path = Path(experiment_dir) / PRIVATE_NOTE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file():
        atomic_write_bytes(path, PRIVATE_NOTE.encode("utf-8"))
    return path


def find_release(run_dir: str | os.PathLike[str]) -> Path | None:
    """The release file of a finished experiment folder: ``public/release.json``, or an older
    run dir's top-level ``release.json``; ``None`` when the run released nothing yet."""
    run = Path(run_dir).expanduser()
    for candidate in (run / PUBLIC_DIR / PUBLIC_RELEASE_FILE, run / PUBLIC_RELEASE_FILE):
        if candidate.is_file():
            return candidate
    return None


def _manifest_of(run: Path) -> tuple[dict[str, Any], Path | None]:
    """The public manifest of a finished run dir and its model file (older run dirs: built
    from the top-level ``release.json``, without its machine path)."""
    release = find_release(run)
    if release is None:
        raise InvalidParameterError(
            f"{str(run)!r} is not a finished experiment folder (no {PUBLIC_DIR}/"
            f"{PUBLIC_RELEASE_FILE}); pass <storage_path>/<experiment> of a run that released"
        )
    try:
        raw = json.loads(release.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidParameterError(f"cannot read {str(release)!r}: {exc}") from None
    if release.parent.name == PUBLIC_DIR and "model_file" in raw:
        model = raw["model_file"]
        return raw, None if model is None else release.parent / str(model)
    # an older run dir: release.json beside the private files, with the absolute model_path
    model_path = raw.get("model_path")
    source = None
    if model_path is not None:
        source = run / MODEL_FILE if (run / MODEL_FILE).is_file() else Path(model_path)
    manifest = public_manifest(
        hyperparameters=raw.get("hyperparameters"), certificate=raw["certificate"],
        budget_exhausted=bool(raw.get("budget_exhausted")),
        dp_test_accuracy=raw.get("dp_test_accuracy"), model_released=source is not None,
    )
    return manifest, source


def publish_run(run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Copy the public part of the finished experiment folder ``run_dir`` into ``out_dir`` (new
    or empty, outside ``run_dir``): the files :func:`write_public_files` writes, nothing else.
    Returns the files written."""
    run = Path(run_dir).expanduser().resolve()
    if not run.is_dir():
        raise InvalidParameterError(f"experiment folder {str(run)!r} does not exist")
    manifest, model = _manifest_of(run)
    target = check_publication_dir(out_dir, run)
    return write_public_files(target, manifest, model, private=(run, run.parent))
