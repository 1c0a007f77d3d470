"""Slack messages through ``chat.postMessage`` (a bot token), with kirim's key in the
message's metadata.

Library: httpx against the Web API (no extra). Not slack_sdk: its async client needs
aiohttp for the same two calls, and its retry handlers, once turned on, post again
out of kirim's sight.

Slack keeps no key: a resend is a second message, so the channel's in-doubt policy
applies. Every message carries ``metadata = {"event_type": "kirim_delivery",
"event_payload": {"key": <idempotency key>}}``, so ``lookup`` can find it: with a
fixed ``channel`` (every delivery of the kirim channel posts there, whatever its
recipient), ``lookup = true`` reads that channel's history of the last
``lookup_window`` seconds (``conversations.history`` with ``include_all_metadata``;
the token needs ``channels:history``, or ``groups:history`` for a private one) and
says whether a message with the key is in it. It answers "not found" only when it
read the whole window; a longer history than it reads leaves the question open.

Slack answers HTTP 200 with ``{"ok": false, "error": ...}``, or 429 with
``Retry-After``:

- ``ok``: ``Sent`` (``CHANNEL:ts``)
- 429 / ``ratelimited``: ``TransientFailure`` with ``Retry-After``
- ``request_timeout`` (the body did not arrive whole): ``TransientFailure``
- ``internal_error``, ``fatal_error``, ``service_unavailable``, HTTP 5xx:
  ``AmbiguousFailure``
- any other error (``channel_not_found``, ``not_in_channel``, ``is_archived``,
  ``invalid_auth``, ``token_revoked``, ``msg_too_long``, ``invalid_blocks``…):
  ``PermanentFailure``
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import httpx

from kirim.errors import AmbiguousFailure, NotSent, PermanentFailure, TransientFailure
from kirim.providers.base import Message, Sent
from kirim.providers.exchange import build, exchange, json_of, rate_limited, said, user_agent_header
from kirim.providers.shaping import slack_message

URL = "https://slack.com/api"
EVENT_TYPE = "kirim_delivery"
AMBIGUOUS = frozenset({"internal_error", "fatal_error", "service_unavailable"})
_ID = re.compile(r"[CGDUW][A-Z0-9]{6,20}|#[a-z0-9][a-z0-9._-]{0,79}")
#: pages of 200 messages a lookup reads at most
LOOKUP_PAGES = 5


def address_problem(address: str) -> str | None:
    """Why ``address`` is not a Slack channel or user id (``C0123ABCD``, ``#ops``)."""
    if not _ID.fullmatch(address):
        return "a Slack address is a channel or user id (C0123ABCD, U0123ABCD) or #name"
    return None


#: the keys of a ``[channels.NAME]`` table this provider takes besides the common ones
KEYS = frozenset({"token", "channel", "url", "lookup_window", "user_agent"})


def check_options(options: Mapping[str, Any]) -> str | None:
    """What is wrong with a slack channel's options, or None."""
    if options.get("lookup") and not options.get("channel"):
        return "lookup: the slack provider looks up only with a fixed channel"
    token = options.get("token")
    if not isinstance(token, str) or not token.startswith(("xoxb-", "xoxp-")):
        return "token is required for a slack channel: a bot (xoxb-) or user (xoxp-) token"
    channel = options.get("channel")
    if channel is not None and (not isinstance(channel, str) or address_problem(channel)):
        return "channel must be a Slack channel id (C0123ABCD) or #name"
    return None


def from_table(options: Mapping[str, Any]) -> SlackProvider:
    """The provider of a checked ``[channels.NAME]`` table."""
    return SlackProvider(
        token=options["token"],
        channel=options.get("channel"),
        url=options.get("url", URL),
        timeout=float(options.get("timeout", 10)),
        user_agent=options.get("user_agent"),
        lookup_window=float(options.get("lookup_window", 86400)),
    )


class SlackProvider:
    """Post each delivery to its Slack id (the recipient), or to ``channel``."""

    idempotent = False  # Slack has no idempotency key: the in-doubt policy applies

    def __init__(
        self,
        *,
        token: str,
        channel: str | None = None,
        url: str = URL,
        timeout: float = 10.0,
        lookup_window: float = 86400.0,
        user_agent: str | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.channel = channel
        #: a fixed channel takes no recipient address; else each recipient's Slack id
        self.address_kind = None if channel else "slack"
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.lookup_window = lookup_window
        self._client = client or httpx.AsyncClient(
            timeout=timeout,
            headers={**user_agent_header(user_agent), "Authorization": f"Bearer {token}"},
        )

    def __repr__(self) -> str:  # never the token
        return f"SlackProvider(url={self.url!r}, channel={self.channel!r})"

    async def send(self, message: Message) -> Sent:
        where = self.channel or message.recipient
        if (problem := address_problem(where)) is not None:
            raise NotSent(f"not sent: slack: {problem}")

        def made() -> dict[str, Any]:
            body = {
                "channel": where,
                **slack_message(message.payload),
                "metadata": {
                    "event_type": EVENT_TYPE,
                    "event_payload": {"key": message.idempotency_key},
                },
            }
            return {"json": body}

        request = build(
            self._client, "POST", f"{self.url}/chat.postMessage", service="slack", make=made
        )
        response = await exchange(self._client, request, service="slack")
        data = self._checked(response)
        return Sent(provider_message_id=f"{data.get('channel') or where}:{data.get('ts')}")

    def _checked(self, response: httpx.Response) -> dict[str, Any]:
        """The answer's body when ``ok``; the failure of its error otherwise."""
        text = f"slack: {said(response)}"
        if response.status_code == 429:
            raise rate_limited(response, text)
        if response.status_code >= 500:
            raise AmbiguousFailure(text, status_code=response.status_code)
        data = json_of(response)
        if not isinstance(data, dict):
            raise AmbiguousFailure(text, status_code=response.status_code)
        if data.get("ok") is True:
            return data
        error = str(data.get("error") or "")
        text = f"slack: {error or 'error'}: {said(response)}"
        if error in ("ratelimited", "rate_limited"):
            raise rate_limited(response, text)
        if error == "request_timeout":
            raise TransientFailure(text, status_code=response.status_code)
        if error in AMBIGUOUS:
            raise AmbiguousFailure(text, status_code=response.status_code)
        raise PermanentFailure(text, status_code=response.status_code)

    async def lookup(self, idempotency_key: str) -> Sent | None:
        """The message with ``idempotency_key`` in ``channel``'s recent history, None
        when the whole ``lookup_window`` was read without it; anything else raises."""
        if self.channel is None:
            raise RuntimeError("a slack lookup needs the channel option")
        params: dict[str, Any] = {
            "channel": self.channel,
            "oldest": f"{time.time() - self.lookup_window:.6f}",
            "include_all_metadata": "true",
            "limit": 200,
        }
        for _ in range(LOOKUP_PAGES):
            try:
                response = await self._client.get(
                    f"{self.url}/conversations.history", params=params
                )
            except httpx.HTTPError as exc:
                raise AmbiguousFailure(f"slack lookup: no answer: {type(exc).__name__}") from exc
            try:
                data = self._checked(response)
            except Exception as exc:
                raise AmbiguousFailure(f"slack lookup: {exc}") from exc
            for item in data.get("messages") or []:
                meta = item.get("metadata") if isinstance(item, dict) else None
                payload = meta.get("event_payload") if isinstance(meta, dict) else None
                if (
                    isinstance(meta, dict)
                    and meta.get("event_type") == EVENT_TYPE
                    and isinstance(payload, dict)
                    and payload.get("key") == idempotency_key
                ):
                    return Sent(provider_message_id=f"{self.channel}:{item.get('ts')}")
            cursor = (data.get("response_metadata") or {}).get("next_cursor")
            if not data.get("has_more") or not cursor:
                return None
            params["cursor"] = cursor
        raise AmbiguousFailure(f"slack lookup: more than {LOOKUP_PAGES * 200} messages to read")

    async def aclose(self) -> None:
        await self._client.aclose()
