"""The dashboard: server-rendered HTML (Jinja2), no JavaScript, no build step.

``/`` shows the counts by status, the queue depth and oldest due job, a chart of
the last hours (``?hours=``, 1 to 24: sent, failed and in doubt per minute, an inline
SVG with its numbers as text, see ``kirim.http.chart``), the in-doubt deliveries and
the dead letters (with retry and cancel buttons), and a search by key, event id or
delivery id. ``/dashboard/attention`` lists what needs a human: dead letters,
deliveries held in doubt and those sent under ``assume_sent``, each with its
timeline. ``/dashboard/browse`` pages through every delivery by status, channel,
doubt and creation time (``kirim.http.browse`` checks its query).
``/dashboard/notifications/{id}`` draws one notification's timeline as a pseudo-log.
Buttons are forms posting to dashboard routes, which redirect back (303) with a
message. A bad query parameter gets the page with a message saying which, and 422.

With ``protect_dashboard`` the pages need a token: the ``Authorization`` header,
or a login form that sets an HttpOnly, SameSite=Strict cookie. Without it, the
pages answer only the ``Host`` names of ``[serve] allowed_hosts``, and retry and
cancel only when the server is bound to loopback (see ``kirim.http.guard``). Every
POST is refused when the browser says it comes from another site (``Origin`` /
``Sec-Fetch-Site``), protected or not.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, urlsplit

import jinja2
from fastapi import APIRouter, Path, Query, Request
from markupsafe import Markup
from starlette.responses import HTMLResponse, RedirectResponse, Response

from kirim.engine import Kirim
from kirim.errors import ActionRefused, NotFound, NotSettled
from kirim.http import browse, chart
from kirim.http.auth import COOKIE, bearer_secret
from kirim.http.errors import ApiError
from kirim.http.guard import host_allowed, writable
from kirim.http.routes_notifications import read_body, record_of
from kirim.http.service import Service, service
from kirim.model import Delivery, DeliveryStatus, Doubt, Job, JobStatus, RecordFilter
from kirim.operations import Page
from kirim.text import visible
from kirim.timeline import events
from kirim.validation import MAX_ID
from kirim.views import Record, iso

router = APIRouter(include_in_schema=False)


def _shown(value: Any) -> Any:
    """What a page shows of a value: text with its control characters escaped (the one
    escaping of every sink, ``kirim.text.visible``), markup made here as it is."""
    return visible(value) if isinstance(value, str) and not isinstance(value, Markup) else value


_env = jinja2.Environment(
    loader=jinja2.PackageLoader("kirim.http", "templates"),
    autoescape=jinja2.select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
    finalize=_shown,
)
_env.filters["iso"] = iso

#: flash messages, by code: the text is never taken from the URL
MESSAGES = {
    "retried": ("ok", "notification {id} requeued with a fresh job"),
    "canceled": ("ok", "notification {id} canceled"),
    "not_retried": ("error", "notification {id} is not dead-lettered: nothing to retry"),
    "not_canceled": ("error", "notification {id} cannot be canceled in its current state"),
    "not_settled": (
        "error",
        "notification {id}: an earlier request may still reach the provider; try again later",
    ),
    "missing": ("error", "no notification {id}"),
    "logged_out": ("ok", "logged out"),
}
CANCELABLE = frozenset({DeliveryStatus.PENDING, DeliveryStatus.FAILED, DeliveryStatus.IN_DOUBT})
PAGE_ROWS = 50
#: the chart's windows offered, in hours (``?hours=`` takes any whole number 1 to 24)
HOURS = (1, 3, 6, 12, 24)
DEFAULT_HOURS = 3
ASSUMED_SENT = RecordFilter(status=DeliveryStatus.SENT, doubt=Doubt.ASSUMED_SENT)

Id = Annotated[int, Path(ge=1, le=MAX_ID)]


def render(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = _env.get_template(name).render(**context)
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})


def _here(request: Request) -> str:
    """This page's path and query, as a local redirect target."""
    query = request.url.query
    return _local(request.url.path + ("?" + query if query else ""))


def _local(path: str | None, default: str = "/") -> str:
    """A redirect target on this site only (no scheme, no host, no ``//``)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return default
    parts = urlsplit(path)
    return default if parts.scheme or parts.netloc else path


async def _client(request: Request, svc: Service) -> str | Response | None:
    """The token's name when the dashboard is protected (None when it is not), or the
    response to send instead (a redirect to the login form; 403 for a ``Host`` that
    an unprotected dashboard does not answer)."""
    if not svc.settings.protect_dashboard:
        hosts = request.headers.getlist("host")
        if len(hosts) != 1 or not host_allowed(hosts[0], svc.settings.allowed_hosts):
            return _refused(
                "This dashboard answers only the host names of [serve] allowed_hosts, and "
                "this request named another: a page of another site may be driving your "
                "browser (DNS rebinding). Add the name to allowed_hosts, or protect the "
                "dashboard with a token (--protect-dashboard)."
            )
        return None
    secret = bearer_secret(request) or request.cookies.get(COOKIE)
    token = None if secret is None else await svc.verifier.verify(secret)
    if token is None:
        target = quote(_here(request))
        return RedirectResponse(f"/dashboard/login?next={target}", status_code=303)
    request.scope.setdefault("state", {})["kirim_client"] = token.name
    return token.name


def _same_site(request: Request) -> bool:
    """False when the browser says the form was posted from another site."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


async def _form(request: Request, svc: Service) -> dict[str, str]:
    raw = await read_body(request, svc.max_body_bytes)
    try:
        parsed = parse_qs(raw.decode("utf-8"), max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {k: v[-1] for k, v in parsed.items()}


def _refused(reason: str, client: str | None = None) -> HTMLResponse:
    return render("forbidden.html", status=403, title="forbidden", client=client, reason=reason)


def _row(d: Delivery, job: Job | None, svc: Service) -> dict[str, Any]:
    """A notification's row, with the buttons its state allows (none when the dashboard
    may not write)."""
    can = writable(svc.settings)
    return {
        "d": d,
        "job": job,
        "retry": can and job is not None and job.status is JobStatus.DEAD,
        "cancel": can
        and (
            d.status in CANCELABLE
            or (d.status is DeliveryStatus.PROCESSING and d.claim_token is None)
        ),
    }


def _flash(msg: str | None, ident: str | None) -> dict[str, str] | None:
    if msg not in MESSAGES:
        return None
    kind, text = MESSAGES[msg]
    safe = ident if ident is not None and ident.isdigit() else "?"
    return {"kind": kind, "text": text.format(id=safe)}


def _age(seconds: float) -> str:
    if seconds < 1:
        return "0 s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


@router.get("/", response_class=HTMLResponse)
async def overview(
    request: Request,
    q: Annotated[str | None, Query(max_length=255)] = None,
    msg: Annotated[str | None, Query(max_length=32)] = None,
    id: Annotated[str | None, Query(max_length=20)] = None,
    hours: Annotated[str | None, Query(max_length=20)] = None,
) -> Response:
    svc = service(request)
    who = await _client(request, svc)
    if isinstance(who, Response):
        return who
    window, problem = _hours(hours)
    store = svc.kirim.store
    now = svc.kirim.clock.now()
    counts = await store.counts()
    stats = await store.queue_stats(now=now)
    doubt_rows = [_row(d, job, svc) for d, job, _ in await svc.kirim.in_doubt(limit=PAGE_ROWS)]
    dead_rows = [_row(d, job, svc) for d, job, _ in await svc.kirim.dead_letters(limit=PAGE_ROWS)]
    query = (q or "").strip()
    found: list[dict[str, Any]] | None = None
    if query:
        found = [
            _row(d, await store.get_job(d.id), svc) for d in await store.search_deliveries(query)
        ]
    statuses = [str(s) for s in DeliveryStatus]
    return render(
        "overview.html",
        status=422 if problem else 200,
        problems=[problem] if problem else [],
        activity=await _activity(svc.kirim, window, now),
        title="overview",
        client=who,
        protected=svc.settings.protect_dashboard,
        flash=_flash(msg, id),
        statuses=statuses,
        deliveries={s: counts["deliveries"].get(s, 0) for s in statuses},
        total=sum(counts["deliveries"].values()),
        jobs=counts["jobs"],
        queue_depth=stats.queue_depth,
        oldest_due=_age(stats.oldest_due_age_s),
        in_doubt_total=stats.in_doubt,
        in_doubt=doubt_rows,
        dead=dead_rows,
        q=query,
        found=found,
        back=_here(request),
        now=iso(now),
    )


def _hours(raw: str | None) -> tuple[int, str | None]:
    """The chart's window in hours, and what is wrong with ``raw`` (then the default)."""
    text = (raw or "").strip()
    if not text:
        return DEFAULT_HOURS, None
    if text.isascii() and text.isdigit() and len(text) <= 2 and 1 <= int(text) <= 24:
        return int(text), None
    return DEFAULT_HOURS, (
        f"hours must be a whole number from 1 to 24: showing the last {DEFAULT_HOURS} hours"
    )


async def _activity(app: Kirim, hours: int, now: float) -> dict[str, Any]:
    """The chart of the last ``hours`` (by the minute; by 5 minutes past 6 hours), from
    the start of a minute, with its numbers."""
    bucket = 60.0 if hours <= 6 else 300.0
    since = math.floor((now - hours * 3600) / bucket) * bucket
    buckets = await app.activity(since=since, bucket=bucket)
    title = f"Deliveries per {chart.per(bucket)}, last {hours} h (UTC)"
    return {
        "hours": hours,
        "choices": sorted({*HOURS, hours}),
        "per": chart.per(bucket),
        "title": title,
        "svg": Markup(chart.svg(buckets, bucket=bucket, title=title)),  # escaped by chart
        "desc": chart.describe(buckets, bucket=bucket),
        "rows": [b for b in buckets if b.sent or b.failed or b.in_doubt],
        "totals": chart.totals(buckets),
    }


def _timed(record: Record, svc: Service, now: float) -> dict[str, Any]:
    """A row (``_row``) with the record's timeline."""
    d, job, _ = record
    lines = events(record, now=now)
    return {**_row(d, job, svc), "lines": lines, "warned": sum(e.warn for e in lines)}


@router.get("/dashboard/attention", response_class=HTMLResponse)
async def attention_page(
    request: Request,
    msg: Annotated[str | None, Query(max_length=32)] = None,
    id: Annotated[str | None, Query(max_length=20)] = None,
) -> Response:
    """What needs a human: dead letters, deliveries held in doubt, those assumed sent."""
    svc = service(request)
    who = await _client(request, svc)
    if isinstance(who, Response):
        return who
    app, now = svc.kirim, svc.kirim.clock.now()
    dead = await app.dead_letters(limit=PAGE_ROWS + 1)
    held = await app.in_doubt(limit=PAGE_ROWS + 1)
    assumed = await app.records(ASSUMED_SENT, limit=PAGE_ROWS)
    sections = [
        {
            "id": "attention-dead",
            "title": "Dead letters",
            "hint": "Failed for good or out of attempts: retry requeues one with a fresh "
            "job, cancel gives it up. (Those held in doubt are listed below.)",
            "empty": "no dead letters",
            # a held delivery's job is dead too: it is listed once, under its doubt
            "rows": [
                _timed(r, svc, now)
                for r in dead[:PAGE_ROWS]
                if r[0].status is not DeliveryStatus.IN_DOUBT
            ],
            "more": len(dead) > PAGE_ROWS,
            "all": browse.link({"dead": "1"}),
        },
        {
            "id": "attention-held",
            "title": "Held in doubt",
            "hint": "A request may have reached the provider and its answer is unknown; "
            "the channel holds such deliveries for an operator. Ask the provider, then "
            "retry (it may then arrive twice) or cancel.",
            "empty": "nothing held in doubt",
            "rows": [_timed(r, svc, now) for r in held[:PAGE_ROWS]],
            "more": len(held) > PAGE_ROWS,
            "all": browse.link({"status": str(DeliveryStatus.IN_DOUBT)}),
        },
        {
            "id": "attention-assumed",
            "title": "Assumed sent",
            "hint": "An earlier request may have arrived, so kirim did not send again "
            "(at most once) and counts the delivery as sent. Check with the provider "
            "that it did arrive.",
            "empty": "nothing assumed sent",
            "rows": [_timed(r, svc, now) for r in assumed.records],
            "more": assumed.next_cursor is not None,
            "all": browse.link({"status": "sent", "doubt": str(Doubt.ASSUMED_SENT)}),
        },
    ]
    return render(
        "attention.html",
        title="needs a human",
        client=who,
        protected=svc.settings.protect_dashboard,
        flash=_flash(msg, id),
        sections=sections,
        limit=PAGE_ROWS,
        back=_here(request),
        now=iso(now),
    )


@router.get("/dashboard/browse", response_class=HTMLResponse)
async def browse_page(
    request: Request,
    msg: Annotated[str | None, Query(max_length=32)] = None,
    id: Annotated[str | None, Query(max_length=20)] = None,
) -> Response:
    """Every delivery, filtered and paged (the query: ``kirim.http.browse``)."""
    svc = service(request)
    who = await _client(request, svc)
    if isinstance(who, Response):
        return who
    given: dict[str, list[str]] = {}
    for name, value in request.query_params.multi_items():
        given.setdefault(name, []).append(value)
    query = browse.parse(given)
    context: dict[str, Any] = {
        "title": "browse",
        "client": who,
        "protected": svc.settings.protect_dashboard,
        "flash": _flash(msg, id),
        "form": query.form,
        "statuses": [str(s) for s in DeliveryStatus],
        "doubts": [str(d) for d in Doubt],
        "back": _here(request),
        "now": iso(svc.kirim.clock.now()),
    }
    if query.errors:
        return render("browse.html", status=422, problems=query.errors, rows=None, **context)
    page = await svc.kirim.records(query.where, cursor=query.cursor, limit=query.limit)
    onward = page.next_cursor
    return render(
        "browse.html",
        problems=[],
        rows=[_row(d, job, svc) for d, job, _ in page.records],
        oldest_first=query.where.oldest_first,
        onward=None if onward is None else browse.link(query.form, onward),
        backward=await _backward(svc.kirim, query, page),
        start=None if query.cursor is None else browse.link(query.form),
        **context,
    )


async def _backward(app: Kirim, query: browse.Browse, page: Page) -> str | None:
    """The link to the page before this one (None on the first): the records just
    before this page's first, read in the other direction."""
    if query.cursor is None:
        return None
    where = query.where
    if page.records:
        edge = page.records[0][0].id
    else:  # past the end: everything before the cursor itself
        edge = query.cursor + (1 if where.oldest_first else -1)
    reverse = dataclasses.replace(where, oldest_first=not where.oldest_first)
    before = await app.records(reverse, cursor=min(max(edge, 0), MAX_ID), limit=query.limit)
    if not before.records:
        return None
    if before.next_cursor is None:  # the page before is the first
        return browse.link(query.form)
    farthest = before.records[-1][0].id
    return browse.link(query.form, farthest - 1 if where.oldest_first else farthest + 1)


@router.get("/dashboard/notifications/{delivery_id}", response_class=HTMLResponse)
async def notification_page(
    request: Request,
    delivery_id: Id,
    msg: Annotated[str | None, Query(max_length=32)] = None,
) -> Response:
    svc = service(request)
    who = await _client(request, svc)
    if isinstance(who, Response):
        return who
    try:
        record: Record = await record_of(svc, delivery_id)
    except ApiError:
        return render(
            "missing.html", status=404, title="not found", delivery_id=delivery_id, client=who
        )
    d, job, attempts = record
    lines = events(record, now=svc.kirim.clock.now())
    return render(
        "notification.html",
        title=f"notification {d.id}",
        client=who,
        protected=svc.settings.protect_dashboard,
        flash=_flash(msg, str(d.id)),
        row=_row(d, job, svc),
        d=d,
        job=job,
        attempts=attempts,
        lines=lines,
        payload=json.dumps(d.payload, indent=2, ensure_ascii=False, sort_keys=True),
        back=f"/dashboard/notifications/{d.id}",
    )


async def _act(request: Request, delivery_id: int, action: str) -> Response:
    svc = service(request)
    who = await _client(request, svc)
    if isinstance(who, Response):
        return who
    if not _same_site(request):
        return render("forbidden.html", status=403, title="forbidden", client=who)
    if not writable(svc.settings):
        return _refused(
            "Retry and cancel need a token when the server listens beyond loopback: "
            "restart it with --protect-dashboard (or bind it to 127.0.0.1).",
            who,
        )
    form = await _form(request, svc)
    back = _local(form.get("back"))
    app = svc.kirim
    try:
        if action == "retry":
            await app.retry(delivery_id, by="id")
            code = "retried"
        else:
            await app.cancel(delivery_id, by="id")
            code = "canceled"
    except NotFound:
        code = "missing"
    except ActionRefused:
        code = "not_retried" if action == "retry" else "not_canceled"
    except NotSettled:
        code = "not_settled"
    if code in ("retried", "canceled"):
        svc.log.info(f"dashboard_{code}", notification_id=delivery_id, client=who)
    back = _strip_flash(back)
    separator = "&" if "?" in back else "?"
    return RedirectResponse(f"{back}{separator}msg={code}&id={delivery_id}", status_code=303)


def _strip_flash(path: str) -> str:
    """The path without an earlier ``msg``/``id`` flash."""
    parts = urlsplit(path)
    if not parts.query:
        return path
    kept = [
        f"{quote(k)}={quote(v)}"
        for k, values in parse_qs(parts.query).items()
        if k not in ("msg", "id")
        for v in values
    ]
    return parts.path + ("?" + "&".join(kept) if kept else "")


@router.post("/dashboard/notifications/{delivery_id}/retry")
async def retry_action(request: Request, delivery_id: Id) -> Response:
    return await _act(request, delivery_id, "retry")


@router.post("/dashboard/notifications/{delivery_id}/cancel")
async def cancel_action(request: Request, delivery_id: Id) -> Response:
    return await _act(request, delivery_id, "cancel")


@router.get("/dashboard/login", response_class=HTMLResponse)
async def login_form(
    request: Request, next: Annotated[str | None, Query(max_length=2000)] = None
) -> Response:
    return render("login.html", title="log in", next=_local(next), error=None, client=None)


@router.post("/dashboard/login")
async def login(request: Request) -> Response:
    svc = service(request)
    if not _same_site(request):
        return render("forbidden.html", status=403, title="forbidden", client=None)
    form = await _form(request, svc)
    target = _local(form.get("next"))
    token = await svc.verifier.verify(form.get("token", "").strip())
    if token is None:
        return render(
            "login.html",
            status=401,
            title="log in",
            next=target,
            error="unknown or revoked token",
            client=None,
        )
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE,
        form["token"].strip(),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/dashboard/logout")
async def logout(request: Request) -> Response:
    if not _same_site(request):
        return render("forbidden.html", status=403, title="forbidden", client=None)
    response = RedirectResponse("/dashboard/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response
