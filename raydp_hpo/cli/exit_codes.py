"""The exit codes of the ``raydp-hpo`` command line, shared by its subcommand modules.

0 success; 1 anything else (a crash, or a failed final run: nothing released); 2 bad input
(nothing charged); 3 the budget cannot pay. :mod:`raydp_hpo.cli.main` re-exports them.
"""

from __future__ import annotations

__all__ = ["EXIT_OK", "EXIT_ERROR", "EXIT_BAD_INPUT", "EXIT_BUDGET_EXHAUSTED"]

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_BUDGET_EXHAUSTED = 0, 1, 2, 3
