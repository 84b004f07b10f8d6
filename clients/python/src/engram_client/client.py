"""The sync (:class:`Engram`) and asyncio (:class:`AsyncEngram`) clients.

Both have the same typed methods with the same arguments; the async ones are
coroutines. Every call carries the API key (``authorization: Bearer <key>``)
and a deadline (the client's ``timeout``, 5 s by default, or the call's
``timeout=``); the deadline covers retries too. Reads are retried on
UNAVAILABLE with exponential backoff while the deadline allows; writes
(remember, upsert, delete, add_edges, review_conflict, feedback,
remember_working) never are, so a write is sent at most once by this client.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import time
from typing import Any, Dict, Optional, Sequence, Tuple

import grpc
from grpc import aio

from . import _ops
from ._pb import foundry_pb2_grpc, retrieval_pb2_grpc
from .errors import DeadlineExceeded, from_rpc_error

__all__ = ["Engram", "AsyncEngram", "DEFAULT_TARGET", "DEFAULT_TIMEOUT", "VERSION"]

VERSION = "0.1.0"
DEFAULT_TARGET = "127.0.0.1:50051"
DEFAULT_TIMEOUT = 5.0
_MAX_BACKOFF = 1.0


def _target(url: str) -> Tuple[str, bool]:
    """``host:port`` and whether to use TLS: ``https://`` means TLS,
    ``http://`` or no scheme plaintext."""
    url = url.strip()
    for scheme, tls in (("https://", True), ("http://", False), ("grpc://", False)):
        if url.startswith(scheme):
            return url[len(scheme):].rstrip("/"), tls
    return url, False


class _Base:
    #: grpc (sync) or grpc.aio: where the channel comes from.
    _channels: Any

    def __init__(
        self,
        target: Optional[str] = None,
        *,
        api_key: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = 2,
        retry_backoff: float = 0.05,
        credentials: Optional[grpc.ChannelCredentials] = None,
        tenant_id: Optional[str] = None,
        options: Sequence[Tuple[str, Any]] = (),
    ) -> None:
        key = api_key if api_key is not None else os.environ.get("ENGRAM_API_KEY")
        if not key:
            raise ValueError("no API key: pass api_key= or set ENGRAM_API_KEY")
        if timeout <= 0:
            raise ValueError("timeout must be > 0 seconds")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        url = target or os.environ.get("ENGRAM_URL") or DEFAULT_TARGET
        self.target, tls = _target(url)
        if tls and credentials is None:
            credentials = grpc.ssl_channel_credentials()
        self._credentials = credentials
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.tenant_id = tenant_id if tenant_id is not None else os.environ.get("ENGRAM_TENANT")
        self._metadata = (("authorization", f"Bearer {key}"),)
        opts = [("grpc.primary_user_agent", f"engram-client-python/{VERSION}")] + list(options)
        if credentials is not None:
            self._channel = self._channels.secure_channel(self.target, credentials, opts)
        else:
            self._channel = self._channels.insecure_channel(self.target, opts)
        self._stub = self._stubs(self._channel)

    def _stubs(self, channel: Any) -> Dict[str, Any]:
        return {
            _ops.RETRIEVAL: retrieval_pb2_grpc.RetrievalServiceStub(channel),
            _ops.MEMORY: retrieval_pb2_grpc.MemoryServiceStub(channel),
            _ops.WORKING: retrieval_pb2_grpc.WorkingMemoryServiceStub(channel),
            _ops.FOUNDRY: foundry_pb2_grpc.KnowledgeFoundryServiceStub(channel),
        }

    def _known_tenant(self, op: _ops.Op) -> Optional[str]:
        """The Foundry calls' tenant, given or configured; when neither,
        the client learns the key's own once (:func:`_ops.tenant_lookup`)."""
        return op.tenant if op.tenant is not None else self.tenant_id

    def _learned_tenant(self, tenant: str) -> str:
        self.tenant_id = tenant
        return tenant

    def _deadline(self, timeout: Optional[float]) -> float:
        t = self.timeout if timeout is None else float(timeout)
        if t <= 0:
            raise ValueError("timeout must be > 0 seconds")
        return time.monotonic() + t

    def _backoff(self, attempt: int) -> float:
        # Full jitter over an exponential cap.
        return random.uniform(0, min(_MAX_BACKOFF, self.retry_backoff * (2 ** attempt)))

    def _remaining(self, deadline: float) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded("deadline exceeded before the call could be retried")
        return remaining

    def _retry_delay(self, op: _ops.Op, e: grpc.RpcError, attempt: int, deadline: float) -> float:
        """Seconds to wait before the next attempt; raises the typed error
        when the call is not to be retried."""
        if op.read and attempt < self.max_retries and e.code() == grpc.StatusCode.UNAVAILABLE:
            delay = self._backoff(attempt)
            if time.monotonic() + delay < deadline:
                return delay
        raise from_rpc_error(e) from e


class Engram(_Base, _ops.Calls):
    """Synchronous client. ``Engram()`` reads ``ENGRAM_URL`` (default
    ``127.0.0.1:50051``) and ``ENGRAM_API_KEY``; use as a context manager
    or call :meth:`close`.

    Arguments: ``target`` (``host:port``, ``http://`` or ``https://``),
    ``api_key``, ``timeout`` (default deadline in seconds), ``max_retries``
    (reads on UNAVAILABLE), ``retry_backoff`` (first backoff cap, seconds),
    ``credentials`` (TLS; implied by ``https://``), ``tenant_id`` (for the
    Knowledge Foundry calls; else ``ENGRAM_TENANT``), ``options`` (extra
    grpc channel options)."""

    _channels = grpc

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Engram":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _run(self, op: _ops.Op, timeout: Optional[float]) -> Any:
        if op.needs_tenant:
            op = op.with_tenant(self._known_tenant(op) or self._learned_tenant(
                self._run(_ops.tenant_lookup(), None)))
        deadline = self._deadline(timeout)
        call = getattr(self._stub[op.service], op.method)
        for attempt in itertools.count():
            try:
                response = call(op.request, timeout=self._remaining(deadline),
                                metadata=self._metadata)
            except grpc.RpcError as e:
                time.sleep(self._retry_delay(op, e, attempt, deadline))
            else:
                return op.convert(response)


@_ops.coroutine_methods
class AsyncEngram(_Base):
    """asyncio client (grpc.aio): the same methods as :class:`Engram`, as
    coroutines. Create it inside a running event loop; use ``async with``
    or ``await close()``."""

    _channels = aio

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncEngram":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _run(self, op: _ops.Op, timeout: Optional[float]) -> Any:
        if op.needs_tenant:
            op = op.with_tenant(self._known_tenant(op) or self._learned_tenant(
                await self._run(_ops.tenant_lookup(), None)))
        deadline = self._deadline(timeout)
        call = getattr(self._stub[op.service], op.method)
        for attempt in itertools.count():
            try:
                response = await call(op.request, timeout=self._remaining(deadline),
                                      metadata=self._metadata)
            except grpc.RpcError as e:
                await asyncio.sleep(self._retry_delay(op, e, attempt, deadline))
            else:
                return op.convert(response)
