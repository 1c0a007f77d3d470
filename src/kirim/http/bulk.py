"""The dashboard's bulk actions: a verb of ``kirim.http.verbs`` on the rows ticked in a
table, asked first.

``POST /dashboard/bulk`` with ``action`` and the ``id`` of each ticked row answers a
confirmation page: every notification with what the verb does to it, and how many
of them may arrive twice (a retry where an earlier request may have reached a
provider that honours no key). The same form with ``confirm=1`` runs the verb on
each, one at a time, as its row's button would, and redirects back with the counts
(done, refused, not settled yet, not found). No JavaScript: the confirmation is a
page of its own. The guards are the row buttons': same site, and a dashboard that
may write.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from kirim.errors import ActionRefused, NotFound, NotSettled
from kirim.http.bodies import read_body
from kirim.http.dashboard import (
    PAGE_ROWS,
    _client,
    _local,
    _may_write,
    _row,
    _strip_flash,
    render,
)
from kirim.http.service import Service, service
from kirim.http.verbs import VERBS, Verb
from kirim.validation import as_id

router = APIRouter(include_in_schema=False)


async def _fields(request: Request, svc: Service) -> dict[str, list[str]]:
    raw = await read_body(request, svc.max_body_bytes)
    try:
        return parse_qs(raw.decode("utf-8"), max_num_fields=PAGE_ROWS + 10)
    except (UnicodeDecodeError, ValueError):
        return {}


def _ids(values: list[str]) -> list[int] | None:
    """The ticked ids, each once, in order; None for one that is no id."""
    out: list[int] = []
    for value in values:
        number = as_id(value.strip())
        if number is None:
            return None
        if number not in out:
            out.append(number)
    return out


@router.post("/dashboard/bulk")
async def bulk(request: Request) -> Response:
    svc = service(request)
    who = await _client(request, svc)
    if isinstance(who, Response):
        return who
    refusal = _may_write(request, svc, who)
    if refusal is not None:
        return refusal
    fields = await _fields(request, svc)
    back = _strip_flash(_local(fields.get("back", ["/"])[-1]))
    verb = VERBS.get(fields.get("action", [""])[-1])
    ids = _ids(fields.get("id", []))
    if verb is None or ids is None or len(ids) > PAGE_ROWS:
        known = ", ".join(VERBS)
        problem = f"a bulk action is one of {known}, on at most {PAGE_ROWS} notification ids"
        return render("forbidden.html", status=422, title="bad request", client=who, reason=problem)
    if not ids:
        return _back(back, {"msg": "nothing_selected"})
    if fields.get("confirm", [""])[-1] == "1":
        counts = await _run(verb, ids, svc, who)
        return _back(back, {"msg": "bulk", "verb": verb.name, **counts})
    return await _ask(request, svc, who, verb, ids, back)


async def _ask(
    request: Request, svc: Service, who: str | None, verb: Verb, ids: list[int], back: str
) -> Response:
    """The confirmation page: each notification with what ``verb`` does to it."""
    app = svc.kirim
    rows: list[dict[str, Any]] = []
    missing: list[int] = []
    for delivery_id in ids:
        record = await app.get(delivery_id, by="id")
        if record is None:
            missing.append(delivery_id)
            continue
        d, job = record.delivery, record.job
        row = _row(d, job, svc)
        rows.append(
            {
                **row,
                "offered": verb in row["verbs"],
                "effect": verb.effect(app, record, app.clock.now()),
            }
        )
    twice = sum(1 for r in rows if r["offered"] and r["effect"].twice)
    return render(
        "bulk.html",
        title=f"{verb.name} {len(rows)}",
        client=who,
        protected=svc.settings.protect_dashboard,
        verb=verb,
        rows=rows,
        missing=missing,
        twice=twice,
        back=back,
        problems=[],
        now_s=app.clock.now(),
    )


async def _run(verb: Verb, ids: list[int], svc: Service, who: str | None) -> dict[str, str]:
    """Run ``verb`` on each id, as its row's button would; the counts of each outcome."""
    counts = {"done": 0, "refused": 0, "not_settled": 0, "missing": 0}
    done: list[int] = []
    for delivery_id in ids:
        try:
            await verb.run(svc.kirim, delivery_id)
        except NotFound:
            counts["missing"] += 1
        except ActionRefused:
            counts["refused"] += 1
        except NotSettled:
            counts["not_settled"] += 1
        else:
            counts["done"] += 1
            done.append(delivery_id)
    svc.log.info(
        "dashboard_bulk", action=verb.name, notification_ids=",".join(map(str, done)), client=who
    )
    return {k: str(v) for k, v in counts.items()}


def _back(path: str, query: dict[str, str]) -> RedirectResponse:
    separator = "&" if "?" in path else "?"
    return RedirectResponse(f"{path}{separator}{urlencode(query)}", status_code=303)
