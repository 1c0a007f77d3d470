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
from kirim.http.bodies import read_body
from kirim.http.errors import ApiError
from kirim.http.figures import LABELS, figure_of, figures, word
from kirim.http.flash import flash as _flash
from kirim.http.guard import host_allowed, writable
from kirim.http.routes_notifications import record_of
from kirim.http.service import Service, service
from kirim.http.verbs import VERBS, Verb
from kirim.model import Delivery, DeliveryStatus, Doubt, Job, RecordFilter
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
_env.filters["word"] = word


@jinja2.pass_context
def _when(context: jinja2.runtime.Context, epoch: float | None) -> Markup:
    """A time as how long ago (or how soon) it is, the exact time in its ``datetime``
    and title; the page's ``now_s`` is the clock it is read against."""
    if epoch is None:
        return Markup("-")
    exact = iso(epoch) or ""
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(
        exact, relative(epoch, float(context.get("now_s") or epoch))
    )


def _offered(rows: list[dict[str, Any]]) -> list[Verb]:
    """The verbs some of ``rows`` offer, in ``VERBS``' order (a table's bulk buttons)."""
    return [v for v in VERBS.values() if any(v in r["verbs"] for r in rows)]


_env.filters["when"] = _when
_env.globals["offered_verbs"] = _offered
_env.globals["LABELS"] = LABELS

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
    """A notification's row, with the verbs its state offers (none when the dashboard may
    not write), its figure and its words."""
    can = writable(svc.settings)
    record = Record(d, job, [])
    verbs = [v for v in VERBS.values() if can and v.offered(record)]
    return {
        "d": d,
        "job": job,
        "verbs": verbs,
        "figure": figure_of(str(d.status), d.doubt),
        **{v.name: v in verbs for v in VERBS.values()},
    }


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


def relative(epoch: float, now: float) -> str:
    """``5 min ago``, ``in 2 h``: how far ``epoch`` is from ``now``."""
    gap = now - epoch
    return f"{_age(gap)} ago" if gap >= 0 else f"in {_age(-gap)}"


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
    app = svc.kirim
    store = app.store
    now = app.clock.now()
    found_figures = figures(await store.figures())
    stats = await store.queue_stats(now=now)
    held_rows = [_row(r.delivery, r.job, svc) for r in await app.in_doubt(limit=PAGE_ROWS)]
    assumed = await app.records(ASSUMED_SENT, limit=PAGE_ROWS)
    assumed_rows = [_row(r.delivery, r.job, svc) for r in assumed.records]
    dead_rows = [
        _row(r.delivery, r.job, svc)
        for r in await app.dead_letters(limit=PAGE_ROWS + len(held_rows))
        if r.delivery.status is not DeliveryStatus.IN_DOUBT  # listed once, under its doubt
    ][:PAGE_ROWS]
    query = (q or "").strip()
    found: list[dict[str, Any]] | None = None
    if query:
        found = [
            _row(d, await store.get_job(d.id), svc) for d in await store.search_deliveries(query)
        ]
    return render(
        "overview.html",
        status=422 if problem else 200,
        problems=[problem] if problem else [],
        activity=await _activity(app, window, now),
        title="overview",
        client=who,
        protected=svc.settings.protect_dashboard,
        flash=_flash(msg, id, request),
        figures=found_figures,
        channels=sorted(found_figures.by_channel),
        queue_depth=stats.queue_depth,
        oldest_due=_age(stats.oldest_due_age_s),
        held=held_rows,
        assumed=assumed_rows,
        assumed_more=assumed.next_cursor is not None,
        dead=dead_rows,
        q=query,
        found=found,
        back=_here(request),
        now=iso(now),
        now_s=now,
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
    d, job = record.delivery, record.job
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
                if r.delivery.status is not DeliveryStatus.IN_DOUBT
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
        flash=_flash(msg, id, request),
        sections=sections,
        limit=PAGE_ROWS,
        back=_here(request),
        now=iso(now),
        now_s=now,
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
        "flash": _flash(msg, id, request),
        "form": query.form,
        "statuses": [str(s) for s in DeliveryStatus],
        "doubts": [str(d) for d in Doubt],
        "back": _here(request),
        "now": iso(svc.kirim.clock.now()),
        "now_s": svc.kirim.clock.now(),
    }
    if query.errors:
        return render("browse.html", status=422, problems=query.errors, rows=None, **context)
    page = await svc.kirim.records(query.where, cursor=query.cursor, limit=query.limit)
    onward = page.next_cursor
    return render(
        "browse.html",
        problems=[],
        rows=[_row(r.delivery, r.job, svc) for r in page.records],
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
        edge = page.records[0].delivery.id
    else:  # past the end: everything before the cursor itself
        edge = query.cursor + (1 if where.oldest_first else -1)
    reverse = dataclasses.replace(where, oldest_first=not where.oldest_first)
    before = await app.records(reverse, cursor=min(max(edge, 0), MAX_ID), limit=query.limit)
    if not before.records:
        return None
    if before.next_cursor is None:  # the page before is the first
        return browse.link(query.form)
    farthest = before.records[-1].delivery.id
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
    d, job, attempts = record.delivery, record.job, record.attempts
    lines = events(record, now=svc.kirim.clock.now())
    return render(
        "notification.html",
        title=f"notification {d.id}",
        client=who,
        protected=svc.settings.protect_dashboard,
        flash=_flash(msg, str(d.id), request),
        now_s=svc.kirim.clock.now(),
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
    refusal = _may_write(request, svc, who)
    if refusal is not None:
        return refusal
    verb = VERBS[action]
    form = await _form(request, svc)
    back = _local(form.get("back"))
    try:
        await verb.run(svc.kirim, delivery_id)
        code = verb.done_code
    except NotFound:
        code = "missing"
    except ActionRefused:
        code = verb.refused_code
    except NotSettled:
        code = "not_settled"
    if code == verb.done_code:
        svc.log.info(f"dashboard_{code}", notification_id=delivery_id, client=who)
    back = _strip_flash(back)
    separator = "&" if "?" in back else "?"
    return RedirectResponse(f"{back}{separator}msg={code}&id={delivery_id}", status_code=303)


def _may_write(request: Request, svc: Service, who: str | None) -> Response | None:
    """The refusal of a form that may not act (posted from another site; a dashboard
    that may not write), or None."""
    if not _same_site(request):
        return render("forbidden.html", status=403, title="forbidden", client=who)
    if not writable(svc.settings):
        return _refused(
            "Retry and cancel need a token when the server listens beyond loopback: "
            "restart it with --protect-dashboard (or bind it to 127.0.0.1).",
            who,
        )
    return None


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


@router.post("/dashboard/notifications/{delivery_id}/{action}")
async def verb_action(request: Request, delivery_id: Id, action: str) -> Response:
    """One verb of ``kirim.http.verbs`` on one notification (its row's button)."""
    if action not in VERBS:
        return render("missing.html", status=404, title="not found", delivery_id=delivery_id)
    return await _act(request, delivery_id, action)


@router.get("/dashboard", include_in_schema=False)
@router.get("/dashboard/", include_in_schema=False)
async def dashboard_root() -> Response:
    """The dashboard's pages live under /dashboard/…; its overview is at /."""
    return RedirectResponse("/", status_code=303)


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
