"""Past its provider's dedup window, a key is not trusted to deduplicate a resend
(issue 14, item 5), on both backends."""

from __future__ import annotations

import pytest

from kirim.channels import Channel
from kirim.config import Config, load_config
from kirim.engine import Kirim
from kirim.errors import ConfigError
from kirim.model import DeliveryStatus, Doubt
from kirim.providers.base import Message, Sent
from kirim.providers.dedup import KNOWN_WINDOWS
from kirim.testing import FlakyProvider, ManualClock
from kirim.worker import WorkerSettings

SETTINGS = WorkerSettings(lease=10, backoff_base=1.0, backoff_max=1.0)


class Forgetful(FlakyProvider):
    """Honours keys, but only for ``window`` seconds after it first saw one."""

    def __init__(self, clock: ManualClock, window: float, **kwargs: object) -> None:
        super().__init__(idempotent=True, **kwargs)  # type: ignore[arg-type]
        self.clock, self.window = clock, window
        self.first_seen: dict[str, float] = {}

    async def send(self, message: Message) -> Sent:
        key = message.idempotency_key
        seen = self.first_seen.setdefault(key, self.clock.now())
        if self.clock.now() - seen > self.window:  # forgotten: a new message
            self._message_ids.pop(key, None)
            self.first_seen[key] = self.clock.now()
        return await super().send(message)


async def app_with(database_url: str, clock: ManualClock, window: float | None, provider):
    channel = Channel(name="push", provider=provider, dedup_window=window)
    app = Kirim(Config(database=database_url), channels={"push": channel}, clock=clock)
    return await app.open(migrate=True)


@pytest.mark.parametrize("window", [60.0, None], ids=["window-known", "window-unknown"])
async def test_a_resend_past_the_dedup_window_falls_back_to_the_policy(
    database_url: str, clock: ManualClock, window: float | None
) -> None:
    """The first answer is lost; the retry comes after the provider forgot the key: with
    the window known, kirim applies the channel's policy (assume sent) instead of a
    resend that would reach the user twice."""
    provider = Forgetful(clock, 60.0, script=["accept_then_timeout"])
    app = await app_with(database_url, clock, window, provider)
    try:
        n = await app.notify("e", "u", "push", {})
        worker = app.worker(settings=SETTINGS, worker_id="A")
        await worker.run_once()  # accepted, the answer lost: a retry with the same key
        job = await app.store.get_job(n.delivery_id)
        clock.set(job.run_at + 120)  # the provider has forgotten the key by then
        await worker.run_once()
        delivery = (await app.get(n.delivery_id)).delivery
    finally:
        await app.close()
    if window is None:  # what the window prevents: the key was trusted past it
        assert provider.effective(n.idempotency_key) == 2
    else:
        assert provider.effective(n.idempotency_key) == 1
        assert (delivery.status, delivery.doubt) == (DeliveryStatus.SENT, Doubt.ASSUMED_SENT)


class LateForgetful(Forgetful):
    """As ``Forgetful``, but the request lands ``delay`` seconds after it was sent (the
    clock moves on while it is in flight), and the window is judged when it lands."""

    def __init__(self, clock: ManualClock, window: float, delay: float, **kwargs: object):
        super().__init__(clock, window, **kwargs)
        self.delay = delay

    async def send(self, message: Message) -> Sent:
        if self.requests:  # the resend: it lands later
            self.clock.advance(self.delay)
        return await super().send(message)


async def test_a_resend_that_could_land_after_the_window_is_not_trusted_to_the_key(
    database_url: str, clock: ManualClock
) -> None:
    """Claimed 2 s before the window ends, a resend may leave until the claim's send
    deadline and land until its request timeout after that: past the window, a second
    message. kirim judges the window at the latest landing, not at the claim, and
    applies the policy (explorer: the full workload's key_window invariant; on main
    the user got 2 and the record said plain sent)."""
    provider = LateForgetful(clock, 900.0, 3.9, script=["accept_then_timeout"])
    app = await app_with(database_url, clock, 900.0, provider)
    try:
        n = await app.notify("e", "u", "push", {})
        worker = app.worker(settings=SETTINGS, worker_id="A")
        first = clock.now()
        await worker.run_once()  # accepted, the answer lost
        clock.set(first + 898.0)
        await worker.run_once()
        delivery = (await app.get(n.delivery_id)).delivery
        assert provider.effective(delivery.idempotency_key) == 1
        assert (delivery.status, delivery.doubt) == (DeliveryStatus.SENT, Doubt.ASSUMED_SENT)
    finally:
        await app.close()


def test_a_channel_names_its_provider_for_the_window(tmp_path) -> None:
    """``dedup = "resend"`` gives the channel Resend's 24-hour window; an unknown name or
    both keys at once is a configuration error."""
    path = tmp_path / "kirim.toml"
    base = '[channels.push]\nprovider = "webhook"\nurl = "http://127.0.0.1:9/p"\n'
    path.write_text(base + 'dedup = "resend"\n')
    config = load_config(path)
    assert config.channels["push"].dedup_window == KNOWN_WINDOWS["resend"] == 86_400
    assert config.channels["push"].build().dedup_window == 86_400
    path.write_text(base + 'dedup = "nobody"\n')
    with pytest.raises(ConfigError, match="unknown dedup provider"):
        load_config(path)
    path.write_text(base + 'dedup = "resend"\ndedup_window = 60\n')
    with pytest.raises(ConfigError, match="not both"):
        load_config(path)
