"""The dashboard's topics (``kirim.topics``): ``/dashboard/topics`` counts the topics,
their live subscriptions and the topic events pending fan-out, expanding and done (the
figures of ``kirim status``), lists the topics with their subscriber counts and the
latest topic events with how far each fan-out got; ``/dashboard/topics/{topic}`` is one
topic with its latest fan-outs. Every name is the user's text: the templates escape it
(autoescape, and ``kirim.text.visible`` for control characters)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse, Response

from kirim.http.dashboard import _client, render
from kirim.http.service import service
from kirim.topics import TopicEvent, check_topic, progress
from kirim.validation import BadValue

router = APIRouter(include_in_schema=False)

#: how many topics and latest topic events the topics page lists
TOPICS = 100
LATEST = 20
#: how many of a topic's latest fan-outs its page lists
RECENT = 50


def topic_href(topic: str) -> str:
    """The dashboard page of a topic (every character of its name quoted)."""
    return "/dashboard/topics/" + quote(topic, safe="")


def _event_row(event: TopicEvent) -> dict[str, object]:
    """A topic event as a row of the pages: its JSON, its progress and its topic's link."""
    return {**event.to_json(), "progress": progress(event), "href": topic_href(event.topic)}


@router.get("/dashboard/topics", response_class=HTMLResponse)
async def topics_page(request: Request) -> Response:
    svc = service(request)
    who = await _client(request, svc)
    if isinstance(who, Response):
        return who
    kirim = svc.kirim
    counts = await kirim.topic_counts()
    topics = await kirim.list_topics(limit=TOPICS)
    latest = await kirim.latest_topic_events(limit=LATEST)
    return render(
        "topics.html",
        title="topics",
        client=who,
        counts=counts,
        topics=[{**t.to_json(), "href": topic_href(t.topic)} for t in topics],
        more=len(topics) == TOPICS,
        events=[_event_row(e) for e in latest],
    )


@router.get("/dashboard/topics/{topic:path}", response_class=HTMLResponse)
async def topic_page(request: Request, topic: Annotated[str, Path()]) -> Response:
    svc = service(request)
    who = await _client(request, svc)
    if isinstance(who, Response):
        return who
    try:
        name = check_topic(topic)
    except BadValue:
        name = None
    info = None if name is None else await svc.kirim.topic_info(name, recent=RECENT)
    if info is None:
        return render("topic_missing.html", status=404, title="not found", topic=topic, client=who)
    return render(
        "topic.html",
        title=f"topic {info.topic}",
        client=who,
        topic=info.to_json(),
        events=[_event_row(e) for e in info.recent],
    )
