"""``raydp-hpo dashboard``: serve the read-only dashboard with uvicorn.

Safe by default: it binds 127.0.0.1; a bind to any other address serves only with an access
token (``--token TOKEN``, ``$RAYDP_HPO_DASHBOARD_TOKEN``, or a random one generated and printed
when none is given), since anyone who can reach the port would otherwise read every budget.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from raydp_hpo.errors import InvalidParameterError, RayDPHPOError

__all__ = ["add_parser", "serve", "TOKEN_ENV", "DEFAULT_PORT"]

TOKEN_ENV = "RAYDP_HPO_DASHBOARD_TOKEN"
DEFAULT_PORT = 8765
_GENERATE = "\x00generate"


def is_local(host: str) -> bool:
    """Whether ``host`` is a loopback address (only this machine can connect)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_token(host: str, flag: str | None, out: Callable[[str], None]) -> str | None:
    """The access token to require: ``--token VALUE``, else ``$RAYDP_HPO_DASHBOARD_TOKEN``,
    else (``--token`` without a value, or a non-local bind) a fresh random one, printed."""
    if flag is not None and flag != _GENERATE:
        token: str | None = flag
    else:
        token = os.environ.get(TOKEN_ENV, "").strip() or None
    if token is None and (flag == _GENERATE or not is_local(host)):
        token = secrets.token_urlsafe(24)
        if not is_local(host):
            out(f"raydp-hpo dashboard: binding {host} (not only this machine): every request "
                "needs the access token below (--token or $" + TOKEN_ENV + " sets your own)")
    if token is not None and len(token) < 16:
        raise InvalidParameterError(
            f"--token: an access token needs at least 16 characters, got {len(token)}; omit "
            "the value (`--token`) to have a random one generated")
    return token


def _shown_default(path: Path) -> str:
    """The default storage as the pages name it: ``~/…`` under the home folder (the pages show
    no more of this machine's paths than the user's own shorthand)."""
    try:
        return f"~/{path.relative_to(Path.home().resolve()).as_posix()}"
    except ValueError:
        return str(path)


def add_parser(sub: argparse._SubParsersAction, func: Callable[[argparse.Namespace], int]
               ) -> argparse.ArgumentParser:
    """Register ``dashboard`` on the CLI's subcommands."""
    p = sub.add_parser(
        "dashboard", help="read-only web view of privacy budgets: ledgers, charges, "
                          "experiments (pip install 'raydp-hpo[dashboard]')")
    p.add_argument("locations", nargs="*", metavar="LOCATION",
                   help="storage paths (folders with experiments and ledgers/) and "
                        "postgresql://host:port/db URIs (credentials from libpq); default: "
                        "the default storage (~/raydp_results or $RAYDP_HPO_STORAGE)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; any other "
                        "needs an access token)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--token", nargs="?", const=_GENERATE, default=None,
                   help="require an access token: --token VALUE (16+ characters), or --token "
                        f"alone for a random one (also ${TOKEN_ENV}); on by itself for a "
                        "non-local --host")
    p.set_defaults(func=func)
    return p


def serve(args: argparse.Namespace) -> int:
    """Run the dashboard until interrupted."""
    try:
        import uvicorn
    except ImportError:
        raise RayDPHPOError("the dashboard needs its optional dependencies (uvicorn is "
                            "missing): pip install 'raydp-hpo[dashboard]'") from None
    from raydp_hpo._storage import default_storage_path
    from raydp_hpo.dashboard.app import build_app

    if not 0 <= args.port <= 65535:
        raise InvalidParameterError(f"--port {args.port} is not a port; use 0..65535")
    locations = list(args.locations) or [_shown_default(default_storage_path())]
    token = resolve_token(args.host, args.token, print)
    app = build_app(locations, token=token)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
        sock.listen(128)  # from now on connections wait in the backlog until uvicorn serves
    except OSError as exc:
        sock.close()
        raise RayDPHPOError(f"dashboard: cannot bind {args.host}:{args.port} "
                            f"({exc.strerror or exc}); pick another --port (0: any free one)"
                            ) from None
    port = sock.getsockname()[1]
    shown_host = f"[{args.host}]" if family == socket.AF_INET6 else args.host
    address = f"http://{shown_host}:{port}/" + (f"?token={token}" if token else "")
    print(f"raydp-hpo dashboard: {', '.join(locations)} (read-only) at {address}", flush=True)
    print("  Ctrl-C stops it", flush=True)
    # read every ledger once now, so the first page view finds them read
    threading.Thread(target=app.catalogue.ledgers, name="dashboard-prewarm", daemon=True).start()
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    sys.stdout.flush()
    return 0
