"""How long providers remember an idempotency key (their dedup window).

A provider that honours keys makes a resend with the same key safe only while it
still remembers the key. Past its window the key is forgotten, and a resend is a
second message: kirim then treats the channel as one that honours nothing (its
``lookup`` or ``on_unknown`` policy). A channel names its provider
(``dedup = "resend"``) or gives the window itself (``dedup_window = SECONDS``);
``kirim doctor`` compares it with the retry horizon.
"""

from __future__ import annotations

DAY = 86_400.0

#: Documented dedup windows of providers that take an idempotency key, in seconds.
KNOWN_WINDOWS: dict[str, float] = {
    "resend": DAY,
    "sparkpost": DAY,
    "telnyx": DAY,
    "brevo": 15 * 60.0,
    "onesignal": 30 * DAY,
}


def window_of(name: str) -> float:
    """The window of a known provider; ValueError naming the known ones otherwise."""
    try:
        return KNOWN_WINDOWS[name.lower()]
    except KeyError:
        known = ", ".join(sorted(KNOWN_WINDOWS))
        raise ValueError(f"unknown dedup provider {name!r} (known: {known})") from None
