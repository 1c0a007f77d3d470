"""Which knobs the ``full`` workload draws: every setting a user can write is drawn,
or named here as irrelevant to delivery with the reason.

``KNOBS`` lists the settings (fields of ``Channel``, ``NotificationType`` and its
rules, ``Preferences``, ``WorkerSettings``, ``Config``; the keys of a
``[channels.NAME]`` table; the operator's actions; the worker and callback
variants) with how to read each from a drawn world. ``IRRELEVANT`` names the rest and
why. ``tests/explore/test_coverage.py`` fails when a field exists that neither names
(a knob added without explorer coverage), and when a listed knob takes only one value
over the coverage seeds (drawn by no seed).

``FAULT_KNOBS`` does the same for the faults of a seed's plan (``scenario.draw_faults``:
one plan per seed, which SQLite and the PostgreSQL lane play alike): every fault kind,
the ``takeover`` among them (a stale finish while another worker holds the claim,
which the PostgreSQL lane's ``finish_by_claim`` judges), is drawn by some seeds and
not by others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kirim.explore.faults import KINDS, Fault
from kirim.explore.full import Full
from kirim.explore.provider import GroundTruth
from kirim.explore.trace import Trace
from kirim.explore.world import FEED_VERBS, World

#: a knob's values in one world (one value per channel, type, recipient or worker)
Read = Callable[[World, Full], Iterable[Any]]


def _channels(attr: str) -> Read:
    return lambda w, f: [getattr(c, attr) for c in f.channels.values()]


def _models(attr: str) -> Read:
    return lambda w, f: [getattr(m, attr) for m in f.models.values()]


def _plans(attr: str) -> Read:
    return lambda w, f: [getattr(c, attr) for c in w.channels]


def _types(attr: str) -> Read:
    return lambda w, f: [getattr(t, attr) for t in f.types] + ([None] if not f.types else [])


def _rule(rule: str, attr: str) -> Read:
    return lambda w, f: [
        getattr(getattr(t, rule), attr) for t in f.types if getattr(t, rule) is not None
    ]


def _prefs(attr: str) -> Read:
    return lambda w, f: [None if p.prefs is None else getattr(p.prefs, attr) for p in w.prefs]


def _settings(attr: str) -> Read:
    return lambda w, f: [getattr(p.settings, attr) for p in w.workers]


def _acts(kind: str) -> Read:
    return lambda w, f: [any(a.kind == kind for a in w.actions)]


KNOBS: dict[str, Read] = {
    # Channel (kirim.channels) and what its provider says of itself
    "Channel.on_unknown": _channels("on_unknown"),
    "Channel.lookup": _channels("lookup"),
    "Channel.dedup_window": _channels("dedup_window"),
    "Channel.fallback": lambda w, f: [len(c.fallback) for c in f.channels.values()],
    "Channel.callback": lambda w, f: [c.callback is not None for c in f.channels.values()],
    "Channel.rate": _channels("rate"),
    "provider.idempotent": _models("idempotent"),
    "provider.timeout": _models("timeout"),
    "provider.lookup_lag": _models("lookup_lag"),
    "channels": lambda w, f: [len(w.channels)],
    # the [channels.NAME] keys a provider's behaviour depends on
    "toml.retry_on": lambda w, f: ["retry_on" in c.classes() for c in w.channels],
    "toml.ambiguous_on": lambda w, f: ["ambiguous_on" in c.classes() for c in w.channels],
    "toml.permanent_on": lambda w, f: ["permanent_on" in c.classes() for c in w.channels],
    # the provider models' behaviours that the channel's settings answer to
    "model.bounce": _plans("bounce"),
    "model.callback_key": _plans("callback_key"),
    # the services' own guard (APNs/FCM/Web Push collapse on the device), recipients'
    # device addresses (the fan-out) and the tokens a service calls dead
    "model.collapse": _plans("collapse"),
    "model.collapse_window": lambda w, f: [c.collapse_window for c in w.channels if c.collapse],
    "model.devices": _plans("devices"),
    # the in-app inbox: a channel whose message is a row of kirim's own
    "model.inbox": _plans("inbox"),
    # the inbox's readers: their actions on messages, and browsers following it live
    **{
        f"feed.{verb}": (lambda v: lambda w, f: [any(a.verb == v for a in w.feed_acts)])(verb)
        for verb in FEED_VERBS
    },
    "feed.streams": lambda w, f: [len(w.streams)],
    "feed.stream_sessions": lambda w, f: [len(s.sessions) for s in w.streams],
    "addresses.dead": lambda w, f: [a.dead for a in w.addresses],
    "addresses.per_recipient": lambda w, f: [
        sum(1 for a in w.addresses if a.recipient == p and a.channel == c.name)
        for c in w.channels
        if c.devices
        for p in w.recipients
    ],
    # NotificationType (kirim.notify.types) and its rules
    "NotificationType.templates": lambda w, f: [len(t.templates) for t in f.types],
    "NotificationType.critical": _types("critical"),
    "NotificationType.defaults": lambda w, f: [bool(t.defaults) for t in f.types],
    "NotificationType.window": _types("window"),
    "NotificationType.throttle": lambda w, f: [t.throttle is not None for t in f.types],
    "NotificationType.digest": lambda w, f: [t.digest is not None for t in f.types],
    "ThrottleRule.limit": _rule("throttle", "limit"),
    "ThrottleRule.window": _rule("throttle", "window"),
    "ThrottleRule.per": _rule("throttle", "per"),
    "ThrottleRule.key": _rule("throttle", "key"),
    "ThrottleRule.over": _rule("throttle", "over"),
    "DigestRule.window": _rule("digest", "window"),
    "DigestRule.key": _rule("digest", "key"),
    "types": lambda w, f: [len(f.types)],
    # Preferences (kirim.preferences), set before the run and changed during it
    "Preferences.opt_out": _prefs("opt_out"),
    "Preferences.channels": lambda w, f: [
        None if p.prefs is None else tuple(p.prefs.channels.values()) for p in w.prefs
    ],
    "Preferences.timezone": _prefs("timezone"),
    "Preferences.quiet_hours": _prefs("quiet_hours"),
    "preferences.deleted": lambda w, f: [p.prefs is None for p in w.prefs if p.at >= 0],
    "preferences.changed": lambda w, f: [sum(1 for p in w.prefs if p.at >= 0)],
    "start.anchor": lambda w, f: [w.anchor.split()[0]],
    # WorkerSettings (kirim.worker.settings), per worker
    **{
        f"WorkerSettings.{name}": _settings(name)
        for name in (
            "lease",
            "concurrency",
            "batch_size",
            "poll_interval",
            "heartbeat_interval",
            "reap_interval",
            "backoff_base",
            "backoff_max",
            "shutdown_grace",
            "request_timeout",
            "send_margin",
            "settle_margin",
            "stats_interval",
            "retention_keep",
            "retention_keys",
            "retention_archived",
        )
    },
    "worker.types": lambda w, f: [p.types for p in w.workers],
    "worker.channels": lambda w, f: [p.channels is None for p in w.workers],
    # Config (kirim.config)
    "Config.max_attempts": lambda w, f: [w.max_attempts],
    "Config.types": lambda w, f: [bool(w.types)],
    "Config.worker": lambda w, f: [len({p.settings for p in w.workers})],
    "Config.channels": lambda w, f: [len(w.channels)],
    # the application and the operator
    "send.notify": lambda w, f: [any(s.type is None for s in w.sends)],
    "send.event": lambda w, f: [any(s.type is not None for s in w.sends)],
    "send.again": lambda w, f: [len({s.event_id for s in w.sends}) < len(w.sends)],
    **{f"operator.{kind}": _acts(kind) for kind in ("retry", "cancel", "reconcile", "prune")},
    "operator.keys": lambda w, f: [w.keys],
    "operator.lookup": lambda w, f: [c.operator_lookup for c in w.channels],
    # topics (kirim.explore.topics): fan-outs, their batches, retried topic events
    "topics.fan_out": lambda w, f: [w.topics is not None],
    "topics.batch": lambda w, f: [] if w.topics is None else [w.topics.batch],
    "topics.pace": lambda w, f: [] if w.topics is None else [w.topics.pace],
    "topics.flow": lambda w, f: [] if w.topics is None else [w.topics.flow is not None],
    "topics.cancel": lambda w, f: (
        []
        if w.topics is None or w.topics.flow is None
        else [any(type(s).__name__ == "TopicCancel" for s in w.topics.steps)]
    ),
    "topics.again": lambda w, f: (
        [] if w.topics is None else [any(getattr(s, "again", False) for s in w.topics.steps)]
    ),
}

WIRE = "transport: the provider model stands in for the wire"
SMTP = "smtp transport: the smtp provider's own tests speak to a real server"
SERVICE = (
    "a push/SMS/chat service's credentials or transport: the provider model stands in, "
    "the service's own loopback fake checks them (tests/contract/test_services.py)"
)
#: settings that do not change what is delivered, and why the explorer leaves them
IRRELEVANT: dict[str, str] = {
    "Channel.name": "a label; the world names its channels push, email, sms",
    "Channel.provider": "the provider model stands in for every provider (its knobs are "
    "provider.*)",
    "NotificationType.name": "a label; the world names its types",
    # workflows are drawn by their own workload (kirim.explore.flows, FLOW_KNOBS, each
    # of which tests/explore/test_flows.py checks takes more than one value)
    "NotificationType.steps": "drawn by the flows workload (explore/flows.py FLOW_KNOBS: "
    "the first send's channel, the delay (a duration, or until a time of the recipient's "
    "day with its zone, near DST edges), the branch's condition, on_doubt, else)",
    "NotificationType.cancel_on": "drawn by the flows workload (FLOW_KNOBS cancel_on, with "
    "cancellations by event racing the steps they cancel)",
    "NotificationType.cancel_key": "drawn by the flows workload with cancel_on (FLOW_KNOBS)",
    "NotificationType.default_locale": "which template variant renders: checked by the "
    "template tests; no effect on when or how often a delivery goes",
    "Preferences.recipient_id": "an identity; the world draws 2 or 3 recipients",
    "Preferences.updated_at": "written by the store, not by a user",
    "Config.database": "each schedule has a database of its own (SQLite, or the PostgreSQL lane)",
    "Config.max_payload_bytes": "an intake limit for bad input: tests/unit and the HTTP "
    "contract tests hold it at the limit and one byte past it",
    "Config.listen_url": "where a worker LISTENs for wake-ups (past a pooler): wake-ups "
    "shorten the wait for a due job, never change what is sent; the wake-up tests hold it",
    "Config.source": "where the configuration was read from",
    "Config.inbox": "the feed tokens' secret and the browsers' origins (CORS): who may "
    "read a feed over HTTP, not what is written into it (tests/contract/test_feed_http.py)",
    "Config.serve": "kirim serve's HTTP settings; the explorer calls the engine's verbs "
    "that the HTTP routes call",
    "ChannelConfig.name": "as Channel.name",
    "ChannelConfig.provider": "as Channel.provider",
    "ChannelConfig.options": "provider options: the ones delivery depends on are toml.*",
    "ChannelConfig.callback_secret": "how callbacks are verified (the HTTP seam's tests); "
    "the explorer posts verified callbacks: Channel.callback",
    "ChannelConfig.callback_token": "as ChannelConfig.callback_secret",
    "toml.provider": "as Channel.provider",
    "toml.url": WIRE,
    "toml.headers": WIRE,
    "toml.token": WIRE,
    "toml.secret": "request signing: checked against standardwebhooks in the webhook tests",
    "toml.lookup_url": "where lookup asks: Channel.lookup is drawn",
    "toml.dedup": "a provider's name for its window, resolved by the config loader to "
    "dedup_window (drawn as Channel.dedup_window)",
    "toml.host": SMTP,
    "toml.port": SMTP,
    "toml.security": SMTP,
    "toml.username": SMTP,
    "toml.password": SMTP,
    "toml.from": "the smtp message's From header, not when or how often it goes",
    "toml.local_hostname": SMTP,
    "toml.ca_file": SMTP,
    "toml.urls": "apprise transport: the apprise bridge's tests drive it end to end",
    "toml.callback_secret": "as ChannelConfig.callback_secret",
    **{
        f"toml.{key}": SERVICE
        for key in (
            "team_id",
            "key_id",
            "private_key",
            "private_key_file",
            "topic",
            "environment",
            "ca_file",
            "service_account_file",
            "service_account",
            "project_id",
            "vapid_private_key",
            "vapid_private_key_file",
            "vapid_subject",
            "account_sid",
            "auth_token",
            "messaging_service_sid",
            "user_agent",
        )
    },
    "toml.push_type": "which APNs push type a request says: the loopback APNs tests hold it; "
    "no effect on when or how often a delivery goes",
    "toml.priority": "APNs delivery priority: the service's scheduling, not kirim's",
    "toml.expiration": "how long APNs keeps a notification for an offline device: the "
    "service's store (the model's collapse_window stands for what the device shows)",
    "toml.ttl": "as toml.expiration, for Web Push",
    "toml.urgency": "a Web Push hint to the service, not when or how often kirim sends",
    "toml.status_callback": "where Twilio posts its reports: the callbacks are drawn "
    "(Channel.callback), the URL is the HTTP seam's",
    "toml.channel": "a Slack channel fixed for every delivery: a label of where, drawn as "
    "Channel.lookup (it is what lets Slack's lookup work)",
    "toml.lookup_window": "how far back Slack's lookup reads: the model's lookup_lag and "
    "lookup failures stand for a lookup that cannot see",
    "toml.callback_token": "as ChannelConfig.callback_token",
}
#: the kirim.toml channel keys drawn under another name
TOML_AS = {
    "toml.rate": "Channel.rate",
    "toml.on_unknown": "Channel.on_unknown",
    "toml.lookup": "Channel.lookup",
    "toml.timeout": "provider.timeout",
    "toml.idempotent": "provider.idempotent",
    "toml.dedup_window": "Channel.dedup_window",
    "toml.lookup_lag": "provider.lookup_lag",
    "toml.fallback": "Channel.fallback",
}


def settings_fields() -> list[str]:
    """Every setting a user can write, by ``Class.field`` (and ``toml.key``)."""
    from kirim.channel_config import ChannelConfig, channel_keys
    from kirim.channels import Channel
    from kirim.config import Config
    from kirim.notify.types import DigestRule, NotificationType, ThrottleRule
    from kirim.preferences import Preferences
    from kirim.worker.settings import WorkerSettings

    out = []
    for cls in (
        Channel,
        ChannelConfig,
        NotificationType,
        ThrottleRule,
        DigestRule,
        Preferences,
        WorkerSettings,
        Config,
    ):
        out += [f"{cls.__name__}.{f.name}" for f in dataclasses.fields(cls)]
    out += [f"toml.{key}" for key in sorted(channel_keys())]
    return out


def unlisted() -> list[str]:
    """Settings that are neither drawn (``KNOBS``, ``TOML_AS``) nor ``IRRELEVANT``."""
    named = set(KNOBS) | set(IRRELEVANT) | set(TOML_AS)
    same = {f"ChannelConfig.{k.split('.', 1)[1]}" for k in KNOBS if k.startswith("Channel.")}
    same |= {f"ChannelConfig.{k}" for k in ("on_unknown", "lookup", "dedup_window", "fallback")}
    return [name for name in settings_fields() if name not in named and name not in same]


def observe(seeds: Iterable[int]) -> dict[str, set[str]]:
    """Each knob's distinct values over the worlds of ``seeds``."""
    seen: dict[str, set[str]] = {name: set() for name in KNOBS}
    for seed in seeds:
        world = World.draw(seed)
        full = Full(
            world, truth=GroundTruth(), trace=Trace(lambda: 0.0), seed=seed, time=lambda: 0.0
        )
        for name, read in KNOBS.items():
            seen[name].update(repr(v) for v in read(world, full))
    return seen


#: a fault knob's values in one seed's plan
PlanRead = Callable[[Sequence[Fault]], Iterable[Any]]


def _kind(kind: str) -> PlanRead:
    return lambda plan: [any(f.kind == kind for f in plan)]


FAULT_KNOBS: dict[str, PlanRead] = {
    **{f"fault.{kind}": _kind(kind) for kind in KINDS},
    "fault.pause.method": lambda plan: [f.method for f in plan if f.kind == "pause"],
    "fault.store.method": lambda plan: [f.method for f in plan if f.kind == "store"],
    "fault.takeover.nth": lambda plan: [f.nth for f in plan if f.kind == "takeover"],
}


def observe_faults(seeds: Iterable[int]) -> dict[str, set[str]]:
    """Each fault knob's distinct values over the full workload's plans of ``seeds``."""
    from kirim.explore.scenario import Settings, draw_faults

    seen: dict[str, set[str]] = {name: set() for name in FAULT_KNOBS}
    for seed in seeds:
        plan = draw_faults(Settings.draw(seed, workload="full"))
        for name, read in FAULT_KNOBS.items():
            seen[name].update(repr(v) for v in read(plan))
    return seen
