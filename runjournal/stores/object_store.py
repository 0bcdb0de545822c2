"""The archive's object store: one fsspec filesystem chosen by ``Settings.archive_url`` (issue 30).

``file:///path`` (or a plain path) is a local folder — the embedded default, ``<stack_dir>/archive`` — and
``s3://bucket/prefix`` an S3 object store: AWS, or any S3 API at ``RUNJOURNAL_OBJECT_STORE_ENDPOINT`` (the local
stack's S3Proxy after ``runjournal stack up --object-store``). The archiver writes through what
:func:`filesystem` returns, so the same code serves both; pyarrow and DuckDB read fsspec filesystems too.

Needs the ``archive`` extra (``pip install 'runjournal[archive]'``: fsspec, s3fs).
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from runjournal.stores.errors import ObjectStoreError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from runjournal.core.settings import Settings

__all__ = ["filesystem", "object_store_outage"]

EXTRA = "pip install 'runjournal[archive]'"


def filesystem(settings: Settings) -> tuple[AbstractFileSystem, str]:
    """The filesystem of the archive and its root path in it, from ``settings.effective_archive_url``.

    Args:
        settings: ``archive_url`` chooses the backend (None: ``file://<stack_dir>/archive``);
            ``object_store_endpoint``, ``object_store_key`` and ``object_store_secret`` configure ``s3://``
            (None each: the AWS defaults).

    Returns:
        ``(fs, root)``: for ``file://`` a local filesystem and the folder's absolute path (created);
        for ``s3://bucket/prefix`` an s3fs filesystem and ``"bucket/prefix"`` (no trailing slash).

    Raises:
        ObjectStoreError: an unknown scheme, or fsspec / s3fs not installed (naming the extra to install).
    """
    url = settings.effective_archive_url
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        return _local(parts.path if parts.scheme else url)
    if parts.scheme in ("s3", "s3a"):
        if not parts.netloc:
            raise ObjectStoreError(f"RUNJOURNAL_ARCHIVE_URL={url}: an s3:// URL needs a bucket (s3://bucket/prefix)")
        return _s3(settings), f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/")
    raise ObjectStoreError(f"RUNJOURNAL_ARCHIVE_URL={url}: unknown scheme {parts.scheme!r}; use file:///path or "
                           "s3://bucket/prefix")


def _local(path: str) -> tuple[AbstractFileSystem, str]:
    try:
        from fsspec.implementations.local import LocalFileSystem
    except ImportError as exc:
        raise ObjectStoreError(f"the archive needs fsspec, which is not installed: {EXTRA}") from exc
    fs = LocalFileSystem(auto_mkdir=True)
    root = str(Path(path).expanduser().absolute())
    fs.makedirs(root, exist_ok=True)
    return fs, root


def _s3(settings: Settings) -> AbstractFileSystem:
    try:
        import s3fs
    except ImportError as exc:
        raise ObjectStoreError(f"RUNJOURNAL_ARCHIVE_URL={settings.effective_archive_url} is on S3, which needs "
                               f"s3fs, not installed: {EXTRA}") from exc
    kwargs: dict[str, Any] = {}
    if settings.object_store_endpoint:
        kwargs["client_kwargs"] = {"endpoint_url": settings.object_store_endpoint}
        # botocore >= 1.36 sends CRC checksums with every upload by default; S3-compatible servers that predate
        # them (S3Proxy 2.6: "A header you provided implies functionality that is not implemented") refuse the
        # write. Checksums only where the operation requires them, as before 1.36.
        kwargs["config_kwargs"] = {"request_checksum_calculation": "when_required",
                                   "response_checksum_validation": "when_required"}
    if settings.object_store_key:
        kwargs["key"] = settings.object_store_key
    if settings.object_store_secret is not None:
        kwargs["secret"] = settings.object_store_secret.get_secret_value()
    # a fresh instance: fsspec caches instances by arguments, and a test's stack differs from the next one's
    fs: AbstractFileSystem = s3fs.S3FileSystem(skip_instance_cache=True, **kwargs)
    return fs


_OUTAGE_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT,
                            errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EPIPE, errno.EIO, errno.ENOSPC, errno.EAGAIN})
_OUTAGE_MODULES = ("botocore", "aiobotocore", "aiohttp", "urllib3", "s3fs")
_OUTAGE_WORDS = ("Connect", "Timeout", "Disconnected", "Closed", "ServiceUnavailable", "SlowDown", "InternalError")


def object_store_outage(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception in its chain of causes) means the object store did not answer now —
    waiting can fix it — rather than that it refused the request.

    Outages: the built-in ``ConnectionError`` and ``TimeoutError``; an ``OSError`` whose errno is refused, reset,
    aborted, timed out, unreachable, a broken pipe, an I/O error (s3fs's translation of a 5xx) or a full disk; an
    error of botocore, aiobotocore, aiohttp, urllib3 or s3fs whose class names a connection, a timeout, a closed or
    disconnected peer, or S3's ``ServiceUnavailable`` / ``SlowDown`` / ``InternalError``. Not outages: a missing
    object (``FileNotFoundError``), a refused access (``PermissionError``), anything else. Never raises.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (FileNotFoundError, PermissionError)):
            return False
        if isinstance(current, (ConnectionError, TimeoutError)):
            return True
        if isinstance(current, OSError) and current.errno in _OUTAGE_ERRNOS:
            return True
        for cls in type(current).__mro__:
            if cls.__module__.split(".")[0] in _OUTAGE_MODULES and any(w in cls.__name__ for w in _OUTAGE_WORDS):
                return True
        code = str(getattr(current, "response", {}).get("Error", {}).get("Code", "")) \
            if isinstance(getattr(current, "response", None), dict) else ""
        if code in ("ServiceUnavailable", "SlowDown", "InternalError", "503", "500"):
            return True
        current = current.__cause__ or current.__context__
    return False
