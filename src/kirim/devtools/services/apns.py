"""A loopback APNs: HTTP/2 over TLS (a self-signed certificate made at start), that
checks the provider token and honours ``apns-collapse-id``.

It answers as Apple documents (``{"reason": ...}``): 403 ``MissingProviderToken``,
``InvalidProviderToken`` (a signature that does not verify with the team's key, a
wrong ``kid`` or ``iss``), ``ExpiredProviderToken`` (``iat`` over an hour old); 400
``BadDeviceToken``, ``BadTopic``, ``BadCollapseId``, ``BadMessageId``,
``PayloadEmpty``; 413 ``PayloadTooLarge``; 410 ``Unregistered`` (with ``timestamp``)
for a token in ``dead``; 429 ``TooManyRequests``; 503 ``ServiceUnavailable``. A
delivered notification is shown on the device (``show``), a resend with the collapse
id of a shown one replacing it. A lost answer is a reset stream (RST_STREAM) after
delivery.

``with ApnsFake(folder) as apns:`` — ``apns.url``, ``apns.ca_file``, and the signing
key a channel uses: ``apns.private_key`` (PEM), ``apns.team_id``, ``apns.key_id``,
``apns.topic``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import ssl
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import ConnectionTerminated, DataReceived, RequestReceived, StreamEnded, StreamReset
from h2.exceptions import ProtocolError

from kirim.devtools.services.base import Answer, ServiceFake, worker_of
from kirim.providers.apns import MAX_PAYLOAD, address_problem


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, valid for a day, and its key, in
    ``folder``: (certificate, key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kirim loopback APNs")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "apns-cert.pem", folder / "apns-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def signing_key() -> tuple[str, ec.EllipticCurvePublicKey]:
    """A provider token signing key as Apple issues one (a P-256 .p8): (PEM, public)."""
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return pem, key.public_key()


class ApnsFake(ServiceFake):
    """APNs on 127.0.0.1 (see the module's text)."""

    def __init__(
        self,
        folder: Path,
        *,
        team_id: str = "TEAM123456",
        key_id: str = "KEY1234567",
        topic: str = "com.example.kirim",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.team_id, self.key_id, self.topic = team_id, key_id, topic
        self.private_key, self._public = signing_key()
        self.ca_file, self._key_file = self_signed(folder)
        self.tokens_seen: list[str] = []  # every provider token a request carried
        self.apns_ids: list[str] = []  # the apns-id of every delivered request
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="apns-fake")
        self.connections: set[asyncio.Transport] = set()

    @property
    def url(self) -> str:
        assert self._server is not None, "use it in a with block"
        return f"https://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def __enter__(self) -> ApnsFake:
        self._thread.start()
        if not self._ready.wait(10) or self._server is None:
            raise RuntimeError("the APNs fake did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.ca_file, self._key_file)
        context.set_alpn_protocols(["h2"])
        try:
            self._server = loop.run_until_complete(
                loop.create_server(lambda: _H2(self), "127.0.0.1", 0, ssl=context, backlog=512)
            )
        finally:
            self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            for transport in list(self.connections):  # every client's, on every Python
                transport.abort()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()

    # -- what APNs checks ----------------------------------------------------------------

    def _authorized(self, header: str | None) -> str | None:
        """The reason a provider token is refused, or None."""
        if not header or not header.lower().startswith("bearer "):
            return "MissingProviderToken"
        token = header.split(" ", 1)[1]
        self.tokens_seen.append(token)
        try:
            head = jwt.get_unverified_header(token)
            claims = jwt.decode(token, self._public, algorithms=["ES256"])
        except jwt.PyJWTError:
            return "InvalidProviderToken"
        if head.get("kid") != self.key_id or claims.get("iss") != self.team_id:
            return "InvalidProviderToken"
        if not isinstance(claims.get("iat"), int) or time.time() - claims["iat"] > 3600:
            return "ExpiredProviderToken"
        return None

    def answer(self, headers: dict[str, str], body: bytes) -> tuple[Answer, str, float]:
        """The answer to one request, its fate ("ok", "lost", "hang") and the seconds
        before it is given."""
        path = headers.get(":path", "")
        apns_id = headers.get("apns-id") or str(uuid.uuid4())
        echo = {"apns-id": apns_id}

        def no(status: int, reason: str, **more: Any) -> tuple[Answer, str, float]:
            self.refuse(reason)
            return Answer(status, {"reason": reason, **more}, echo), "ok", 0.0

        if headers.get(":method") != "POST" or not path.startswith("/3/device/"):
            return no(404, "BadPath")
        if (reason := self._authorized(headers.get("authorization"))) is not None:
            return no(403, reason)
        token = path.removeprefix("/3/device/")
        if address_problem(token) is not None:
            return no(400, "BadDeviceToken")
        if headers.get("apns-topic") != self.topic:
            return no(400, "BadTopic" if headers.get("apns-topic") else "MissingTopic")
        collapse = headers.get("apns-collapse-id")
        if collapse is not None and len(collapse.encode()) > 64:
            return no(400, "BadCollapseId")
        try:
            uuid.UUID(apns_id)
        except ValueError:
            return no(400, "BadMessageId")
        if len(body) > MAX_PAYLOAD:
            return no(413, "PayloadTooLarge")
        try:
            payload = json.loads(body)
        except ValueError:
            return no(400, "PayloadEmpty")
        if not isinstance(payload, dict) or not isinstance(payload.get("aps"), dict):
            return no(400, "PayloadEmpty")
        if token in self.dead:
            return no(410, "Unregistered", timestamp=int(time.time() * 1000))
        fate, delay = self.draw()
        if fate == "error":
            return Answer(503, {"reason": "ServiceUnavailable"}, echo), "ok", 0.0
        if fate == "limited":
            return Answer(429, {"reason": "TooManyRequests"}, echo), "ok", 0.0
        alert = payload["aps"].get("alert")
        shown = alert if isinstance(alert, dict) else {"body": alert}
        self.show(token, dict(shown), collapse)
        with self._lock:
            self.apns_ids.append(apns_id)
        return Answer(200, None, echo), fate, delay


class _H2(asyncio.Protocol):
    """One client connection: HTTP/2 frames in, the fake's answers out."""

    def __init__(self, fake: ApnsFake) -> None:
        self.fake = fake
        self.conn = H2Connection(config=H2Configuration(client_side=False, header_encoding="utf-8"))
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, tuple[dict[str, str], bytearray]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.fake.connections.add(transport)
        self.conn.initiate_connection()
        transport.write(self.conn.data_to_send())

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.fake.connections.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except ProtocolError:
            self._flush()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            if isinstance(event, RequestReceived):
                self.streams[event.stream_id] = (dict(event.headers), bytearray())  # type: ignore[arg-type]
            elif isinstance(event, DataReceived):
                self.streams[event.stream_id][1].extend(event.data)
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, StreamEnded):
                headers, body = self.streams.pop(event.stream_id)
                asyncio.get_running_loop().create_task(
                    self._respond(event.stream_id, headers, bytes(body))
                )
            elif isinstance(event, StreamReset):
                self.streams.pop(event.stream_id, None)
            elif isinstance(event, ConnectionTerminated) and self.transport is not None:
                self.transport.close()
        self._flush()

    async def _respond(self, stream_id: int, headers: dict[str, str], body: bytes) -> None:
        fake = self.fake
        with fake.in_flight(worker_of(headers.get("user-agent"))):
            answer, fate, delay = fake.answer(headers, body)
            if delay:
                await asyncio.sleep(delay)
        with contextlib.suppress(ProtocolError, KeyError):
            if fate == "lost":
                self.conn.reset_stream(stream_id)
            else:
                data = answer.content()
                out = [(":status", str(answer.status)), *answer.headers.items()]
                if data:
                    out += [
                        ("content-type", "application/json"),
                        ("content-length", str(len(data))),
                    ]
                self.conn.send_headers(stream_id, out, end_stream=not data)
                if data:
                    self.conn.send_data(stream_id, data, end_stream=True)
        self._flush()

    def _flush(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.conn.data_to_send())
