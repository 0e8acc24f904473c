"""Rules per path prefix and the guard built from them, shared by every middleware.

Only configuration lives here: matching, identities, checks and answers happen in Rust
(:class:`sluice.HttpGuard`), exactly as in the Rust ``RateLimitLayer``.
"""

from __future__ import annotations

import os
from typing import Iterable, List, Optional, Sequence, Union

from ._sluice import Config, HttpGuard, Limiter, Policy


class Rule:
    """The policies that apply to every path under ``prefix`` (segment-wise: ``/api``
    covers ``/api`` and ``/api/x``, not ``/apix``), optionally only for some ``methods``.
    The longest prefix wins; a rule without policies exempts its prefix (``/health``)."""

    __slots__ = ("prefix", "policies", "methods", "cost")

    def __init__(
        self,
        prefix: str,
        policies: Iterable[Policy] = (),
        *,
        methods: Optional[Iterable[str]] = None,
        cost: int = 1,
    ) -> None:
        self.prefix = prefix
        self.policies = list(policies)
        for p in self.policies:
            if not isinstance(p, Policy):
                raise TypeError(f"Rule({prefix!r}): expected sluice.Policy, got {type(p).__name__}")
        self.methods = None if methods is None else [m.upper() for m in methods]
        if cost < 0:
            raise ValueError("cost must not be negative")
        self.cost = cost

    def as_tuple(self):
        return (self.prefix, self.methods, self.policies, self.cost)

    def __repr__(self) -> str:
        names = [p.name for p in self.policies]
        return f"Rule({self.prefix!r}, {names}, methods={self.methods}, cost={self.cost})"


def build_guard(
    limiter: Optional[Limiter] = None,
    rules: Optional[Sequence[Rule]] = None,
    policies: Optional[Sequence[Policy]] = None,
    *,
    config: Union[None, Config, str, "os.PathLike[str]"] = None,
    api_key_header: Optional[str] = None,
    bearer: bool = False,
    trusted_proxies: Union[None, int, Sequence[str]] = None,
    ipv6_prefix: int = 64,
    ipv4_prefix: int = 32,
    hash_key: Optional[str] = None,
    legacy_headers: bool = False,
    ratelimit_headers: bool = True,
    fail_closed_status: int = 503,
) -> HttpGuard:
    """An :class:`HttpGuard` for ``rules``; ``policies`` is a shortcut for a rule on ``/``.

    With ``config`` (a :class:`sluice.Config` or the path of a ``sluice.toml``) the guard
    limits the file's ``[[routes]]`` as ``sluice serve``'s proxy does, each policy by its own
    ``identity``, with the file's hash key, trusted proxies, headers and ``count``; the
    limiter is then the file's own (:meth:`sluice.Limiter.from_config_sync`) unless one is
    given, and the identity options do not apply."""
    if config is not None:
        if rules or policies:
            raise ValueError("give either config (the routes of a sluice.toml) or rules/policies, not both")
        if not isinstance(config, Config):
            config = Config.load(config)
        if limiter is None:
            limiter = Limiter.from_config_sync(config)
        if not isinstance(limiter, Limiter):
            raise TypeError(f"expected a sluice.Limiter, got {type(limiter).__name__}")
        return HttpGuard.from_config(limiter, config)
    if not isinstance(limiter, Limiter):
        raise TypeError(f"expected a sluice.Limiter, got {type(limiter).__name__}")
    all_rules: List[Rule] = list(rules or [])
    if policies:
        all_rules.append(Rule("/", policies))
    if not all_rules:
        raise ValueError("no rules and no policies: nothing would be limited")
    if isinstance(trusted_proxies, str):
        trusted_proxies = [trusted_proxies]
    return HttpGuard(
        limiter,
        [r.as_tuple() for r in all_rules],
        api_key_header=api_key_header,
        bearer=bearer,
        trusted_proxies=None if trusted_proxies is None else (
            trusted_proxies if isinstance(trusted_proxies, int) else list(trusted_proxies)
        ),
        ipv6_prefix=ipv6_prefix,
        ipv4_prefix=ipv4_prefix,
        hash_key=hash_key,
        legacy_headers=legacy_headers,
        ratelimit_headers=ratelimit_headers,
        fail_closed_status=fail_closed_status,
    )
