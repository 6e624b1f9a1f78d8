"""Login, sessions and CSRF, sans-IO: the users file, salted password hashes, signed session
cookies and the per-session CSRF token. No clock of its own (`now_s` comes in).

The users file, one account a line (`#` comments, blank lines ignored):

    name:role:scrypt$N$r$p$salt_hex$hash_hex

role is `viewer` (reads) or `admin` (reads and writes). `pocketmq console --hash-password`
prints the third field for a password typed in. Passwords are never stored or logged.

A session cookie is `name|role|expiry|nonce|mac` with mac = HMAC-SHA256(secret, the rest):
the console keeps no session table, a restart (a new random secret) logs everybody out.
The CSRF token of a session is HMAC(secret, "csrf|" + nonce): every form carries it and
every POST is refused without it (a page on another site can make the browser post, not
read the token).
"""
from __future__ import annotations

import hashlib
import hmac
from typing import NamedTuple

ROLES = ("viewer", "admin")
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2 ** 14, 8, 1
SESSION_TTL_S = 12 * 3600


class UsersFileError(ValueError):
    """The users file cannot be used; the message names the file and line."""


class Account(NamedTuple):
    name: str
    role: str
    hash: str


def hash_password(password: str, salt: bytes, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    if not password:
        raise ValueError("empty password")
    dk = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=32)
    return f"scrypt${n}${r}${p}${salt.hex()}${dk.hex()}"


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, want = stored.split("$")
        if scheme != "scrypt":
            return False
        got = hashlib.scrypt(password.encode("utf-8"), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p),
                             dklen=len(bytes.fromhex(want)))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got.hex(), want)


def parse_users(text: str, where: str = "users file") -> dict[str, Account]:
    users: dict[str, Account] = {}
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(":")
        if len(parts) != 3:
            raise UsersFileError(f"{where}:{i}: expected name:role:hash")
        name, role, h = (p.strip() for p in parts)
        if not name or "|" in name:
            raise UsersFileError(f"{where}:{i}: bad user name {name!r}")
        if role not in ROLES:
            raise UsersFileError(f"{where}:{i}: role must be viewer or admin, not {role!r}")
        fields = h.split("$")
        if len(fields) != 6 or fields[0] != "scrypt":
            raise UsersFileError(f"{where}:{i}: the hash must be scrypt$N$r$p$salt$hash "
                                 "(pocketmq console --hash-password makes one)")
        if name in users:
            raise UsersFileError(f"{where}:{i}: user {name} defined twice")
        users[name] = Account(name, role, h)
    if not users:
        raise UsersFileError(f"{where}: no account")
    return users


class Session(NamedTuple):
    name: str
    role: str
    expiry_s: int
    nonce: str


def _mac(secret: bytes, text: str) -> str:
    return hmac.new(secret, text.encode("utf-8"), hashlib.sha256).hexdigest()


def make_session_cookie(secret: bytes, s: Session) -> str:
    body = f"{s.name}|{s.role}|{s.expiry_s}|{s.nonce}"
    return f"{body}|{_mac(secret, body)}"


def read_session_cookie(secret: bytes, cookie: str | None, now_s: int) -> Session | None:
    """The session of a cookie when its mac checks and it has not expired, else None."""
    if not cookie:
        return None
    parts = cookie.split("|")
    if len(parts) != 5:
        return None
    body = "|".join(parts[:4])
    if not hmac.compare_digest(_mac(secret, body), parts[4]):
        return None
    name, role, expiry, nonce = parts[:4]
    try:
        expiry_s = int(expiry)
    except ValueError:
        return None
    if expiry_s <= now_s or role not in ROLES:
        return None
    return Session(name, role, expiry_s, nonce)


def csrf_token(secret: bytes, nonce: str) -> str:
    return _mac(secret, "csrf|" + nonce)


def csrf_ok(secret: bytes, nonce: str, token: str | None) -> bool:
    return bool(token) and hmac.compare_digest(csrf_token(secret, nonce), token)
