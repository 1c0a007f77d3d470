"""The engine's verbs on recipients' feeds (``kirim.inbox``): what the library and
``/v1/recipients/{id}/feed`` call, and the one hook every feed change in this process
goes through (``on_feed_change``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kirim import feed_tokens
from kirim.errors import ConfigError, NotFound
from kirim.inbox import MAX_PAGE, FeedAction, FeedCounts, FeedFilter, FeedItem, FeedMark, FeedPage
from kirim.preferences import check_recipient_id
from kirim.validation import BadValue

if TYPE_CHECKING:
    from kirim.clock import Clock
    from kirim.config import Config
    from kirim.store.base import Store

#: told of each feed change after its commit, in this process: (recipient id, kind,
#: feed item id), kind "new", "state" or "delete" (a bulk mark: item id 0)
FeedChangeListener = Callable[[str, str, int], None]
#: the largest id a feed item can have
_MAX_ID = 2**63 - 1
#: a feed token's life when none is asked for (seconds)
DEFAULT_TOKEN_TTL = 3600.0


class Feeds:
    """Mixed into ``Kirim``: its store, clock and configuration."""

    if TYPE_CHECKING:
        config: Config
        store: Store
        clock: Clock
        log: Any
        on_feed_change: list[FeedChangeListener]

    def feed_changed(self, recipient_id: str, kind: str, item_id: int) -> None:
        """Tell every ``on_feed_change`` listener (after the change's commit); a
        listener's failure is logged, never the caller's."""
        for listener in list(self.on_feed_change):
            try:
                listener(recipient_id, kind, item_id)
            except Exception as exc:
                self.log.warning("feed_listener_failed", error=str(exc))

    async def feed(
        self,
        recipient_id: str,
        *,
        filter: FeedFilter | str = FeedFilter.INBOX,
        limit: int = 50,
        before: int | None = None,
    ) -> FeedPage:
        """A page of the recipient's feed, newest first (``before``: the cursor a page
        gave as ``next_before``), with its counts. ``filter``: ``inbox`` (every message
        not archived, the default), ``unseen``, ``unread``, ``archived`` or ``all``."""
        rid = check_recipient_id(recipient_id)
        try:
            which = FeedFilter(filter)
        except ValueError:
            raise BadValue("filter", "must be unseen, unread, archived or all") from None
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise BadValue("limit", f"must be an integer from 1 to {MAX_PAGE}")
        if before is not None and (not isinstance(before, int) or not 1 <= before <= _MAX_ID):
            raise BadValue("before", "must be a feed item's id")
        return await self.store.feed_page(rid, which, limit, before)

    async def feed_counts(self, recipient_id: str) -> FeedCounts:
        """The recipient's messages not archived that are not seen, and not read."""
        return await self.store.feed_counts(check_recipient_id(recipient_id))

    async def feed_action(
        self, recipient_id: str, item_id: int, action: FeedAction | str
    ) -> FeedItem:
        """``seen``, ``read``, ``unread``, ``archive`` or ``unarchive`` on one message
        of the recipient's (a mark set keeps its first time); ``NotFound`` when the
        recipient has no such message."""
        rid = check_recipient_id(recipient_id)
        verb = FeedAction(action)
        done = None
        if 1 <= item_id <= _MAX_ID:
            done = await self.store.feed_action(rid, item_id, verb, now=self.clock.now())
        if done is None:
            raise NotFound(f"recipient {rid!r} has no feed item {item_id}")
        item, changed = done
        if changed:
            self.feed_changed(rid, "state", item.id)
        return item

    async def mark_feed(
        self, recipient_id: str, state: FeedMark | str, ids: Sequence[int] | None = None
    ) -> int:
        """Mark ``state`` (``seen``, ``read``, ``archived``) on the recipient's messages
        ``ids`` (None: all of them: "mark all read"); the number changed."""
        rid = check_recipient_id(recipient_id)
        try:
            mark = FeedMark(state)
        except ValueError:
            raise BadValue("state", "must be seen, read or archived") from None
        wanted = None if ids is None else [i for i in ids if 1 <= i <= _MAX_ID]
        changed = await self.store.mark_feed(rid, wanted, mark, now=self.clock.now())
        if changed:
            self.feed_changed(rid, "state", 0)
        return changed

    async def delete_feed_item(self, recipient_id: str, item_id: int) -> None:
        """Delete one message of the recipient's; ``NotFound`` when there is none such."""
        rid = check_recipient_id(recipient_id)
        if not 1 <= item_id <= _MAX_ID or not await self.store.delete_feed_item(
            rid, item_id, now=self.clock.now()
        ):
            raise NotFound(f"recipient {rid!r} has no feed item {item_id}")
        self.feed_changed(rid, "delete", item_id)

    # -- feed tokens (``kirim.feed_tokens``) -------------------------------------------

    def _secret(self) -> str:
        secret = self.config.inbox.secret
        if secret is None:
            raise ConfigError(
                "no [inbox] secret (or KIRIM_INBOX_SECRET) is configured: feed tokens "
                "cannot be made nor checked"
            )
        return secret

    def feed_token(self, recipient_id: str, *, ttl: float = DEFAULT_TOKEN_TTL) -> tuple[str, float]:
        """A token that lets a browser read and mark ``recipient_id``'s feed, and
        nothing else, for ``ttl`` seconds (at most 30 days): the token and its expiry
        (epoch seconds). For the application's backend, which hands it to the page."""
        rid = check_recipient_id(recipient_id)
        if isinstance(ttl, bool) or not isinstance(ttl, int | float):
            raise BadValue("ttl_seconds", "must be a number of seconds")
        if not 1 <= ttl <= feed_tokens.MAX_TTL:
            raise BadValue("ttl_seconds", f"must be from 1 to {int(feed_tokens.MAX_TTL)} seconds")
        expires_at = float(int(self.clock.now() + ttl))
        return feed_tokens.sign(self._secret(), rid, expires_at), expires_at

    def feed_token_recipient(self, token: str) -> str:
        """The recipient a feed token is for; ``feed_tokens.BadFeedToken`` when it is
        forged, altered or expired (or no secret is configured)."""
        secret = self.config.inbox.secret
        if secret is None:
            raise feed_tokens.BadFeedToken("no [inbox] secret is configured")
        recipient_id, _ = feed_tokens.verify(secret, token, self.clock.now())
        return recipient_id
