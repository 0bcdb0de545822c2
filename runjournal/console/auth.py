"""The operator token: who may approve and deny, and cancel, pause and resume runs, in the console.

The console is read-only unless it was started with an operator token (``RUNJOURNAL_CONSOLE_OPERATOR_TOKEN``).
Then an operator signs in once with the token: the console sets an HttpOnly, ``SameSite=Strict`` session cookie
holding an HMAC of the token (never the token itself), and every decision form carries a CSRF field derived from
it. A script may instead send ``Authorization: Bearer <token>``. Without a token configured, the approve, deny,
cancel, pause and resume buttons are never rendered and their endpoints answer 403 whatever is sent; with one, a
request without valid credentials gets 401. Comparisons are constant-time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hashlib
import hmac
import re

from starlette.requests import Request

__all__ = ["COOKIE", "NAME_COOKIE", "OperatorAuth"]

COOKIE = "rj_operator"
"""Session cookie: HMAC-SHA256(token, "session") in hex."""
NAME_COOKIE = "rj_operator_name"
"""Who the operator said they are (recorded as the approver; not a credential)."""
_NAME = re.compile(r"[^A-Za-z0-9 ._@-]")


class OperatorAuth:
    """Checks operator credentials against the token the console was started with.

    Args:
        token: the operator token, or None for a read-only console.
    """

    def __init__(self, token: str | None) -> None:
        self._token = token or None

    @property
    def enabled(self) -> bool:
        """True when the console was started with an operator token."""
        return self._token is not None

    def _mac(self, purpose: str) -> str:
        assert self._token is not None
        return hmac.new(self._token.encode(), purpose.encode(), hashlib.sha256).hexdigest()

    def session_value(self) -> str:
        """The session cookie's value (requires :attr:`enabled`)."""
        return self._mac("session")

    def csrf(self) -> str:
        """The CSRF field every decision form carries (requires :attr:`enabled`)."""
        return self._mac("csrf")

    def token_matches(self, given: str) -> bool:
        """True when ``given`` is the operator token (constant time)."""
        return self._token is not None and hmac.compare_digest(given.encode(), self._token.encode())

    def is_operator(self, request: Request) -> bool:
        """True when ``request`` carries a valid session cookie or ``Authorization: Bearer <token>``."""
        if self._token is None:
            return False
        bearer = request.headers.get("authorization", "")
        if bearer.startswith("Bearer ") and self.token_matches(bearer[len("Bearer "):]):
            return True
        return hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), self.session_value().encode())

    def csrf_ok(self, request: Request, given: str | None) -> bool:
        """A cookie-authenticated form must carry :meth:`csrf`; a bearer request needs none."""
        if request.headers.get("authorization", "").startswith("Bearer "):
            return True
        return given is not None and hmac.compare_digest(given.encode(), self.csrf().encode())

    @staticmethod
    def approver(request: Request) -> str:
        """The operator recorded with a decision (``approver``) or a cancel / pause / resume (``requested_by``): the
        name given at sign-in, marked as from the console."""
        name = _NAME.sub("", request.cookies.get(NAME_COOKIE, ""))[:64].strip() or "operator"
        return f"{name} (console)"
