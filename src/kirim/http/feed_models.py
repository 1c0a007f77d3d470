"""The feed API's request and response shapes (``routes_feed``; pydantic, for
validation and the OpenAPI document)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kirim.feed_tokens import MAX_TTL
from kirim.http.models import StrTime
from kirim.inbox import MAX_PAGE

#: the largest feed item id
MAX_ITEM_ID = 2**63 - 1
ItemId = Annotated[int, Field(ge=1, le=MAX_ITEM_ID)]


class FeedItemOut(BaseModel):
    """One message of a recipient's feed: its marks are null or when they were set."""

    id: int = Field(description="Increasing: the cursor (`before`) and the live event id.")
    type: str | None = Field(description="The notification type (null: `POST /v1/notifications`).")
    title: str | None
    body: str | None
    action_url: str | None
    data: Any = Field(description="The type's `data` part (JSON), or null.")
    created_at: StrTime
    seen_at: StrTime | None
    read_at: StrTime | None
    archived_at: StrTime | None


class FeedCountsOut(BaseModel):
    """The recipient's messages not archived: how many not seen, how many not read."""

    unseen: int
    unread: int


class FeedPageOut(BaseModel):
    """One page, newest first; `next_before` is the next page's cursor (null: the end)."""

    items: list[FeedItemOut]
    next_before: int | None
    counts: FeedCountsOut


class FeedMarkIn(BaseModel):
    """Set one mark on many messages: `ids` null marks every one of the recipient's."""

    model_config = ConfigDict(extra="forbid", strict=True, title="FeedMarkIn")

    ids: Annotated[list[ItemId], Field(max_length=MAX_PAGE * 5)] | None = None
    state: Literal["seen", "read", "archived"]


class FeedMarkOut(BaseModel):
    """How many messages the mark changed (those that had it already are not counted)."""

    changed: int


class FeedTokenIn(BaseModel):
    """How long the feed token lives (seconds; 1 hour by default, 30 days at most)."""

    model_config = ConfigDict(extra="forbid", strict=True, title="FeedTokenIn")

    ttl_seconds: Annotated[int, Field(ge=1, le=int(MAX_TTL))] = 3600


class FeedTokenOut(BaseModel):
    """A token for the recipient's feed only: give it to their page (never log it)."""

    token: str
    expires_at: StrTime
