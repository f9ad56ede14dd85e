"""Whose request it is: the tenant a request's API key makes it.

With API keys on, each key is a tenant: its stored responses are its own (an admin key sees
every tenant's), its prompts' prefixes are cached apart from other keys' (unless
`--shared-prefix-cache`), and the engine shares its lanes fairly among tenants. With no
key set, every request is the one anonymous tenant (id None), as before keys existed.

A tenant's id is a digest of its key, never the key: it is stored beside a response and
must mean the same to every replica that shares the store, so it is not salted per process.
"""

from __future__ import annotations

import hashlib

from quart import g

from ..serving import ANONYMOUS, Tenant
from ._access import Access, key_candidates, key_held

_DOMAIN = b"mlx-nursery tenant\x00"


def tenant_id(key: bytes) -> str:
    return hashlib.sha256(_DOMAIN + key).hexdigest()[:32]


def tenant_of(access: Access, authorization: str | None, api_key: str | None) -> Tenant:
    """The tenant of a request that `access` let through, from its key headers (as
    `Access.verdict` reads them). A server with no API key: the anonymous tenant."""
    if access.api_open:
        return ANONYMOUS
    for candidate in key_candidates(authorization, api_key):
        if candidate and key_held(candidate, access.keys):
            return Tenant(tenant_id(candidate), admin=key_held(candidate, access.admin_keys))
    return ANONYMOUS  # a route open without a key (/health, /metrics)


def current_tenant() -> Tenant:
    """The tenant of the request being handled (set by the app's access check)."""
    tenant = getattr(g, "tenant", ANONYMOUS)
    assert isinstance(tenant, Tenant)
    return tenant
