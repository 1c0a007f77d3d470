"""SMS through Twilio's Messages API (REST, form-encoded, HTTP basic auth).

Library: httpx against the REST API (no extra). Not the twilio package: its async
client runs on aiohttp-retry, which sends a request again by itself, and Twilio's
create takes no idempotency key, so a resend it makes is a second SMS.

Twilio keeps no key: a resend after a lost answer is a second SMS. So the provider
is not idempotent and the channel's in-doubt policy applies (``assume_sent`` by
default: at most once). ``status_callback`` is passed to Twilio as given (Twilio then
posts each message's fate, form-encoded and signed with ``X-Twilio-Signature``, to
that URL); kirim's own callback endpoint takes its JSON format, so a bridge that
turns Twilio's report into it (the message SID kirim recorded, ``delivered`` or
``failed``) is the operator's for now.

Twilio's answers (``{"code": 21211, "message": …, "status": 400}``):

- 201: ``Sent`` (the message ``sid``)
- 429 (20429): ``TransientFailure`` with ``Retry-After``
- 5xx: ``AmbiguousFailure``
- 400 (21211 invalid ``To``, 21408 region not enabled, 21610 the recipient replied
  STOP, 21614 not a mobile number…), 401 (20003), 404, any other 4xx:
  ``PermanentFailure``
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import httpx

from kirim.errors import AmbiguousFailure, NotSent, PermanentFailure
from kirim.providers.base import Message, Sent
from kirim.providers.exchange import build, exchange, json_of, rate_limited, said, user_agent_header
from kirim.providers.shaping import sms_body

URL = "https://api.twilio.com"
E164 = re.compile(r"\+[1-9][0-9]{1,14}")
#: the longest body Twilio takes (1600 characters: 10 segments of 160)
MAX_BODY = 1600


def address_problem(address: str) -> str | None:
    """Why ``address`` is not an E.164 phone number, or None."""
    if not E164.fullmatch(address):
        return "a phone number is E.164: + and 2 to 15 digits, such as +6281234567890"
    return None


#: the keys of a ``[channels.NAME]`` table this provider takes besides the common ones
KEYS = frozenset(
    {"account_sid", "auth_token", "from", "messaging_service_sid", "status_callback", "url"}
    | {"user_agent"}
)


def check_options(options: Mapping[str, Any]) -> str | None:
    """What is wrong with a twilio channel's options, or None."""
    if options.get("lookup"):
        return "lookup: the twilio provider has no lookup"
    for name in ("account_sid", "auth_token"):
        if not isinstance(options.get(name), str) or not options[name]:
            return f"{name} is required for a twilio channel"
    sender, service = options.get("from"), options.get("messaging_service_sid")
    if (sender is None) == (service is None):
        return "give from (an E.164 number) or messaging_service_sid, one of them"
    if sender is not None and (not isinstance(sender, str) or address_problem(sender)):
        return "from must be an E.164 phone number, such as +15005550006"
    return None


def from_table(options: Mapping[str, Any]) -> TwilioProvider:
    """The provider of a checked ``[channels.NAME]`` table."""
    return TwilioProvider(
        account_sid=options["account_sid"],
        auth_token=options["auth_token"],
        from_number=options.get("from"),
        messaging_service_sid=options.get("messaging_service_sid"),
        status_callback=options.get("status_callback"),
        url=options.get("url", URL),
        timeout=float(options.get("timeout", 10)),
        user_agent=options.get("user_agent"),
    )


class TwilioProvider:
    """Send each delivery as an SMS to its phone number (the delivery's recipient)."""

    idempotent = False  # Twilio has no idempotency key: the in-doubt policy applies
    address_kind = "phone"

    def __init__(
        self,
        *,
        account_sid: str,
        auth_token: str,
        from_number: str | None = None,
        messaging_service_sid: str | None = None,
        status_callback: str | None = None,
        url: str = URL,
        timeout: float = 10.0,
        user_agent: str | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.account_sid = account_sid
        self.from_number = from_number
        self.messaging_service_sid = messaging_service_sid
        self.status_callback = status_callback
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._client = client or httpx.AsyncClient(
            headers=user_agent_header(user_agent),
            timeout=timeout,
            auth=httpx.BasicAuth(account_sid, auth_token),
        )

    def __repr__(self) -> str:  # never the auth token
        return f"TwilioProvider(url={self.url!r}, account_sid={self.account_sid!r})"

    def form(self, message: Message) -> dict[str, str]:
        """The Messages API's form fields for one delivery."""
        text = sms_body(message.payload)
        if len(text) > MAX_BODY:
            raise ValueError(f"the SMS is {len(text)} characters, over Twilio's {MAX_BODY}")
        form = {"To": message.recipient, "Body": text}
        if self.messaging_service_sid is not None:
            form["MessagingServiceSid"] = self.messaging_service_sid
        else:
            form["From"] = str(self.from_number)
        if self.status_callback is not None:
            form["StatusCallback"] = self.status_callback
        return form

    async def send(self, message: Message) -> Sent:
        if (problem := address_problem(message.recipient)) is not None:
            raise NotSent(f"not sent: twilio: {problem}")
        url = f"{self.url}/2010-04-01/Accounts/{self.account_sid}/Messages.json"
        request = build(
            self._client, "POST", url, service="twilio", make=lambda: {"data": self.form(message)}
        )
        response = await exchange(self._client, request, service="twilio")
        code = response.status_code
        data = json_of(response)
        if code in (200, 201):
            sid = data.get("sid") if isinstance(data, dict) else None
            return Sent(provider_message_id=None if sid is None else str(sid))
        code_of = data.get("code") if isinstance(data, dict) else None
        text = f"twilio: {code_of or 'error'}: {said(response)}"
        if code == 429:
            raise rate_limited(response, text)
        if code >= 500:
            raise AmbiguousFailure(text, status_code=code)
        raise PermanentFailure(text, status_code=code)

    async def aclose(self) -> None:
        await self._client.aclose()
