"""Whose request it is: a tenant (an API key's digest; see http/_tenancy.py for how a request's
key becomes one). Its stored responses are its own, its prompts' prefixes are cached apart
from other tenants', and the engine shares its lanes fairly among tenants."""

from __future__ import annotations

import attrs


@attrs.frozen
class Tenant:
    id: str | None
    """A digest of the key (None: the API is open, every request is one tenant)."""
    admin: bool = False
    """An admin key: it may read and erase every tenant's stored responses."""

    def owns(self, owner: str | None) -> bool:
        """Whether this tenant may read, continue, list or delete what `owner` stored."""
        return self.admin or owner == self.id


ANONYMOUS = Tenant(None)
