"""The typed methods, written once for the sync and the asyncio client.

Each method turns its arguments into one :class:`Op` (the RPC, its request,
whether it may be retried, and how the response becomes the typed result)
and hands it to ``self._run(op, timeout)``. :class:`~engram_client.Engram`'s
``_run`` returns the result; :class:`~engram_client.AsyncEngram`'s is a
coroutine, and that client exposes each method as a coroutine function
(:func:`coroutine_methods`). The clients differ only in how they wait.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ._pb import common_pb2, foundry_pb2, retrieval_pb2
from .types import (
    AccessLevel,
    ConflictDecision,
    ConflictPage,
    ConversationMessage,
    DetectedConflict,
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
    _struct_in,
    _ts_in,
)

#: Service of each RPC on the gateway.
RETRIEVAL = "retrieval"
MEMORY = "memory"
WORKING = "working"
FOUNDRY = "foundry"


@dataclass(frozen=True)
class Op:
    """One RPC: ``stub.method(request)``, whether it is a read (retried on
    UNAVAILABLE) and how the response becomes the result.

    A Knowledge Foundry call is sent as the key's tenant: until the client
    knows it, ``request`` is a function of the tenant and ``tenant`` is the
    caller's ``tenant_id=`` (None: the client's own)."""

    service: str
    method: str
    request: Any
    read: bool
    convert: Callable[[Any], Any]
    needs_tenant: bool = False
    tenant: Optional[str] = None

    def with_tenant(self, tenant: str) -> "Op":
        return replace(self, request=self.request(tenant), needs_tenant=False, tenant=tenant)


def _memory(m: Union[Memory, str]) -> common_pb2.Memory:
    if isinstance(m, str):
        m = Memory(content=m)
    if not isinstance(m, Memory):
        raise TypeError(f"expected Memory or str, got {type(m).__name__}")
    return m.to_proto()


def _ids(ids: Union[str, Iterable[str]]) -> List[str]:
    return [ids] if isinstance(ids, str) else list(ids)


def _set_present(msg: Any, **fields: Any) -> None:
    """Sets the optional scalar fields that were given (not None)."""
    for name, value in fields.items():
        if value is not None:
            setattr(msg, name, value)


def _copy_present(msg: Any, **fields: Any) -> None:
    """Sets the message fields that were given (not None)."""
    for name, value in fields.items():
        if value is not None:
            getattr(msg, name).CopyFrom(value)


def _upsert_one(memory: Memory) -> Op:
    req = common_pb2.UpsertRequest(memories=[memory.to_proto()])
    return Op(MEMORY, "Upsert", req, False, lambda r: UpsertResult.from_proto(r.results[0]))


def _reviewed(r: Any) -> Optional[DetectedConflict]:
    """The pair after a confirm; None after a reject (no ``conflict``)."""
    return DetectedConflict.from_proto(r.conflict) if r.HasField("conflict") else None


def tenant_lookup() -> Op:
    """The key's own tenant, from a one-item ListMemories page."""
    req = common_pb2.ListMemoriesRequest(page_size=1)
    return Op(MEMORY, "ListMemories", req, True, lambda r: r.tenant)


class Calls:
    """The public methods of both clients; see :class:`Op`."""

    _run: Callable[[Op, Optional[float]], Any]
    timeout: float

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
        m = Memory(
            content=content, id=id, namespace=namespace, memory_type=memory_type, title=title,
            access_level=AccessLevel.coerce(access_level), source_confidence=source_confidence,
            event_time=event_time, valid_from=valid_from, valid_to=valid_to,
            supersedes=supersedes, consolidated=consolidated, metadata=dict(metadata or {}),
            source=source, entities=list(entities), triples=list(triples),
            embedding=list(embedding),
        )
        return self._run(_upsert_one(m), timeout)

    def upsert(
        self, memories: Iterable[Union[Memory, str]], *, timeout: Optional[float] = None
    ) -> List[UpsertResult]:
        """Writes a batch (1..1000) of memories; results in request order.
        Never retried."""
        req = common_pb2.UpsertRequest(memories=[_memory(m) for m in memories])
        return self._run(Op(MEMORY, "Upsert", req, False,
                            lambda r: [UpsertResult.from_proto(x) for x in r.results]), timeout)

    def get(
        self, ids: Union[str, Iterable[str]], *, timeout: Optional[float] = None
    ) -> List[Memory]:
        """The caller's memories with these ids (unknown or unreadable ids
        are left out). Embeddings are never returned."""
        return self._run(Op(MEMORY, "Get", common_pb2.GetRequest(ids=_ids(ids)), True,
                            lambda r: [Memory.from_proto(m) for m in r.memories]), timeout)

    def delete(self, ids: Union[str, Iterable[str]], *, timeout: Optional[float] = None) -> int:
        """Deletes memories (and working notes) by id; returns how many."""
        return self._run(Op(MEMORY, "Delete", common_pb2.DeleteRequest(ids=_ids(ids)), False,
                            lambda r: r.deleted), timeout)

    def add_edges(self, edges: Iterable[Edge], *, timeout: Optional[float] = None) -> int:
        """Adds typed edges between memories (related, contradicts,
        supersedes, causes, supports, part_of, ...); returns how many."""
        req = common_pb2.AddEdgesRequest(edges=[e.to_proto() for e in edges])
        return self._run(Op(MEMORY, "AddEdges", req, False, lambda r: r.added), timeout)

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
        req = common_pb2.ListMemoriesRequest(
            page_token=page_token, namespace=namespace, memory_types=list(memory_types),
            include_historical=include_historical, include_consolidated=include_consolidated,
            newest_first=newest_first,
        )
        _set_present(req, page_size=page_size)
        _copy_present(req, time_range=time_range and time_range.to_proto())
        return self._run(Op(MEMORY, "ListMemories", req, True, MemoryPage.from_proto), timeout)

    def list_conflicts(
        self,
        *,
        page_size: Optional[int] = None,
        page_token: str = "",
        namespace: str = "",
        include_confirmed: bool = False,
        timeout: Optional[float] = None,
    ) -> ConflictPage:
        """One page (1..200, default 50) of the updates engram detected at
        write time (``search.update_detection``), newest first
        (``MemoryService.ListConflicts``): only pairs whose both memories
        the key may read, only those awaiting review unless
        ``include_confirmed``; ``namespace`` is the newer memory's. Pass
        ``next_page_token`` back as ``page_token`` for the next page.
        Retried on UNAVAILABLE."""
        req = common_pb2.ListConflictsRequest(
            page_token=page_token, namespace=namespace, include_confirmed=include_confirmed
        )
        _set_present(req, page_size=page_size)
        return self._run(Op(MEMORY, "ListConflicts", req, True, ConflictPage.from_proto),
                         timeout)

    def review_conflict(
        self,
        new_id: str,
        old_id: str,
        decision: Union[ConflictDecision, str],
        *,
        timeout: Optional[float] = None,
    ) -> Optional[DetectedConflict]:
        """Settles a detected pair (``MemoryService.ReviewConflict``):
        ``"confirm"`` keeps the edge, marks it confirmed and closes the old
        memory at the new one's event time (it stays as history) and
        returns the pair; ``"reject"`` removes the edge, undoes an
        auto-supersede it caused, remembers the pair so it is never flagged
        again, and returns None. A pair the key cannot see raises
        NotFound. Never retried."""
        req = common_pb2.ReviewConflictRequest(
            new_id=new_id, old_id=old_id, decision=ConflictDecision.coerce(decision).to_proto()
        )
        return self._run(Op(MEMORY, "ReviewConflict", req, False, _reviewed), timeout)

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
        msgs = [
            m if isinstance(m, ConversationMessage) else ConversationMessage(**m)
            for m in conversation
        ]
        req = retrieval_pb2.RetrieveRequest(
            text=text, memory_types=list(memory_types), agent_scope=list(agent_scope),
            include_consolidated=include_consolidated, include_historical=include_historical,
            namespace=namespace, mode=RetrievalMode.coerce(mode).to_proto(),
            hypotheses=list(hypotheses), turn_id=turn_id, token_budget=token_budget,
            explain=explain, context_sufficient=context_sufficient, skip_rerank=skip_rerank,
            no_cache=no_cache, conversation=[m.to_proto() for m in msgs], fail_open=fail_open,
        )
        _set_present(req, limit=limit, min_confidence=min_confidence)
        _copy_present(
            req, time_range=time_range and time_range.to_proto(),
            as_of_event=_ts_in(as_of_event), as_of_ingestion=_ts_in(as_of_ingestion),
            metadata_filter=_struct_in(metadata_filter),
        )
        return self._run(Op(RETRIEVAL, "Retrieve", req, True, RetrieveResult.from_proto), timeout)

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
        req = retrieval_pb2.FeedbackRequest(
            query_id=query_id, items=[FeedbackItem.coerce(i).to_proto() for i in items]
        )
        # A write: never retried (the server counts what it accepts).
        return self._run(Op(RETRIEVAL, "Feedback", req, False, lambda r: r.accepted), timeout)

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
        meta = dict(metadata or {})
        meta["session_id"] = session_id
        if ttl_ms is not None:
            meta["ttl_ms"] = ttl_ms
        m = Memory(
            content=content, id=id, namespace=namespace, memory_type="working", title=title,
            access_level=AccessLevel.coerce(access_level), source_confidence=source_confidence,
            metadata=meta, source=source, embedding=list(embedding),
        )
        return self._run(_upsert_one(m), timeout)

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
        req = retrieval_pb2.GetMemoryRequest(
            query=query, session_id=session_id, compact=compact, include_sources=include_sources
        )
        _set_present(req, min_confidence=min_confidence, limit=limit, max_depth=max_depth)
        return self._run(Op(WORKING, "GetMemory", req, True, WorkingMemoryResult.from_proto),
                         timeout)

    def get_demand(
        self, limit: Optional[int] = None, *, timeout: Optional[float] = None
    ) -> DemandResult:
        """The tenant's most requested retrieval shapes."""
        req = retrieval_pb2.GetDemandRequest()
        _set_present(req, limit=limit)
        return self._run(Op(WORKING, "GetDemand", req, True, DemandResult.from_proto), timeout)

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

        def request(tenant: str) -> foundry_pb2.BasicRetrieveRequest:
            req = foundry_pb2.BasicRetrieveRequest(kb_id=kb_id, query=query, tenant_id=tenant,
                                                   mode=mode)
            _set_present(req, top_k=top_k, similarity_threshold=similarity_threshold)
            _copy_present(req, filters=_struct_in(filters))
            return req

        return self._run(Op(FOUNDRY, "RetrieveBasic", request, True, FoundryResponse.from_proto,
                            needs_tenant=True, tenant=tenant_id), timeout)

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

        def request(tenant: str) -> foundry_pb2.AgenticRetrieveRequest:
            req = foundry_pb2.AgenticRetrieveRequest(
                query=query, tenant_id=tenant, kb_ids=list(kb_ids),
                reasoning_effort=reasoning_effort, mode=mode,
            )
            _set_present(req, max_steps=max_steps, top_k_per_step=top_k_per_step,
                         token_budget=token_budget, max_latency_ms=max_latency_ms)
            _copy_present(req, filters=_struct_in(filters))
            return req

        if timeout is None:
            timeout = max(self.timeout, (max_latency_ms or 30_000) / 1000.0 + 1.0)
        return self._run(Op(FOUNDRY, "RetrieveAgentic", request, True,
                            FoundryResponse.from_proto, needs_tenant=True, tenant=tenant_id),
                         timeout)


def coroutine_methods(cls: type) -> type:
    """Class decorator: every public method of :class:`Calls` on ``cls`` as
    a coroutine function with the same signature and docstring (it awaits
    what ``cls._run`` returns)."""
    for name, method in vars(Calls).items():
        if name.startswith("_") or not callable(method):
            continue

        def make(method: Callable[..., Any], name: str) -> Callable[..., Any]:
            @functools.wraps(method)
            async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
                return await method(self, *args, **kwargs)

            call.__qualname__ = f"{cls.__name__}.{name}"
            return call

        setattr(cls, name, make(method, name))
    return cls
