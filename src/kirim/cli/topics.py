"""``kirim topics subscribe|unsubscribe|list|show``: topics and their subscribers
(``kirim.topics``, docs/topics.md)."""

from __future__ import annotations

import click

from kirim import limits
from kirim.cli import params, render, runner
from kirim.cli.runner import State, pass_state
from kirim.text import visible
from kirim.topics import Subscription, TopicCounts, TopicInfo, progress
from kirim.views import iso


@click.group(name="topics")
def topics() -> None:
    """Subscribe recipients to topics, and see a topic's subscribers and fan-outs.

    An event to a topic (Kirim.notify_topic, POST /v1/topics/{topic}/events) goes to
    everyone subscribed when it is recorded: the workers make its deliveries in
    batches, as notify_event would for each subscriber. One who subscribes after
    the event gets none of it; one who unsubscribes after it still gets it.

    \b
    Examples:
      kirim topics subscribe project:42 u-1007 u-1008
      kirim topics unsubscribe project:42 u-1008
      kirim topics list --recipient u-1007
      kirim topics show project:42 --json
    """


_TOPIC = params.TextParam(limit=limits.TOPIC)
_RECIPIENT = params.TextParam(limit=limits.RECIPIENT_ID)


@topics.command(name="subscribe")
@click.argument("topic", type=_TOPIC)
@click.argument("recipient_ids", nargs=-1, required=True, type=_RECIPIENT)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@pass_state
def subscribe_cmd(state: State, topic: str, recipient_ids: tuple[str, ...], as_json: bool) -> None:
    """Subscribe recipients to a topic (one already subscribed stays as it was).

    \b
    Example:
      kirim topics subscribe project:42 u-1007
    """
    state.setup_logging()

    async def go() -> list[Subscription]:
        async with state.app() as app:
            return [await app.subscribe(topic, r) for r in recipient_ids]

    for sub in runner.run(go):
        if as_json:
            render.emit_json(sub.to_json())
        else:
            said = "subscribed" if sub.created else "already subscribed"
            click.echo(visible(f"{sub.recipient_id} {said} to {sub.topic}"))


@topics.command(name="unsubscribe")
@click.argument("topic", type=_TOPIC)
@click.argument("recipient_ids", nargs=-1, required=True, type=_RECIPIENT)
@pass_state
def unsubscribe_cmd(state: State, topic: str, recipient_ids: tuple[str, ...]) -> None:
    """End recipients' subscriptions to a topic. Exits 1 when one of them had none.
    A fan-out of an event recorded before still reaches them.

    \b
    Example:
      kirim topics unsubscribe project:42 u-1007
    """
    state.setup_logging()

    async def go() -> list[bool]:
        async with state.app() as app:
            return [await app.unsubscribe(topic, r) for r in recipient_ids]

    done = runner.run(go)
    for recipient, ended in zip(recipient_ids, done, strict=True):
        said = "unsubscribed from" if ended else "was not subscribed to"
        click.echo(visible(f"{recipient} {said} {topic}"))
    if not all(done):
        raise SystemExit(1)


@topics.command(name="list")
@click.option("--recipient", type=_RECIPIENT, help="Only the topics this recipient is on.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="At most this many topics.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def list_cmd(state: State, recipient: str | None, limit: int, as_json: bool) -> None:
    """List topics with their subscriber counts (or one recipient's topics).

    \b
    Examples:
      kirim topics list
      kirim topics list --recipient u-1007 --json
    """
    state.setup_logging()

    async def go() -> list[TopicInfo] | list[str]:
        async with state.app() as app:
            if recipient is not None:
                return await app.topics_of(recipient)
            return await app.list_topics(limit=limit)

    found = runner.run(go)
    if recipient is not None:
        names = [str(t) for t in found]
        if as_json:
            render.emit_json({"recipient_id": recipient, "topics": names})
        for name in [] if as_json else names:
            click.echo(visible(name))
        return
    infos = [t for t in found if isinstance(t, TopicInfo)]
    if as_json:
        render.emit_json({"topics": [t.to_json() for t in infos]})
        return
    for t in infos:
        click.echo(visible(f"{t.topic}  subscribers={t.subscribers}"))


@topics.command(name="show")
@click.argument("topic", type=_TOPIC)
@click.option("--recent", type=click.IntRange(0, 1000), default=10, show_default=True,
              help="How many of its latest fan-outs to show.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def show_cmd(state: State, topic: str, recent: int, as_json: bool) -> None:
    """Print a topic's subscriber count and its latest fan-outs (how far each got).
    Exits 1 for a topic nobody ever subscribed or sent to.

    \b
    Example:
      kirim topics show project:42
    """
    show_topic(state, topic, recent, as_json)


def show_topic(state: State, topic: str, recent: int, as_json: bool) -> None:
    """``kirim topics show`` (and ``kirim status topic:NAME``)."""
    state.setup_logging()

    async def go() -> TopicInfo | None:
        async with state.app(read_only=True) as app:
            return await app.topic_info(topic, recent=recent)

    info = runner.run(go)
    if info is None:
        runner.fail(f"no topic {topic!r}")
    if as_json:
        render.emit_json(info.to_json())
        return
    click.echo(visible(f"topic        {info.topic}  (since {iso(info.created_at)})"))
    click.echo(f"subscribers  {info.subscribers}")
    if not info.recent:
        click.echo("fan-outs     none")
    for i, e in enumerate(info.recent):
        head = "fan-outs" if i == 0 else ""
        line = (
            f"{head:<12} #{e.id} {e.type} {e.event_id}  {progress(e)}  "
            f"{e.recipients} recipients in {e.batches} batches  (at {iso(e.created_at)})"
        )
        if e.canceled_at is not None:
            line += f"  canceled at {iso(e.canceled_at)}: {e.cancel_why}"
        click.echo(visible(line))


def show_counts(state: State, as_json: bool) -> None:
    """``kirim status`` without a delivery: the topics at a glance."""
    state.setup_logging()

    async def go() -> TopicCounts:
        async with state.app(read_only=True) as app:
            return await app.topic_counts()

    counts = runner.run(go)
    if as_json:
        render.emit_json({"topics": counts.to_json()})
        return
    click.echo(f"topics         {counts.topics}")
    click.echo(f"subscriptions  {counts.subscriptions}")
    click.echo(
        f"topic events   {counts.pending} pending fan-out, {counts.expanding} expanding, "
        f"{counts.done} done"
    )
