"""The engine's verbs on recipients' addresses (``kirim.addresses``): what the
library, ``kirim addresses`` and ``/v1/recipients/{id}/addresses`` call."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kirim.addresses import (
    NEEDED,
    Address,
    check_address,
    check_label,
    kind_of,
)
from kirim.errors import UnknownChannel
from kirim.preferences import check_recipient_id
from kirim.providers.registry import address_kind as configured_kind
from kirim.validation import check_text

if TYPE_CHECKING:
    from kirim.channels import Channel
    from kirim.clock import Clock
    from kirim.config import Config
    from kirim.store.base import Store


class AddressBook:
    """Mixed into ``Kirim``: its store, clock, configuration and channels."""

    if TYPE_CHECKING:
        config: Config
        store: Store
        clock: Clock
        _channels: dict[str, Channel] | None

        @property
        def channel_names(self) -> set[str]: ...

    def address_kind(self, channel: str) -> str | None:
        """The kind of address ``channel`` takes (``kirim.addresses.KINDS``; None: any
        text), read from its provider, or from the configuration without building it."""
        if self._channels is not None:
            found = self._channels.get(channel)
            return None if found is None else kind_of(found.provider)
        spec = self.config.channels.get(channel)
        if spec is None:
            return None
        return configured_kind(spec.provider, spec.options)

    def address_channels(self) -> frozenset[str]:
        """The channels with nothing to send to without a recipient's address."""
        return frozenset(c for c in self.channel_names if self.address_kind(c) in NEEDED)

    def _known(self, channel: str) -> str:
        name = check_text("channel", channel)
        if name not in self.channel_names:
            known = ", ".join(sorted(self.channel_names)) or "none configured"
            raise UnknownChannel(f"unknown channel {name!r} (known: {known})")
        return name

    async def add_address(
        self, recipient_id: str, channel: str, address: str, *, label: str | None = None
    ) -> Address:
        """Give the recipient an address on ``channel`` (a device token, a phone number,
        a subscription...), checked as the channel's provider takes it; adding a
        retired one registers it again. BadValue naming what is wrong;
        ``UnknownChannel``."""
        rid = check_recipient_id(recipient_id)
        name = self._known(channel)
        text = check_address(self.address_kind(name), address)
        return await self.store.add_address(
            rid, name, text, label=check_label(label), now=self.clock.now()
        )

    async def addresses(self, recipient_id: str) -> list[Address]:
        """Every address of the recipient, retired ones too (marked)."""
        return await self.store.list_addresses(check_recipient_id(recipient_id))

    async def remove_address(self, recipient_id: str, channel: str, address: str) -> bool:
        """Forget one address of the recipient; False when it had none such."""
        rid = check_recipient_id(recipient_id)
        name = self._known(channel)
        text = check_address(self.address_kind(name), address)
        return await self.store.remove_address(rid, name, text)

    async def retire_address(
        self, channel: str, address: str, *, reason: str = "retired by an operator"
    ) -> int:
        """Mark the address dead on ``channel`` for every recipient that has it (as the
        worker does when the service says so); the number retired."""
        name = self._known(channel)
        text = check_address(self.address_kind(name), address)
        return await self.store.retire_address(name, text, reason=reason, now=self.clock.now())
