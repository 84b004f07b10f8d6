"""One place that turns typed arguments into a request and a response into a
typed result, shared by the sync and the asyncio client (which differ only
in how they wait)."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

from ._pb import common_pb2, foundry_pb2, retrieval_pb2
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
    UNAVAILABLE) and how the response becomes the result."""

    service: str
    method: str
    request: Any
    read: bool
    convert: Callable[[Any], Any]


def _memory(m: Union[Memory, str]) -> common_pb2.Memory:
    if isinstance(m, str):
        m = Memory(content=m)
    if not isinstance(m, Memory):
        raise TypeError(f"expected Memory or str, got {type(m).__name__}")
    return m.to_proto()


def _ids(ids: Union[str, Iterable[str]]) -> List[str]:
    return [ids] if isinstance(ids, str) else list(ids)


def memory_of(
    content: str,
    *,
    id: str = "",
    namespace: str = "",
    memory_type: str = "",
    title: str = "",
    access_level: Union[AccessLevel, str, None] = None,
    source_confidence: Optional[float] = None,
    event_time: Optional[_dt.datetime] = None,
    valid_from: Optional[_dt.datetime] = None,
    valid_to: Optional[_dt.datetime] = None,
    supersedes: str = "",
    consolidated: bool = False,
    metadata: Optional[Dict[str, Any]] = None,
    source: str = "",
    entities: Sequence[str] = (),
    triples: Sequence[Triple] = (),
    embedding: Sequence[float] = (),
) -> Memory:
    return Memory(
        content=content,
        id=id,
        namespace=namespace,
        memory_type=memory_type,
        title=title,
        access_level=AccessLevel.coerce(access_level),
        source_confidence=source_confidence,
        event_time=event_time,
        valid_from=valid_from,
        valid_to=valid_to,
        supersedes=supersedes,
        consolidated=consolidated,
        metadata=dict(metadata or {}),
        source=source,
        entities=list(entities),
        triples=list(triples),
        embedding=list(embedding),
    )


def working_memory_of(
    content: str,
    session_id: str,
    ttl_ms: Optional[int],
    fields: Dict[str, Any],
) -> Memory:
    meta = dict(fields.pop("metadata", None) or {})
    meta["session_id"] = session_id
    if ttl_ms is not None:
        meta["ttl_ms"] = ttl_ms
    return memory_of(content, memory_type="working", metadata=meta, **fields)


def upsert(memories: Iterable[Union[Memory, str]]) -> Op:
    req = common_pb2.UpsertRequest(memories=[_memory(m) for m in memories])
    return Op(MEMORY, "Upsert", req, False,
              lambda r: [UpsertResult.from_proto(x) for x in r.results])


def upsert_one(memory: Memory) -> Op:
    op = upsert([memory])
    return Op(op.service, op.method, op.request, False,
              lambda r: UpsertResult.from_proto(r.results[0]))


def get(ids: Union[str, Iterable[str]]) -> Op:
    return Op(MEMORY, "Get", common_pb2.GetRequest(ids=_ids(ids)), True,
              lambda r: [Memory.from_proto(m) for m in r.memories])


def delete(ids: Union[str, Iterable[str]]) -> Op:
    return Op(MEMORY, "Delete", common_pb2.DeleteRequest(ids=_ids(ids)), False,
              lambda r: r.deleted)


def add_edges(edges: Iterable[Edge]) -> Op:
    req = common_pb2.AddEdgesRequest(edges=[e.to_proto() for e in edges])
    return Op(MEMORY, "AddEdges", req, False, lambda r: r.added)


def list_memories(
    *,
    page_size: Optional[int] = None,
    page_token: str = "",
    namespace: str = "",
    memory_types: Sequence[str] = (),
    time_range: Optional[TimeRange] = None,
    include_historical: bool = False,
    include_consolidated: bool = False,
    newest_first: bool = False,
) -> Op:
    req = common_pb2.ListMemoriesRequest(
        page_token=page_token, namespace=namespace, memory_types=list(memory_types),
        include_historical=include_historical, include_consolidated=include_consolidated,
        newest_first=newest_first,
    )
    if page_size is not None:
        req.page_size = page_size
    if time_range is not None:
        req.time_range.CopyFrom(time_range.to_proto())
    return Op(MEMORY, "ListMemories", req, True, MemoryPage.from_proto)


def retrieve(
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
    as_of_event: Optional[_dt.datetime] = None,
    as_of_ingestion: Optional[_dt.datetime] = None,
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
) -> Op:
    msgs = [
        m if isinstance(m, ConversationMessage) else ConversationMessage(**m)
        for m in conversation
    ]
    req = retrieval_pb2.RetrieveRequest(
        text=text,
        memory_types=list(memory_types),
        agent_scope=list(agent_scope),
        include_consolidated=include_consolidated,
        include_historical=include_historical,
        namespace=namespace,
        mode=RetrievalMode.coerce(mode).to_proto(),
        hypotheses=list(hypotheses),
        turn_id=turn_id,
        token_budget=token_budget,
        explain=explain,
        context_sufficient=context_sufficient,
        skip_rerank=skip_rerank,
        no_cache=no_cache,
        conversation=[m.to_proto() for m in msgs],
        fail_open=fail_open,
    )
    if time_range is not None:
        req.time_range.CopyFrom(time_range.to_proto())
    if limit is not None:
        req.limit = limit
    if min_confidence is not None:
        req.min_confidence = min_confidence
    if as_of_event is not None:
        req.as_of_event.CopyFrom(_ts_in(as_of_event))
    if as_of_ingestion is not None:
        req.as_of_ingestion.CopyFrom(_ts_in(as_of_ingestion))
    if metadata_filter is not None:
        req.metadata_filter.CopyFrom(_struct_in(metadata_filter))
    return Op(RETRIEVAL, "Retrieve", req, True, RetrieveResult.from_proto)


def feedback(query_id: str, items: Iterable[Any]) -> Op:
    req = retrieval_pb2.FeedbackRequest(
        query_id=query_id, items=[FeedbackItem.coerce(i).to_proto() for i in items]
    )
    # A write: never retried (the server counts what it accepts).
    return Op(RETRIEVAL, "Feedback", req, False, lambda r: r.accepted)


def get_memory(
    query: str,
    *,
    session_id: str = "",
    min_confidence: Optional[float] = None,
    limit: Optional[int] = None,
    compact: bool = False,
    include_sources: bool = False,
    max_depth: Optional[int] = None,
) -> Op:
    req = retrieval_pb2.GetMemoryRequest(
        query=query, session_id=session_id, compact=compact, include_sources=include_sources
    )
    if min_confidence is not None:
        req.min_confidence = min_confidence
    if limit is not None:
        req.limit = limit
    if max_depth is not None:
        req.max_depth = max_depth
    return Op(WORKING, "GetMemory", req, True, WorkingMemoryResult.from_proto)


def get_demand(limit: Optional[int] = None) -> Op:
    req = retrieval_pb2.GetDemandRequest()
    if limit is not None:
        req.limit = limit
    return Op(WORKING, "GetDemand", req, True, DemandResult.from_proto)


def retrieve_basic(
    kb_id: str,
    query: str,
    *,
    tenant_id: str,
    top_k: Optional[int] = None,
    mode: str = "",
    filters: Optional[Dict[str, Any]] = None,
    similarity_threshold: Optional[float] = None,
) -> Op:
    req = foundry_pb2.BasicRetrieveRequest(kb_id=kb_id, query=query, tenant_id=tenant_id,
                                           mode=mode)
    if top_k is not None:
        req.top_k = top_k
    if filters is not None:
        req.filters.CopyFrom(_struct_in(filters))
    if similarity_threshold is not None:
        req.similarity_threshold = similarity_threshold
    return Op(FOUNDRY, "RetrieveBasic", req, True, FoundryResponse.from_proto)


def retrieve_agentic(
    query: str,
    *,
    tenant_id: str,
    kb_ids: Sequence[str] = (),
    max_steps: Optional[int] = None,
    reasoning_effort: str = "",
    top_k_per_step: Optional[int] = None,
    token_budget: Optional[int] = None,
    max_latency_ms: Optional[int] = None,
    mode: str = "",
    filters: Optional[Dict[str, Any]] = None,
) -> Op:
    req = foundry_pb2.AgenticRetrieveRequest(
        query=query, tenant_id=tenant_id, kb_ids=list(kb_ids),
        reasoning_effort=reasoning_effort, mode=mode,
    )
    for name, value in (("max_steps", max_steps), ("top_k_per_step", top_k_per_step),
                        ("token_budget", token_budget), ("max_latency_ms", max_latency_ms)):
        if value is not None:
            setattr(req, name, value)
    if filters is not None:
        req.filters.CopyFrom(_struct_in(filters))
    return Op(FOUNDRY, "RetrieveAgentic", req, True, FoundryResponse.from_proto)
