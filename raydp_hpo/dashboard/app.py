"""The dashboard's web application: Starlette routes over a :class:`~.data.Catalogue`.

Every route answers ``GET`` (and ``HEAD``) only: no endpoint changes a ledger, and any other
method is refused (405). With a token, every request must carry it (``Authorization: Bearer``,
the ``raydp_hpo_token`` cookie, or ``?token=`` once, which sets the cookie and redirects to the
same page without it, so the token does not stay in the address bar or the history).
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from raydp_hpo.dashboard.data import (
    PAGE_SIZE,
    Catalogue,
    LedgerSummary,
    read_experiment,
    sort_and_filter,
)
from raydp_hpo.errors import RayDPHPOError

__all__ = ["build_app", "TOKEN_COOKIE"]

TOKEN_COOKIE = "raydp_hpo_token"
_COLUMNS = [("ledger", "ledger", ""), ("binding", "dataset / binding", ""),
            ("budget", "budget (ε, δ)", "num"), ("spent", "spent ε", "num"),
            ("remaining", "remaining ε", "num"), ("rule", "halting rule", ""),
            ("charges", "charges", "num"), ("last", "last charge", ""),
            ("integrity", "integrity", "")]
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'")


def _fmt_time(t: float | None) -> str:
    if t is None:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _script_json(value: Any) -> str:
    """JSON safe inside a ``<script type="application/json">`` block."""
    return (json.dumps(value, allow_nan=False, separators=(",", ":"))
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as the string ``"inf"``, ``"-inf"`` or ``"nan"``
    (JSON has no infinity; a certificate's reference figure may be infinite)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def plotly_js_path() -> Path:
    """The ``plotly.min.js`` shipped inside the ``plotly`` package (served locally, no CDN)."""
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise RayDPHPOError(f"the plotly package has no plotly.min.js at {path}; reinstall it: "
                            "pip install --force-reinstall plotly")
    return path


def ledger_page(catalogue: Catalogue, summary: LedgerSummary, page: int) -> dict[str, Any]:
    """One page of a ledger: its summary, the charges of ``page`` (newest first,
    :data:`~.data.PAGE_SIZE` a page), the experiments that charged it and the spend plot's
    data."""
    rows = summary.charge_rows
    pages = max(1, math.ceil(len(rows) / PAGE_SIZE))
    if not 1 <= page <= pages:
        raise RayDPHPOError(f"page={page} is out of range: this ledger has {pages} page(s)")
    end = len(rows) - (page - 1) * PAGE_SIZE
    start = max(0, end - PAGE_SIZE)
    chunk = rows[start:end][::-1]
    owners: dict[str, dict[str, Any]] = {}
    for row in rows:
        o = owners.setdefault(row["owner"], {"owner": row["owner"], "count": 0})
        o["count"] += 1
        o["epsilon_after"] = row["epsilon_after"]
        o["last"] = row["time"]
    links = {name: catalogue.experiments_named(name) for name in owners if name}
    for o in owners.values():
        o["links"] = links.get(o["owner"], [])
    # the spend after each charge, from ε=0 when the ledger was created
    origin = [] if summary.created is None else [(summary.created, 0.0, "ledger created")]
    points = origin + [(r["time"], _finite(r["epsilon_after"]), r["charge_id"]) for r in rows]
    plot = {"time": [p[0] for p in points], "epsilon_after": [p[1] for p in points],
            "charge_id": [p[2] for p in points], "budget": summary.budget_epsilon}
    return {"page": page, "pages": pages, "rows": chunk, "first": start + 1 if rows else 0,
            "last": end, "owners": sorted(owners.values(), key=lambda o: o["last"]),
            "links": links, "plot": plot}


def build_app(locations: list[str], *, token: str | None = None) -> Any:
    """The Starlette application over ``locations`` (storage paths and PostgreSQL URIs).
    ``token``: required on every request when given."""
    try:
        import jinja2
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import (
            FileResponse,
            HTMLResponse,
            JSONResponse,
            PlainTextResponse,
            RedirectResponse,
            Response,
        )
        from starlette.routing import Route
    except ImportError as exc:
        raise RayDPHPOError(
            f"the dashboard needs its optional dependencies ({exc.name} is missing): "
            "pip install 'raydp-hpo[dashboard]'"
        ) from None
    from raydp_hpo.dashboard.templates import PLOTS_JS, TEMPLATES

    catalogue = Catalogue(locations)
    plotly_js = plotly_js_path()
    env = jinja2.Environment(loader=jinja2.DictLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined)

    def url(path: str, **params: Any) -> str:
        query = {k: v for k, v in params.items() if v not in (None, "")}
        return path + ("?" + urlencode(query) if query else "")

    env.globals.update(url=url, fmt_time=_fmt_time, n_locations=len(locations))

    def as_json(payload: Any, status: int = 200) -> Response:
        return JSONResponse(json_safe(payload), status_code=status)

    def html(name: str, status: int = 200, **ctx: Any) -> Response:
        return HTMLResponse(env.get_template(name).render(**ctx), status_code=status)

    def wants_json(request: Request) -> bool:
        return request.url.path.startswith("/api/")

    def not_found(request: Request, what: str) -> Response:
        if wants_json(request):
            return JSONResponse({"error": what}, status_code=404)
        return html("error.html", 404, title="Not found", message=what)

    def bad_request(request: Request, message: str) -> Response:
        if wants_json(request):
            return JSONResponse({"error": message}, status_code=400)
        return html("error.html", 400, title="Bad request", message=message)

    def ledgers(request: Request) -> Response:
        sort = request.query_params.get("sort", "ledger")
        order = request.query_params.get("order", "asc")
        q = request.query_params.get("q", "")
        if order not in ("asc", "desc"):
            return bad_request(request, f"order={order!r}: use asc or desc")
        try:
            rows = sort_and_filter(catalogue.ledgers(), sort=sort, descending=order == "desc",
                                   query=q)
        except RayDPHPOError as exc:
            return bad_request(request, str(exc))
        if wants_json(request):
            return as_json({"ledgers": [r.to_dict() for r in rows], "errors": catalogue.errors,
                                 "experiments": [{"id": e.id, "name": e.name,
                                                  "experiment": e.shown}
                                                 for e in catalogue.experiments()]})
        return html("ledgers.html", rows=rows, columns=_COLUMNS, sort=sort, order=order, q=q,
                    experiments=catalogue.experiments(), errors=catalogue.errors)

    def ledger(request: Request) -> Response:
        summary = catalogue.ledger(request.path_params["ledger_id"])
        if summary is None:
            return not_found(request, f"no ledger {request.path_params['ledger_id']!r} under "
                                      "the given locations")
        raw_page = request.query_params.get("page", "1")
        try:
            page = int(raw_page)
            view = ledger_page(catalogue, summary, page)
        except ValueError:
            return bad_request(request, f"page={raw_page!r} is not a page number")
        except RayDPHPOError as exc:
            return bad_request(request, str(exc))
        if wants_json(request):
            return as_json({
                **summary.to_dict(), "page": view["page"], "pages": view["pages"],
                "page_size": PAGE_SIZE, "charge_rows": view["rows"],
                "experiments": [{"owner": o["owner"], "charges": o["count"],
                                 "epsilon_after": _finite(o["epsilon_after"]),
                                 "last_charge": o["last"],
                                 "links": [e.id for e in o["links"]]} for o in view["owners"]],
            })
        return html("ledger.html", s=summary, plot_json=_script_json(view.pop("plot")), **view)

    def experiment(request: Request) -> Response:
        exp = catalogue.experiment(request.path_params["experiment_id"])
        if exp is None:
            return not_found(request, f"no experiment {request.path_params['experiment_id']!r} "
                                      "under the given locations")
        try:
            x = read_experiment(exp)
        except RayDPHPOError as exc:
            return not_found(request, str(exc))
        if wants_json(request):
            return as_json(x)
        known = {"algorithm", "paper", "description", "budget", "epsilon", "ledger",
                 "privacy_unit", "charges", "treated_as_public"}
        cert = x["certificate"] if isinstance(x["certificate"], dict) else {}
        extra = {k: json.dumps(v, indent=2) if not isinstance(v, str) else v
                 for k, v in cert.items() if k not in known}
        return html("experiment.html", x=x, extra=extra,
                    cert_json=json.dumps(cert, indent=2, ensure_ascii=False),
                    acc_json=_script_json(x["accuracy_vs_epsilon"]))

    def public_file(request: Request) -> Response:
        exp = catalogue.experiment(request.path_params["experiment_id"])
        name = request.path_params["name"]
        if exp is None:
            return not_found(request, "no such experiment")
        public = exp.directory / "public"
        listed = {p.name for p in public.iterdir() if p.is_file()} if public.is_dir() else set()
        if name not in listed:  # only a file listed in public/: no traversal, nothing private
            return not_found(request, f"{name!r} is not a released file of this experiment")
        return FileResponse(public / name, filename=name)

    def api_experiments(request: Request) -> Response:
        return JSONResponse({"experiments": [{"id": e.id, "name": e.name, "experiment": e.shown}
                                             for e in catalogue.experiments()]})

    def plotly(request: Request) -> Response:
        return FileResponse(plotly_js, media_type="text/javascript",
                            headers={"Cache-Control": "max-age=86400"})

    def plots(request: Request) -> Response:
        return Response(PLOTS_JS, media_type="text/javascript")

    get = ["GET"]
    routes = [
        Route("/", ledgers, methods=get),
        Route("/api/ledgers", ledgers, methods=get),
        Route("/ledgers/{ledger_id}", ledger, methods=get),
        Route("/api/ledgers/{ledger_id}", ledger, methods=get),
        Route("/experiments/{experiment_id}", experiment, methods=get),
        Route("/api/experiments", api_experiments, methods=get),
        Route("/api/experiments/{experiment_id}", experiment, methods=get),
        Route("/experiments/{experiment_id}/public/{name}", public_file, methods=get),
        Route("/static/plotly.min.js", plotly, methods=get),
        Route("/static/plots.js", plots, methods=get),
    ]
    app = Starlette(routes=routes)

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        request = Request(scope)
        if token is not None:
            given = request.query_params.get("token")
            if given is not None and secrets.compare_digest(given.encode(), token.encode()):
                # once: remember it in a cookie and drop it from the address
                rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
                target = request.url.path + ("?" + urlencode(rest) if rest else "")
                response: Response = RedirectResponse(target, status_code=303)
                response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
                await response(scope, receive, send)
                return
            auth = request.headers.get("authorization", "")
            offered = (auth[7:] if auth.lower().startswith("bearer ")
                       else request.cookies.get(TOKEN_COOKIE, ""))
            if not secrets.compare_digest(offered.encode(), token.encode()):
                response = PlainTextResponse(
                    "raydp-hpo dashboard: an access token is required; open the address "
                    "`raydp-hpo dashboard` printed (it ends in ?token=...), or send "
                    "'Authorization: Bearer TOKEN'", status_code=401)
                await response(scope, receive, send)
                return

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(b"content-security-policy", _CSP.encode()),
                            (b"x-content-type-options", b"nosniff"),
                            (b"referrer-policy", b"no-referrer"),
                            (b"x-frame-options", b"DENY")]
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, send_with_headers)

    guarded.catalogue = catalogue  # type: ignore[attr-defined]
    return guarded
