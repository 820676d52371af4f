"""Exceptions of kvferry: every error carries a kvf_status_t.

``KvferryError.code`` is the C status (negative int), ``.name`` its
symbolic name (``"KVF_ERR_TIMEOUT"``) and ``.message`` the library's
description; subclasses group the codes and also derive from the
matching built-in exception (``TimeoutError``, ``ValueError``, ...).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Type

from . import _lib

OK = 0
INPROGRESS = 1
ERR_INVALID_PARAM = -1
ERR_NO_MEMORY = -2
ERR_NO_RESOURCE = -3
ERR_UNSUPPORTED = -4
ERR_BUSY = -5
ERR_TIMEOUT = -6
ERR_CANCELED = -7
ERR_IO = -8
ERR_NOT_FOUND = -9
ERR_EXISTS = -10
ERR_UNAVAILABLE = -11
ERR_INTERNAL = -12
ERR_CONNECT = -20
ERR_CONN_RESET = -21
ERR_PROTOCOL = -22
ERR_VERSION = -23
ERR_MSG_TOO_LARGE = -24
ERR_PEER_UNREACHABLE = -40
ERR_OUT_OF_BOUNDS = -41
ERR_NOT_REGISTERED = -42
ERR_PEER_CLOSED = -43
ERR_NO_TRANSPORT = -44
ERR_NO_KEY = -60
ERR_KEY_TOO_LARGE = -61
ERR_NO_SPACE = -62
ERR_LEASED = -63
ERR_NOT_READY = -64
ERR_STALE = -65
ERR_QUOTA = -66
ERR_NOT_LEADER = -67
ERR_CHECKSUM = -80
ERR_SHORT_DATA = -81


def status_name(code: int) -> str:
    """Symbolic name of a status code (kvf_status_name)."""
    return _lib.lib().kvf_status_name(code).decode()


def status_str(code: int) -> str:
    """Description of a status code (kvf_status_str)."""
    return _lib.lib().kvf_status_str(code).decode()


class KvferryError(Exception):
    """An error of the kvferry library, with its kvf_status_t."""

    def __init__(self, code: int, what: str = "", detail: str = ""):
        self.code = code
        self.name = status_name(code)
        self.message = status_str(code)
        self.what = what
        text = "%s: %s (%s)" % (what, self.message, self.name) if what else (
            "%s (%s)" % (self.message, self.name)
        )
        if detail:
            text += ": " + detail
        super().__init__(text)


class InvalidParamError(KvferryError, ValueError):
    """Bad argument (KVF_ERR_INVALID_PARAM), also a ValueError."""


class BufferTypeError(InvalidParamError, TypeError):
    """An object that is no buffer kvferry can use, also a TypeError."""


class ClosedError(InvalidParamError):
    """A call on an Engine, Peer, Region, Batch or Store already closed."""


class TimeoutError_(KvferryError, TimeoutError):
    """KVF_ERR_TIMEOUT, also a built-in TimeoutError."""


class CanceledError(KvferryError):
    """KVF_ERR_CANCELED."""


class NoKeyError(KvferryError, LookupError):
    """KVF_ERR_NO_KEY (and KVF_ERR_NOT_FOUND): the key is not stored."""


class ExistsError(KvferryError):
    """KVF_ERR_EXISTS: the key is already stored."""


class BusyError(KvferryError):
    """KVF_ERR_BUSY / KVF_ERR_LEASED / KVF_ERR_NOT_READY: try again later."""


class NoSpaceError(KvferryError):
    """KVF_ERR_NO_SPACE / KVF_ERR_NO_MEMORY / KVF_ERR_NO_RESOURCE."""


class KeyTooLargeError(InvalidParamError):
    """KVF_ERR_KEY_TOO_LARGE: key over KEY_MAX bytes."""


class ConnectError(KvferryError, ConnectionError):
    """Link errors (-20..-39) and unreachable or closed peers."""


class NotRegisteredError(KvferryError):
    """KVF_ERR_NOT_REGISTERED / KVF_ERR_OUT_OF_BOUNDS: memory outside a region."""


class IntegrityError(KvferryError):
    """KVF_ERR_CHECKSUM / KVF_ERR_SHORT_DATA: no good replica."""


class BatchError(KvferryError):
    """A batch call where some entries failed: ``statuses`` has every entry's code."""

    def __init__(self, code: int, what: str, statuses: Sequence[int]):
        bad = sum(1 for s in statuses if s != OK)
        super().__init__(code, what, "%d of %d failed" % (bad, len(statuses)))
        self.statuses: List[int] = list(statuses)


_BY_CODE: Dict[int, Type[KvferryError]] = {
    ERR_INVALID_PARAM: InvalidParamError,
    ERR_TIMEOUT: TimeoutError_,
    ERR_CANCELED: CanceledError,
    ERR_NO_KEY: NoKeyError,
    ERR_NOT_FOUND: NoKeyError,
    ERR_EXISTS: ExistsError,
    ERR_BUSY: BusyError,
    ERR_LEASED: BusyError,
    ERR_NOT_READY: BusyError,
    ERR_NO_SPACE: NoSpaceError,
    ERR_NO_MEMORY: NoSpaceError,
    ERR_NO_RESOURCE: NoSpaceError,
    ERR_KEY_TOO_LARGE: KeyTooLargeError,
    ERR_NOT_REGISTERED: NotRegisteredError,
    ERR_OUT_OF_BOUNDS: NotRegisteredError,
    ERR_CHECKSUM: IntegrityError,
    ERR_SHORT_DATA: IntegrityError,
    ERR_PEER_UNREACHABLE: ConnectError,
    ERR_PEER_CLOSED: ConnectError,
}


def error_class(code: int) -> Type[KvferryError]:
    """The exception class of a status code."""
    cls = _BY_CODE.get(code)
    if cls is None and -39 <= code <= -20:
        cls = ConnectError
    return cls or KvferryError


def make_error(code: int, what: str = "", detail: str = "") -> KvferryError:
    """The exception for a status code."""
    return error_class(code)(code, what, detail)


def check(code: int, what: str) -> None:
    """Raises the exception of code unless it is KVF_OK."""
    if code != OK:
        raise make_error(code, what)


def invalid(what: str, detail: str, cls: Optional[Type[KvferryError]] = None) -> KvferryError:
    """A Python-side argument error carrying KVF_ERR_INVALID_PARAM."""
    return (cls or InvalidParamError)(ERR_INVALID_PARAM, what, detail)
