"""Every limit on the text kirim keeps, in bytes of UTF-8, defined once.

The API's models (``kirim.http.models``), the CLI, ``notify()`` and
``notify_event()`` (``kirim.validation``, ``kirim.notify.fanout``), the provider seam
(``kirim.text.stored_text``) and the store's intake all read these, so a value is
refused (422 from the API, naming the field) or cut at the same byte on SQLite and
on PostgreSQL. Characters are not the measure: 1,024 CJK characters are 3,072 bytes.

Why these numbers: PostgreSQL's B-tree holds an index entry of at most
``BTREE_ENTRY`` bytes (a third of an 8 kB page; the rest is refused with SQLSTATE
54000 whatever the column's type), and SQLite has no such limit. Each limit below
names the indexes its text sits in; ``INDEXES`` adds up what one entry of each index
can hold at worst, and a test checks that every sum fits, with room for the entry's
own headers.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the largest entry a PostgreSQL B-tree index (version 4, 8 kB pages) holds
BTREE_ENTRY = 2704
#: what an entry's headers, alignment and fixed-size columns may take besides its text
ENTRY_OVERHEAD = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Limit:
    """At most ``bytes`` bytes of UTF-8 for ``what``."""

    what: str
    bytes: int

    def problem(self, value: str) -> str | None:
        """Why ``value`` is over this limit (the rest of the sentence after its name),
        or None. ``value`` must encode (``kirim.validation.text_problem`` says first)."""
        size = utf8_size(value)
        if size <= self.bytes:
            return None
        if value.isascii():  # a character a byte: said as people count
            return f"must be at most {self.bytes} characters, not {size}"
        return f"must be at most {self.bytes} bytes of UTF-8, not {size}"


def utf8_size(value: str) -> int:
    """The bytes of ``value`` in UTF-8 (a lone surrogate counted as the 3 it would take)."""
    if value.isascii():
        return len(value)
    return len(value.encode("utf-8", "surrogatepass"))


def cut(value: str, limit: int, mark: str = "…") -> str:
    """``value`` if it fits ``limit`` bytes, else its longest head that fits with
    ``mark`` after it, cut between two characters (never inside one)."""
    if utf8_size(value) <= limit:
        return value
    room = limit - utf8_size(mark)
    head = value.encode("utf-8", "surrogatepass")[: max(room, 0)]
    return head.decode("utf-8", "ignore") + mark


# -- the limits ------------------------------------------------------------------------

#: an explicit idempotency key (printable ASCII: a byte a character)
KEY = Limit(what="an idempotency key", bytes=255)
#: the business event's id
EVENT_ID = Limit(what="an event id", bytes=1024)
#: a recipient's address (no index holds it; the same bound at every door)
RECIPIENT = Limit(what="a recipient", bytes=1024)
#: the id of a recipient whose preferences rule it (a primary key and a URL segment)
RECIPIENT_ID = Limit(what="a recipient id", bytes=255)
#: a channel's name, and one the API is asked about
CHANNEL = Limit(what="a channel name", bytes=200)
#: a notification type's name (``kirim.notify.types.NAME``: ASCII)
TYPE = Limit(what="a notification type's name", bytes=64)
#: a preference's ``type:channel`` pattern (kept in the preferences' document)
PATTERN = Limit(what="a preference's TYPE:CHANNEL", bytes=TYPE.bytes + 1 + CHANNEL.bytes)
#: the value of the data field a digest or a throttle groups by
GROUP = Limit(what="a digest's or throttle's grouping value", bytes=255)
#: a digest stream or a throttle scope, made of the type, recipient id, channel and
#: grouping value (``kirim.notify.fanout``; ``%``, ``:`` and ``|`` escaped take 3)
STREAM = Limit(what="a digest stream or throttle scope", bytes=1536)
#: a provider's message id: kept cut (``kirim.text.stored_text``), asked about whole
MESSAGE_ID = Limit(what="a provider message id", bytes=1000)
#: a provider's or an error's words kept in a ledger column (cut, never refused)
PROVIDER_TEXT = Limit(what="a provider's or an error's text", bytes=1000)
#: a delivery callback's reason
REASON = Limit(what="a callback's reason", bytes=1024)
#: a topic's name (``kirim.topics``)
TOPIC = Limit(what="a topic", bytes=255)
#: the key of one HTTP request of an event without ``Idempotency-Key``:
#: ``event\x1f{type}\x1f{event_id}`` (``kirim.http.events.request_key``)
EVENT_REQUEST_KEY = 6 + TYPE.bytes + 1 + EVENT_ID.bytes

#: PostgreSQL index -> the most text bytes one of its entries holds (their sum)
INDEXES: dict[str, int] = {
    "kirim_deliveries_key": max(KEY.bytes, 64),  # explicit, else sha256 hex
    "kirim_deliveries_event": EVENT_ID.bytes,
    "kirim_message_ids_pkey": MESSAGE_ID.bytes,
    "kirim_message_ids_message": MESSAGE_ID.bytes,
    "kirim_requests_pkey": max(KEY.bytes, EVENT_REQUEST_KEY),
    "kirim_confirmations_delivery": MESSAGE_ID.bytes,
    "kirim_confirmations_message": MESSAGE_ID.bytes,
    "kirim_preferences_pkey": RECIPIENT_ID.bytes,
    "kirim_throttle_pkey": STREAM.bytes,
    "kirim_digests_stream": STREAM.bytes,
    "kirim_digest_events_once": STREAM.bytes + EVENT_ID.bytes,
    "kirim_rates_pkey": CHANNEL.bytes,
    "kirim_topics_pkey": TOPIC.bytes,
    "kirim_topic_subscriptions_live": TOPIC.bytes + RECIPIENT_ID.bytes,
    "kirim_topic_subscriptions_order": TOPIC.bytes + RECIPIENT_ID.bytes,
    "kirim_topic_events_once": TYPE.bytes + EVENT_ID.bytes + TOPIC.bytes,
    "kirim_topic_events_by_topic": TOPIC.bytes,
}
