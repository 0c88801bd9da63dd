"""Bearer tokens mapped to user ids.

Tokens come from a file (JSON `{"user": "token"}` or lines `user:token`) or
the DURAGENT_TOKENS variable (`alice:tok1,bob:tok2`; the old `alice=tok1`
is read with a warning). Only their SHA-256
digests are kept in memory, compared in constant time; a token is never
logged or echoed in an error.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

from duragent.errors import UsageError

ENV_VAR = "DURAGENT_TOKENS"
MIN_TOKEN_LENGTH = 16  # a guessable token is no lock; the gate also throttles wrong ones


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class TokenStore:
    """Who a bearer token belongs to."""

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        self._users: list[tuple[bytes, str]] = []
        for user, token in pairs:
            self.add(user, token)

    def add(self, user: str, token: str) -> None:
        user, token = user.strip(), token.strip()
        if not user or not token:
            raise UsageError("every token needs a user id and a non-empty token")
        if len(token) < MIN_TOKEN_LENGTH:
            # The length, never the token: this message reaches the terminal and logs.
            raise UsageError(
                f"the token of user {user!r} has {len(token)} characters; API tokens need at "
                f"least {MIN_TOKEN_LENGTH} (make one with: "
                "python -c 'import secrets; print(secrets.token_urlsafe(24))')"
            )
        digest = _digest(token)
        if any(hmac.compare_digest(digest, d) for d, _ in self._users):
            raise UsageError(f"user {user!r} has a token another user already has")
        self._users.append((digest, user))

    def user_for(self, token: str) -> str | None:
        """The user id a token belongs to, or None. Every entry is compared, so the
        time taken does not reveal which one matched."""
        digest = _digest(token)
        found = None
        for known, user in self._users:
            if hmac.compare_digest(digest, known):
                found = user
        return found

    @property
    def users(self) -> list[str]:
        return sorted({u for _, u in self._users})

    def __len__(self) -> int:
        return len(self._users)

    # --- loading ---

    @classmethod
    def from_mapping(cls, users: Mapping[str, str]) -> TokenStore:
        """`{"alice": "tok1"}`: user id -> token."""
        return cls(users.items())

    @classmethod
    def from_env(cls, value: str | None = None) -> TokenStore:
        """`alice:tok1,bob:tok2` (default: the DURAGENT_TOKENS variable), as in the file.

        The old `alice=tok1` items are still read, with a warning: the first
        separator in an item, `:` or `=`, decides.
        """
        text = os.environ.get(ENV_VAR, "") if value is None else value
        pairs = []
        old_style = False
        for item in text.split(","):
            if not item.strip():
                continue
            colon, equals = item.find(":"), item.find("=")
            if colon == -1 and equals == -1:
                raise UsageError(f"{ENV_VAR} items look like user:token, separated by commas")
            if colon == -1 or -1 < equals < colon:
                user, _, token = item.partition("=")
                old_style = True
            else:
                user, _, token = item.partition(":")
            pairs.append((user, token))
        if old_style:
            warnings.warn(
                f"{ENV_VAR}: write items as user:token (as in a tokens file); "
                "user=token is deprecated and will stop working",
                FutureWarning,
                stacklevel=2,
            )
        return cls(pairs)

    @classmethod
    def from_file(cls, path: str | Path) -> TokenStore:
        """A JSON object `{"alice": "tok1"}` or lines `alice:tok1` (# starts a comment)."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read the tokens file {p}: {exc.strerror}") from exc
        if text.lstrip().startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise UsageError(f"tokens file {p} is not valid JSON: {exc.msg}") from exc
            if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
                raise UsageError(
                    f'tokens file {p} should map user ids to tokens: {{"alice": "..."}}'
                )
            return cls.from_mapping(data)
        pairs = []
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, token = line.partition(":")
            if not sep:
                # No echo of the line: it may hold a token.
                raise UsageError(f"{p} line {n}: expected 'user:token'")
            pairs.append((user, token))
        return cls(pairs)

    @classmethod
    def load(cls, path: str | Path | None = None) -> TokenStore:
        """From the file if given, else from DURAGENT_TOKENS; refuses to be empty."""
        tokens = cls.from_file(path) if path is not None else cls.from_env()
        if not tokens:
            where = f"the tokens file {path}" if path is not None else f"${ENV_VAR}"
            raise UsageError(
                f"no API tokens configured in {where}; pass --tokens FILE (lines 'user:token') "
                f"or set {ENV_VAR}=alice:token1,bob:token2"
            )
        return tokens
