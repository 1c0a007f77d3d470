"""A loopback Twilio Messages API.

``POST /2010-04-01/Accounts/{sid}/Messages.json`` (form-encoded, HTTP basic auth with
the account SID and auth token) answers as Twilio documents: 201 with the message
resource (``sid`` ``SM…``, ``status`` ``queued``), or an error body ``{"code",
"message", "more_info", "status"}``: 401 ``20003`` (authentication), 400 ``21211``
(an invalid ``To``), ``21602`` (no ``Body``), ``21610`` (a number in ``dead``: the
recipient replied STOP), 429 ``20429`` (with ``Retry-After``), 500 ``20500``. Each
accepted message reaches the phone: an SMS has no collapse, so a resend is a second
one (``duplicated()``).

``with TwilioFake() as twilio:`` — ``twilio.url``, ``twilio.account_sid``,
``twilio.auth_token``, ``twilio.sender``.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any
from urllib.parse import parse_qs

from kirim.devtools.services.base import Answer, HttpFake
from kirim.providers.twilio import address_problem


def twilio_error(
    status: int, code: int, message: str, headers: dict[str, str] | None = None
) -> Answer:
    return Answer(
        status,
        {
            "code": code,
            "message": message,
            "more_info": f"https://www.twilio.com/docs/errors/{code}",
            "status": status,
        },
        headers or {},
    )


class TwilioFake(HttpFake):
    """Twilio on 127.0.0.1 (see the module's text)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.account_sid = "AC" + secrets.token_hex(16)
        self.auth_token = secrets.token_hex(16)
        self.sender = "+15005550006"
        self.messages: list[dict[str, str]] = []

    @property
    def url(self) -> str:
        return self.base_url

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
        if method != "POST" or path != f"/2010-04-01/Accounts/{self.account_sid}/Messages.json":
            return twilio_error(404, 20404, "The requested resource was not found")
        expected = base64.b64encode(f"{self.account_sid}:{self.auth_token}".encode()).decode()
        if headers.get("authorization") != f"Basic {expected}":
            self.refuse("20003")
            return twilio_error(401, 20003, "Authenticate")
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        to = form.get("To", "")
        if address_problem(to) is not None:
            self.refuse("21211")
            return twilio_error(400, 21211, f"The 'To' number {to} is not a valid phone number.")
        if not form.get("Body"):
            self.refuse("21602")
            return twilio_error(400, 21602, "Message body is required.")
        if to in self.dead:
            self.refuse("21610")
            return twilio_error(400, 21610, "Attempt to send to unsubscribed recipient")

        def act() -> Answer:
            self.show(to, {"body": form["Body"]}, None)
            with self._lock:
                self.messages.append(form)
                sid = f"SM{len(self.messages):032x}"
            return Answer(
                201,
                {
                    "sid": sid,
                    "status": "queued",
                    "to": to,
                    "from": form.get("From"),
                    "body": form["Body"],
                },
            )

        return self.deliver(act)

    def unavailable(self) -> Answer:
        return twilio_error(500, 20500, "An internal server error has occurred")

    def limited(self) -> Answer:
        return twilio_error(429, 20429, "Too Many Requests", {"Retry-After": "1"})
