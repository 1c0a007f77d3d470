"""A channel: a name, the provider that carries it, and its in-doubt policy."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

from kirim.callbacks import CallbackAuth
from kirim.model import OnUnknown
from kirim.providers.base import Provider, Reconcilable
from kirim.validation import BadValue, Number

#: a channel's request rate (requests per second), from kirim.toml or from Python
RATE = Number(minimum=0, above=True, maximum=1_000_000, unit="requests per second")


@dataclass(frozen=True, slots=True, kw_only=True)
class Channel:
    name: str
    provider: Provider
    #: what to do when an earlier request may have reached a provider that does
    #: not honour idempotency keys
    on_unknown: OnUnknown = OnUnknown.ASSUME_SENT
    #: ask the provider (``lookup``) before anything else when in doubt
    lookup: bool = False
    #: seconds the provider remembers an idempotency key (None: for good); past it,
    #: an in-doubt resend is not trusted to the key (``kirim.providers.dedup``)
    dedup_window: float | None = None
    #: other channels' names, tried in order when this one's provider certainly did
    #: not accept a delivery (``kirim.worker.decisions.route``; docs/channels.md)
    fallback: tuple[str, ...] = ()
    #: how its providers' delivery callbacks are verified (None: callbacks are off)
    callback: CallbackAuth | None = field(default=None, repr=False)
    #: the provider's request rate, requests per second, shared by every worker on the
    #: database (``kirim.store.rates``); None: as fast as the workers go
    rate: float | None = None

    def __post_init__(self) -> None:
        if (problem := provider_problem(self.provider)) is not None:
            raise ValueError(f"channel {self.name!r}: {problem}")
        if self.lookup and not isinstance(self.provider, Reconcilable):
            raise ValueError(f"channel {self.name!r}: its provider has no lookup()")
        if (problem := fallback_list_problem(self.name, self.fallback)) is not None:
            raise ValueError(f"channel {self.name!r}: {problem}")
        if self.rate is not None:
            try:
                RATE.check("rate", self.rate)
            except BadValue as exc:
                raise ValueError(f"channel {self.name!r}: {exc}") from None

    @property
    def idempotent(self) -> bool:
        return bool(self.provider.idempotent)

    @property
    def in_commit(self) -> bool:
        """Its provider's effect is written in the finish's own commit (the inbox:
        ``writes_in_commit``): a request whose outcome was never committed had no
        effect, so nothing of it is ever in doubt."""
        return bool(getattr(self.provider, "writes_in_commit", False))

    @property
    def chain(self) -> tuple[str, ...]:
        """The channels a delivery of this one may go to, in order: itself, then its
        fallbacks."""
        return (self.name, *self.fallback)


def fallback_list_problem(name: str, fallback: Sequence[str]) -> str | None:
    """Why ``fallback`` cannot be channel ``name``'s list of fallbacks, or None: it
    names the channel itself, or another channel twice."""
    if name in fallback:
        return "fallback names the channel itself"
    for other in fallback:
        if fallback.count(other) > 1:
            return f"fallback names {other!r} twice"
    return None


def provider_problem(provider: object) -> str | None:
    """Why ``provider`` cannot carry a channel, or None.

    A provider needs ``idempotent`` (true or false) and ``async send(message)``;
    ``aclose()`` and ``lookup()`` are optional.
    """
    what = type(provider).__name__
    if not inspect.iscoroutinefunction(getattr(provider, "send", None)):
        return f"{what} is not a provider: it has no async send(message) method"
    if not isinstance(getattr(provider, "idempotent", None), bool):
        return f"{what} is not a provider: its idempotent attribute must be True or False"
    return None


async def close_provider(provider: object) -> None:
    """Await the provider's ``aclose()``, if it has one."""
    aclose = getattr(provider, "aclose", None)
    if aclose is not None:
        await aclose()
