"""Job entrypoint for ``ray job submit``: runs ``raydp-hpo run`` inside the job's driver.

Usage (see cluster/README.md)::

    ray job submit --address http://HEAD:8265 --working-dir . \\
        --runtime-env cluster/runtime_env.yaml -- \\
        python cluster/entrypoint.py cluster/examples/mnist1d_small.yaml [raydp-hpo run options]

Inside a job Ray sets ``RAY_ADDRESS``, so the CLI attaches to the cluster instead of starting
a local Ray. The process exit code is the CLI's (0 ok, 2 bad input, 3 budget exhausted,
1 crash), which ``ray job submit`` reports as the job's status (0: SUCCEEDED, else FAILED).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The working dir is the repository root: make its packages importable without installing.
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))


def main(argv: list[str] | None = None) -> int:
    from raydp_hpo.cli.main import main as cli_main

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        print("usage: entrypoint.py EXPERIMENT.yaml [raydp-hpo run options]", file=sys.stderr)
        return 2
    return cli_main(["run", *args])


if __name__ == "__main__":
    sys.exit(main())
