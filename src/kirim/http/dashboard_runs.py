"""The dashboard's page of one workflow run: its steps on one timeline
(``kirim.runs.run_json``, the same object ``kirim run show --json`` prints), each
send linked to its notification's page."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse, Response

from kirim.http.dashboard import _client, render
from kirim.http.service import service
from kirim.runs import run_json
from kirim.validation import MAX_ID

router = APIRouter(include_in_schema=False)


@router.get("/dashboard/runs/{run_id}", response_class=HTMLResponse)
async def run_page(request: Request, run_id: Annotated[int, Path(ge=1, le=MAX_ID)]) -> Response:
    svc = service(request)
    who = await _client(request, svc)
    if isinstance(who, Response):
        return who
    found = await svc.kirim.get_run(run_id)
    if found is None:
        return render("run_missing.html", status=404, title="not found", run_id=run_id, client=who)
    return render("run.html", title=f"run {run_id}", client=who, run=run_json(found))
