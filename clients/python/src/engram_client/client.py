"""The sync (:class:`Engram`) and asyncio (:class:`AsyncEngram`) clients.

Both have the same typed methods with the same arguments; the async ones are
coroutines. Every call carries the API key (``authorization: Bearer <key>``)
and a deadline (the client's ``timeout``, 5 s by default, or the call's
``timeout=``); the deadline covers retries too. Reads are retried on
UNAVAILABLE with exponential backoff while the deadline allows; writes
(remember, upsert, delete, add_edges, feedback, remember_working) never are,
so a write is sent at most once by this client.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from datetime import datetime
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import grpc
from grpc import aio

from . import _ops
from ._pb import foundry_pb2_grpc, retrieval_pb2_grpc
from .errors import DeadlineExceeded, from_rpc_error
from .types import (
    AccessLevel,
    ConversationMessage,
    DemandResult,
    Edge,
    FeedbackItem,
    FoundryResponse,
    Memory,
    MemoryPage,
    RetrievalMode,
    RetrieveResult,
    TimeRange,
    Triple,
    UpsertResult,
    WorkingMemoryResult,
)

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
        self._options = [("grpc.primary_user_agent", f"engram-client-python/{VERSION}")]
        self._options += list(options)

    def _stubs(self, channel: Any) -> Dict[str, Any]:
        return {
            _ops.RETRIEVAL: retrieval_pb2_grpc.RetrievalServiceStub(channel),
            _ops.MEMORY: retrieval_pb2_grpc.MemoryServiceStub(channel),
            _ops.WORKING: retrieval_pb2_grpc.WorkingMemoryServiceStub(channel),
            _ops.FOUNDRY: foundry_pb2_grpc.KnowledgeFoundryServiceStub(channel),
        }

    def _known_tenant(self, tenant_id: Optional[str]) -> Optional[str]:
        return tenant_id if tenant_id is not None else self.tenant_id

    def _deadline(self, timeout: Optional[float]) -> float:
        t = self.timeout if timeout is None else float(timeout)
        if t <= 0:
            raise ValueError("timeout must be > 0 seconds")
        return time.monotonic() + t

    def _backoff(self, attempt: int) -> float:
        # Full jitter over an exponential cap.
        return random.uniform(0, min(_MAX_BACKOFF, self.retry_backoff * (2 ** attempt)))

    def _retry_delay(self, op: _ops.Op, e: grpc.RpcError, attempt: int,
                     deadline: float) -> Optional[float]:
        """Seconds to wait before the next attempt, or None to give up."""
        if not op.read or attempt >= self.max_retries:
            return None
        if e.code() != grpc.StatusCode.UNAVAILABLE:
            return None
        delay = self._backoff(attempt)
        if time.monotonic() + delay >= deadline:
            return None
        return delay


class Engram(_Base):
    """Synchronous client. ``Engram()`` reads ``ENGRAM_URL`` (default
    ``127.0.0.1:50051``) and ``ENGRAM_API_KEY``; use as a context manager
    or call :meth:`close`.

    Arguments: ``target`` (``host:port``, ``http://`` or ``https://``),
    ``api_key``, ``timeout`` (default deadline in seconds), ``max_retries``
    (reads on UNAVAILABLE), ``retry_backoff`` (first backoff cap, seconds),
    ``credentials`` (TLS; implied by ``https://``), ``tenant_id`` (for the
    Knowledge Foundry calls; else ``ENGRAM_TENANT``), ``options`` (extra
    grpc channel options)."""

    def __init__(self, target: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        if self._credentials is not None:
            self._channel = grpc.secure_channel(self.target, self._credentials, self._options)
        else:
            self._channel = grpc.insecure_channel(self.target, self._options)
        self._stub = self._stubs(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Engram":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _tenant(self, tenant_id: Optional[str]) -> str:
        """The Foundry calls' tenant: given, configured, or the key's own
        (learned once from a one-item ListMemories page)."""
        t = self._known_tenant(tenant_id)
        if not t:
            t = self.tenant_id = self.list_memories(page_size=1).tenant
        return t

    def _run(self, op: _ops.Op, timeout: Optional[float]) -> Any:
        deadline = self._deadline(timeout)
        call = getattr(self._stub[op.service], op.method)
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceeded("deadline exceeded before the call could be retried")
            try:
                response = call(op.request, timeout=remaining, metadata=self._metadata)
            except grpc.RpcError as e:
                delay = self._retry_delay(op, e, attempt, deadline)
                if delay is None:
                    raise from_rpc_error(e) from e
                time.sleep(delay)
                attempt += 1
                continue
            return op.convert(response)

    # ------------------------------------------------------------ writes

    def remember(
        self,
        content: str,
        *,
        id: str = "",
        namespace: str = "",
        memory_type: str = "",
        title: str = "",
        access_level: Union[AccessLevel, str, None] = None,
        source_confidence: Optional[float] = None,
        event_time: Optional[datetime] = None,
        valid_from: Optional[datetime] = None,
        valid_to: Optional[datetime] = None,
        supersedes: str = "",
        consolidated: bool = False,
        metadata: Optional[Dict[str, Any]] = None,
        source: str = "",
        entities: Sequence[str] = (),
        triples: Sequence[Triple] = (),
        embedding: Sequence[float] = (),
        timeout: Optional[float] = None,
    ) -> UpsertResult:
        """Writes one memory (``MemoryService.Upsert``). A client-chosen
        ``id`` (UUID) makes the write idempotent; ``supersedes=<old id>``
        records an update: the old memory is closed, not deleted, and drops
        out of retrieval unless ``include_historical``. Never retried."""
        m = _ops.memory_of(
            content, id=id, namespace=namespace, memory_type=memory_type, title=title,
            access_level=access_level, source_confidence=source_confidence,
            event_time=event_time, valid_from=valid_from, valid_to=valid_to,
            supersedes=supersedes, consolidated=consolidated, metadata=metadata,
            source=source, entities=entities, triples=triples, embedding=embedding,
        )
        return self._run(_ops.upsert_one(m), timeout)

    def upsert(
        self, memories: Iterable[Union[Memory, str]], *, timeout: Optional[float] = None
    ) -> List[UpsertResult]:
        """Writes a batch (1..1000) of memories; results in request order.
        Never retried."""
        return self._run(_ops.upsert(memories), timeout)

    def get(
        self, ids: Union[str, Iterable[str]], *, timeout: Optional[float] = None
    ) -> List[Memory]:
        """The caller's memories with these ids (unknown or unreadable ids
        are left out). Embeddings are never returned."""
        return self._run(_ops.get(ids), timeout)

    def delete(self, ids: Union[str, Iterable[str]], *, timeout: Optional[float] = None) -> int:
        """Deletes memories (and working notes) by id; returns how many."""
        return self._run(_ops.delete(ids), timeout)

    def add_edges(self, edges: Iterable[Edge], *, timeout: Optional[float] = None) -> int:
        """Adds typed edges between memories (related, contradicts,
        supersedes, causes, supports, part_of, ...); returns how many."""
        return self._run(_ops.add_edges(edges), timeout)

    def list_memories(
        self,
        *,
        page_size: Optional[int] = None,
        page_token: str = "",
        namespace: str = "",
        memory_types: Sequence[str] = (),
        time_range: Optional[TimeRange] = None,
        include_historical: bool = False,
        include_consolidated: bool = False,
        newest_first: bool = False,
        timeout: Optional[float] = None,
    ) -> MemoryPage:
        """One page (1..1000, default 100) of the caller's stored memories
        by ingestion time (``MemoryService.ListMemories``); pass
        ``next_page_token`` back as ``page_token`` for the next page. The
        page also names the key's tenant. Retried on UNAVAILABLE."""
        op = _ops.list_memories(
            page_size=page_size, page_token=page_token, namespace=namespace,
            memory_types=memory_types, time_range=time_range,
            include_historical=include_historical,
            include_consolidated=include_consolidated, newest_first=newest_first,
        )
        return self._run(op, timeout)

    # ------------------------------------------------------------ retrieval

    def retrieve(
        self,
        text: str = "",
        *,
        conversation: Sequence[Union[ConversationMessage, Dict[str, Any]]] = (),
        memory_types: Sequence[str] = (),
        time_range: Optional[TimeRange] = None,
        agent_scope: Sequence[str] = (),
        limit: Optional[int] = None,
        include_consolidated: bool = False,
        include_historical: bool = False,
        min_confidence: Optional[float] = None,
        as_of_event: Optional[datetime] = None,
        as_of_ingestion: Optional[datetime] = None,
        namespace: str = "",
        metadata_filter: Optional[Dict[str, Any]] = None,
        mode: Union[RetrievalMode, str, None] = None,
        hypotheses: Sequence[str] = (),
        turn_id: str = "",
        token_budget: int = 0,
        explain: bool = False,
        context_sufficient: bool = False,
        skip_rerank: bool = False,
        no_cache: bool = False,
        fail_open: bool = False,
        timeout: Optional[float] = None,
    ) -> RetrieveResult:
        """``RetrievalService.Retrieve``: the memories that matter for
        ``text`` (or, when ``text`` is empty, for the recent
        ``conversation``), each with its provenance. Every request field is
        a keyword argument of the same name. Retried on UNAVAILABLE."""
        op = _ops.retrieve(
            text, conversation=conversation, memory_types=memory_types,
            time_range=time_range, agent_scope=agent_scope, limit=limit,
            include_consolidated=include_consolidated,
            include_historical=include_historical, min_confidence=min_confidence,
            as_of_event=as_of_event, as_of_ingestion=as_of_ingestion, namespace=namespace,
            metadata_filter=metadata_filter, mode=mode, hypotheses=hypotheses,
            turn_id=turn_id, token_budget=token_budget, explain=explain,
            context_sufficient=context_sufficient, skip_rerank=skip_rerank,
            no_cache=no_cache, fail_open=fail_open,
        )
        return self._run(op, timeout)

    def feedback(
        self,
        query_id: str,
        items: Iterable[Union[FeedbackItem, Tuple[Any, ...], str]],
        *,
        timeout: Optional[float] = None,
    ) -> int:
        """Reports which of a retrieval's records were used / helpful /
        sufficient. Only the caller that got ``query_id`` may, and only on
        memories that answer returned. Returns how many items were
        accepted. Never retried."""
        return self._run(_ops.feedback(query_id, items), timeout)

    # ------------------------------------------------------------ working memory

    def remember_working(
        self,
        content: str,
        *,
        session_id: str,
        ttl_ms: Optional[int] = None,
        id: str = "",
        namespace: str = "",
        title: str = "",
        access_level: Union[AccessLevel, str, None] = None,
        source_confidence: Optional[float] = None,
        metadata: Optional[Dict[str, Any]] = None,
        source: str = "",
        embedding: Sequence[float] = (),
        timeout: Optional[float] = None,
    ) -> UpsertResult:
        """Writes a session note into the gateway's working memory (a
        ``memory_type="working"`` upsert with ``metadata.session_id`` and
        ``metadata.ttl_ms``). Kept in process memory, never in Postgres;
        private to this tenant and agent. Never retried."""
        m = _ops.working_memory_of(content, session_id, ttl_ms, dict(
            id=id, namespace=namespace, title=title, access_level=access_level,
            source_confidence=source_confidence, metadata=metadata, source=source,
            embedding=embedding,
        ))
        return self._run(_ops.upsert_one(m), timeout)

    def get_memory(
        self,
        query: str,
        *,
        session_id: str = "",
        min_confidence: Optional[float] = None,
        limit: Optional[int] = None,
        compact: bool = False,
        include_sources: bool = False,
        max_depth: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> WorkingMemoryResult:
        """``WorkingMemoryService.GetMemory``: the session's notes first,
        the memory graph (with causes, sources, open contradictions) when
        nothing in the session matches. Retried on UNAVAILABLE."""
        op = _ops.get_memory(
            query, session_id=session_id, min_confidence=min_confidence, limit=limit,
            compact=compact, include_sources=include_sources, max_depth=max_depth,
        )
        return self._run(op, timeout)

    def get_demand(
        self, limit: Optional[int] = None, *, timeout: Optional[float] = None
    ) -> DemandResult:
        """The tenant's most requested retrieval shapes."""
        return self._run(_ops.get_demand(limit), timeout)

    # ------------------------------------------------------------ knowledge foundry

    def retrieve_basic(
        self,
        kb_id: str,
        query: str,
        *,
        tenant_id: Optional[str] = None,
        top_k: Optional[int] = None,
        mode: str = "",
        filters: Optional[Dict[str, Any]] = None,
        similarity_threshold: Optional[float] = None,
        timeout: Optional[float] = None,
    ) -> FoundryResponse:
        """Knowledge Foundry basic retrieval in one knowledge base
        (namespace). ``tenant_id`` must be the API key's tenant; it defaults
        to the client's (argument or ``ENGRAM_TENANT``), else the key's own
        tenant as the gateway reports it."""
        op = _ops.retrieve_basic(
            kb_id, query, tenant_id=self._tenant(tenant_id), top_k=top_k, mode=mode,
            filters=filters, similarity_threshold=similarity_threshold,
        )
        return self._run(op, timeout)

    def retrieve_agentic(
        self,
        query: str,
        *,
        tenant_id: Optional[str] = None,
        kb_ids: Sequence[str] = (),
        max_steps: Optional[int] = None,
        reasoning_effort: str = "",
        top_k_per_step: Optional[int] = None,
        token_budget: Optional[int] = None,
        max_latency_ms: Optional[int] = None,
        mode: str = "",
        filters: Optional[Dict[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> FoundryResponse:
        """Knowledge Foundry agentic retrieval (decompose, retrieve per
        step, pack a context). Its default deadline is the larger of the
        client's and ``max_latency_ms`` (30 s when unset) plus one second."""
        op = _ops.retrieve_agentic(
            query, tenant_id=self._tenant(tenant_id), kb_ids=kb_ids, max_steps=max_steps,
            reasoning_effort=reasoning_effort, top_k_per_step=top_k_per_step,
            token_budget=token_budget, max_latency_ms=max_latency_ms, mode=mode,
            filters=filters,
        )
        if timeout is None:
            timeout = max(self.timeout, (max_latency_ms or 30_000) / 1000.0 + 1.0)
        return self._run(op, timeout)

class AsyncEngram(_Base):
    """asyncio client (grpc.aio): the same methods as :class:`Engram`, as
    coroutines. Create it inside a running event loop; use ``async with``
    or ``await close()``."""

    def __init__(self, target: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        if self._credentials is not None:
            self._channel = aio.secure_channel(self.target, self._credentials, self._options)
        else:
            self._channel = aio.insecure_channel(self.target, self._options)
        self._stub = self._stubs(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncEngram":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _tenant(self, tenant_id: Optional[str]) -> str:
        """The Foundry calls' tenant: given, configured, or the key's own
        (learned once from a one-item ListMemories page)."""
        t = self._known_tenant(tenant_id)
        if not t:
            t = self.tenant_id = (await self.list_memories(page_size=1)).tenant
        return t

    async def _run(self, op: _ops.Op, timeout: Optional[float]) -> Any:
        deadline = self._deadline(timeout)
        call = getattr(self._stub[op.service], op.method)
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceeded("deadline exceeded before the call could be retried")
            try:
                response = await call(op.request, timeout=remaining, metadata=self._metadata)
            except grpc.RpcError as e:
                delay = self._retry_delay(op, e, attempt, deadline)
                if delay is None:
                    raise from_rpc_error(e) from e
                await asyncio.sleep(delay)
                attempt += 1
                continue
            return op.convert(response)

    # ------------------------------------------------------------ writes

    async def remember(
        self,
        content: str,
        *,
        id: str = "",
        namespace: str = "",
        memory_type: str = "",
        title: str = "",
        access_level: Union[AccessLevel, str, None] = None,
        source_confidence: Optional[float] = None,
        event_time: Optional[datetime] = None,
        valid_from: Optional[datetime] = None,
        valid_to: Optional[datetime] = None,
        supersedes: str = "",
        consolidated: bool = False,
        metadata: Optional[Dict[str, Any]] = None,
        source: str = "",
        entities: Sequence[str] = (),
        triples: Sequence[Triple] = (),
        embedding: Sequence[float] = (),
        timeout: Optional[float] = None,
    ) -> UpsertResult:
        """Writes one memory (``MemoryService.Upsert``). A client-chosen
        ``id`` (UUID) makes the write idempotent; ``supersedes=<old id>``
        records an update: the old memory is closed, not deleted, and drops
        out of retrieval unless ``include_historical``. Never retried."""
        m = _ops.memory_of(
            content, id=id, namespace=namespace, memory_type=memory_type, title=title,
            access_level=access_level, source_confidence=source_confidence,
            event_time=event_time, valid_from=valid_from, valid_to=valid_to,
            supersedes=supersedes, consolidated=consolidated, metadata=metadata,
            source=source, entities=entities, triples=triples, embedding=embedding,
        )
        return await self._run(_ops.upsert_one(m), timeout)

    async def upsert(
        self, memories: Iterable[Union[Memory, str]], *, timeout: Optional[float] = None
    ) -> List[UpsertResult]:
        """Writes a batch (1..1000) of memories; results in request order.
        Never retried."""
        return await self._run(_ops.upsert(memories), timeout)

    async def get(
        self, ids: Union[str, Iterable[str]], *, timeout: Optional[float] = None
    ) -> List[Memory]:
        """The caller's memories with these ids (unknown or unreadable ids
        are left out). Embeddings are never returned."""
        return await self._run(_ops.get(ids), timeout)

    async def delete(self, ids: Union[str, Iterable[str]], *, timeout: Optional[float] = None) -> int:
        """Deletes memories (and working notes) by id; returns how many."""
        return await self._run(_ops.delete(ids), timeout)

    async def add_edges(self, edges: Iterable[Edge], *, timeout: Optional[float] = None) -> int:
        """Adds typed edges between memories (related, contradicts,
        supersedes, causes, supports, part_of, ...); returns how many."""
        return await self._run(_ops.add_edges(edges), timeout)

    async def list_memories(
        self,
        *,
        page_size: Optional[int] = None,
        page_token: str = "",
        namespace: str = "",
        memory_types: Sequence[str] = (),
        time_range: Optional[TimeRange] = None,
        include_historical: bool = False,
        include_consolidated: bool = False,
        newest_first: bool = False,
        timeout: Optional[float] = None,
    ) -> MemoryPage:
        """One page (1..1000, default 100) of the caller's stored memories
        by ingestion time (``MemoryService.ListMemories``); pass
        ``next_page_token`` back as ``page_token`` for the next page. The
        page also names the key's tenant. Retried on UNAVAILABLE."""
        op = _ops.list_memories(
            page_size=page_size, page_token=page_token, namespace=namespace,
            memory_types=memory_types, time_range=time_range,
            include_historical=include_historical,
            include_consolidated=include_consolidated, newest_first=newest_first,
        )
        return await self._run(op, timeout)

    # ------------------------------------------------------------ retrieval

    async def retrieve(
        self,
        text: str = "",
        *,
        conversation: Sequence[Union[ConversationMessage, Dict[str, Any]]] = (),
        memory_types: Sequence[str] = (),
        time_range: Optional[TimeRange] = None,
        agent_scope: Sequence[str] = (),
        limit: Optional[int] = None,
        include_consolidated: bool = False,
        include_historical: bool = False,
        min_confidence: Optional[float] = None,
        as_of_event: Optional[datetime] = None,
        as_of_ingestion: Optional[datetime] = None,
        namespace: str = "",
        metadata_filter: Optional[Dict[str, Any]] = None,
        mode: Union[RetrievalMode, str, None] = None,
        hypotheses: Sequence[str] = (),
        turn_id: str = "",
        token_budget: int = 0,
        explain: bool = False,
        context_sufficient: bool = False,
        skip_rerank: bool = False,
        no_cache: bool = False,
        fail_open: bool = False,
        timeout: Optional[float] = None,
    ) -> RetrieveResult:
        """``RetrievalService.Retrieve``: the memories that matter for
        ``text`` (or, when ``text`` is empty, for the recent
        ``conversation``), each with its provenance. Every request field is
        a keyword argument of the same name. Retried on UNAVAILABLE."""
        op = _ops.retrieve(
            text, conversation=conversation, memory_types=memory_types,
            time_range=time_range, agent_scope=agent_scope, limit=limit,
            include_consolidated=include_consolidated,
            include_historical=include_historical, min_confidence=min_confidence,
            as_of_event=as_of_event, as_of_ingestion=as_of_ingestion, namespace=namespace,
            metadata_filter=metadata_filter, mode=mode, hypotheses=hypotheses,
            turn_id=turn_id, token_budget=token_budget, explain=explain,
            context_sufficient=context_sufficient, skip_rerank=skip_rerank,
            no_cache=no_cache, fail_open=fail_open,
        )
        return await self._run(op, timeout)

    async def feedback(
        self,
        query_id: str,
        items: Iterable[Union[FeedbackItem, Tuple[Any, ...], str]],
        *,
        timeout: Optional[float] = None,
    ) -> int:
        """Reports which of a retrieval's records were used / helpful /
        sufficient. Only the caller that got ``query_id`` may, and only on
        memories that answer returned. Returns how many items were
        accepted. Never retried."""
        return await self._run(_ops.feedback(query_id, items), timeout)

    # ------------------------------------------------------------ working memory

    async def remember_working(
        self,
        content: str,
        *,
        session_id: str,
        ttl_ms: Optional[int] = None,
        id: str = "",
        namespace: str = "",
        title: str = "",
        access_level: Union[AccessLevel, str, None] = None,
        source_confidence: Optional[float] = None,
        metadata: Optional[Dict[str, Any]] = None,
        source: str = "",
        embedding: Sequence[float] = (),
        timeout: Optional[float] = None,
    ) -> UpsertResult:
        """Writes a session note into the gateway's working memory (a
        ``memory_type="working"`` upsert with ``metadata.session_id`` and
        ``metadata.ttl_ms``). Kept in process memory, never in Postgres;
        private to this tenant and agent. Never retried."""
        m = _ops.working_memory_of(content, session_id, ttl_ms, dict(
            id=id, namespace=namespace, title=title, access_level=access_level,
            source_confidence=source_confidence, metadata=metadata, source=source,
            embedding=embedding,
        ))
        return await self._run(_ops.upsert_one(m), timeout)

    async def get_memory(
        self,
        query: str,
        *,
        session_id: str = "",
        min_confidence: Optional[float] = None,
        limit: Optional[int] = None,
        compact: bool = False,
        include_sources: bool = False,
        max_depth: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> WorkingMemoryResult:
        """``WorkingMemoryService.GetMemory``: the session's notes first,
        the memory graph (with causes, sources, open contradictions) when
        nothing in the session matches. Retried on UNAVAILABLE."""
        op = _ops.get_memory(
            query, session_id=session_id, min_confidence=min_confidence, limit=limit,
            compact=compact, include_sources=include_sources, max_depth=max_depth,
        )
        return await self._run(op, timeout)

    async def get_demand(
        self, limit: Optional[int] = None, *, timeout: Optional[float] = None
    ) -> DemandResult:
        """The tenant's most requested retrieval shapes."""
        return await self._run(_ops.get_demand(limit), timeout)

    # ------------------------------------------------------------ knowledge foundry

    async def retrieve_basic(
        self,
        kb_id: str,
        query: str,
        *,
        tenant_id: Optional[str] = None,
        top_k: Optional[int] = None,
        mode: str = "",
        filters: Optional[Dict[str, Any]] = None,
        similarity_threshold: Optional[float] = None,
        timeout: Optional[float] = None,
    ) -> FoundryResponse:
        """Knowledge Foundry basic retrieval in one knowledge base
        (namespace). ``tenant_id`` must be the API key's tenant; it defaults
        to the client's (argument or ``ENGRAM_TENANT``), else the key's own
        tenant as the gateway reports it."""
        op = _ops.retrieve_basic(
            kb_id, query, tenant_id=await self._tenant(tenant_id), top_k=top_k, mode=mode,
            filters=filters, similarity_threshold=similarity_threshold,
        )
        return await self._run(op, timeout)

    async def retrieve_agentic(
        self,
        query: str,
        *,
        tenant_id: Optional[str] = None,
        kb_ids: Sequence[str] = (),
        max_steps: Optional[int] = None,
        reasoning_effort: str = "",
        top_k_per_step: Optional[int] = None,
        token_budget: Optional[int] = None,
        max_latency_ms: Optional[int] = None,
        mode: str = "",
        filters: Optional[Dict[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> FoundryResponse:
        """Knowledge Foundry agentic retrieval (decompose, retrieve per
        step, pack a context). Its default deadline is the larger of the
        client's and ``max_latency_ms`` (30 s when unset) plus one second."""
        op = _ops.retrieve_agentic(
            query, tenant_id=await self._tenant(tenant_id), kb_ids=kb_ids, max_steps=max_steps,
            reasoning_effort=reasoning_effort, top_k_per_step=top_k_per_step,
            token_budget=token_budget, max_latency_ms=max_latency_ms, mode=mode,
            filters=filters,
        )
        if timeout is None:
            timeout = max(self.timeout, (max_latency_ms or 30_000) / 1000.0 + 1.0)
        return await self._run(op, timeout)
