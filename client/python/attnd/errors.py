"""The one exception type of the package."""

from __future__ import annotations


class AttndError(Exception):
    """A failed call: code (attnd_err value), name ("NOT_FOUND", ...), the message (the
    daemon's names the field and the value), and whether the daemon sent it (remote) or the
    client made it (transport, timeout, a call it could not encode)."""

    def __init__(self, code: int, name: str, message: str, remote: bool) -> None:
        super().__init__(f"{name}: {message}")
        self.code, self.name, self.message, self.remote = code, name, message, remote
