"""The CLI's warning display (raydp_hpo.cli.warning_lines): a project warning is one
`[raydp-hpo] WARNING:` line on stderr, once; another library's keeps Python's format."""

from __future__ import annotations

import warnings
from pathlib import Path

import raydp_hpo
from raydp_hpo.cli.warning_lines import PREFIX, one_line_warnings

INSIDE = str(Path(raydp_hpo.__file__).parent / "ledger" / "filter.py")


def test_a_project_warning_is_one_line_once_and_others_keep_their_format(capsys) -> None:
    with warnings.catch_warnings(record=True) as python_shows:  # Python's own display
        warnings.simplefilter("always")
        with one_line_warnings():
            for _ in range(2):  # raised twice ("always"), shown once
                warnings.warn_explicit("journal j: a stored curve", RuntimeWarning, INSIDE, 481)
            warnings.warn_explicit("from elsewhere", UserWarning, "/elsewhere/lib.py", 7)
    captured = capsys.readouterr()
    assert captured.out == ""  # stdout stays for answers (--json)
    assert captured.err == f"{PREFIX}journal j: a stored curve\n", captured.err
    # the other library's warning went to Python's display, untouched
    assert [(str(w.message), w.filename) for w in python_shows] == [
        ("from elsewhere", "/elsewhere/lib.py")]
