"""A loopback Slack Web API: ``chat.postMessage`` and ``conversations.history``.

A bot token (``Authorization: Bearer xoxb-…``) is required (else ``{"ok": false,
"error": "invalid_auth"}``). ``chat.postMessage`` answers ``{"ok": true, "channel",
"ts", "message"}``, or ``channel_not_found`` (an id it does not know), ``no_text``,
``is_archived`` (a channel in ``dead``), HTTP 429 with ``Retry-After``
(``ratelimited``), ``internal_error``. Messages keep their ``metadata``, and
``conversations.history`` (``include_all_metadata``, paged by ``cursor``) returns
them, newest first, so a lookup can find a key.

``with SlackFake() as slack:`` — ``slack.url``, ``slack.token``, ``slack.channels``.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kirim.devtools.services.base import Answer, HttpFake


class SlackFake(HttpFake):
    """Slack on 127.0.0.1 (see the module's text)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.token = "xoxb-" + secrets.token_hex(12)
        self.channels = {"C0KIRIM01", "C0KIRIM02", "U0KIRIM01"}
        self.history: dict[str, list[dict[str, Any]]] = {}

    @property
    def url(self) -> str:
        return f"{self.base_url}/api"

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
        if headers.get("authorization") != f"Bearer {self.token}":
            self.refuse("invalid_auth")
            return Answer(200, {"ok": False, "error": "invalid_auth"})
        if method == "POST" and path == "/api/chat.postMessage":
            return self._post(body)
        if method == "GET" and urlsplit(path).path == "/api/conversations.history":
            return self._history({k: v[0] for k, v in parse_qs(urlsplit(path).query).items()})
        return Answer(404, {"ok": False, "error": "unknown_method"})

    def _post(self, body: bytes) -> Any:
        try:
            data = json.loads(body)
        except ValueError:
            return Answer(200, {"ok": False, "error": "invalid_json"})
        channel = data.get("channel")
        if channel not in self.channels:
            self.refuse("channel_not_found")
            return Answer(200, {"ok": False, "error": "channel_not_found"})
        if channel in self.dead:
            self.refuse("is_archived")
            return Answer(200, {"ok": False, "error": "is_archived"})
        if not data.get("text") and not data.get("blocks"):
            self.refuse("no_text")
            return Answer(200, {"ok": False, "error": "no_text"})

        def act() -> Answer:
            self.show(channel, {"body": data.get("text", "")}, None)
            with self._lock:
                ts = f"{time.time():.6f}"
                item = {
                    "type": "message",
                    "ts": ts,
                    "text": data.get("text", ""),
                    "blocks": data.get("blocks"),
                    "metadata": data.get("metadata"),
                }
                self.history.setdefault(channel, []).insert(0, item)
            return Answer(200, {"ok": True, "channel": channel, "ts": ts, "message": item})

        return self.deliver(act)

    def _history(self, query: dict[str, str]) -> Answer:
        channel = query.get("channel", "")
        if channel not in self.channels:
            return Answer(200, {"ok": False, "error": "channel_not_found"})
        limit = min(int(query.get("limit", "100")), 200)
        start = int(query.get("cursor") or 0)
        oldest = float(query.get("oldest") or 0)
        items = [m for m in self.history.get(channel, []) if float(m["ts"]) > oldest]
        page = items[start : start + limit]
        if query.get("include_all_metadata") != "true":
            page = [{k: v for k, v in m.items() if k != "metadata"} for m in page]
        more = start + limit < len(items)
        with self._lock:
            self.lookups["history"] += 1
        return Answer(
            200,
            {
                "ok": True,
                "messages": page,
                "has_more": more,
                "response_metadata": {"next_cursor": str(start + limit) if more else ""},
            },
        )

    def unavailable(self) -> Answer:
        return Answer(200, {"ok": False, "error": "internal_error"})

    def limited(self) -> Answer:
        return Answer(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "1"})
