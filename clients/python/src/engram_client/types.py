"""Typed values of the engram public API, and their protobuf conversions.

Every result is a plain dataclass (no protobuf objects leak out), so results
compare with ``==``, print readably and pickle. Enums are ``str`` enums: pass
``RetrievalMode.VECTOR`` or just ``"vector"``.

Floats that travel as proto ``float`` (32-bit) come back rounded to single
precision: ``0.9`` is returned as ``0.8999999761581421``.
"""

from __future__ import annotations

import datetime as _dt
import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from ._pb import common_pb2, foundry_pb2, retrieval_pb2

__all__ = [
    "AccessLevel",
    "RetrievalMode",
    "QueryRoute",
    "SkipReason",
    "ConflictResolution",
    "FeedbackSignal",
    "MemoryOrigin",
    "Triple",
    "Memory",
    "TimeRange",
    "Edge",
    "UpsertResult",
    "MemoryPage",
    "ConversationMessage",
    "StrategyHit",
    "Provenance",
    "ScoredMemory",
    "ConflictPair",
    "StageLatency",
    "DroppedCandidate",
    "RetrieveResult",
    "FeedbackItem",
    "MemoryItem",
    "CausalLink",
    "SourceRef",
    "WorkingMemoryResult",
    "DemandShape",
    "DemandResult",
    "FoundryResult",
    "FoundryStep",
    "FoundryResponse",
]


# ---------------------------------------------------------------- enums


class _ProtoEnum(str, enum.Enum):
    """A str enum whose members map to ``<PREFIX>_<VALUE.upper()>`` in proto."""

    @classmethod
    def _prefix(cls) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def _pb(cls) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def coerce(cls, value: Union["_ProtoEnum", str, int, None]):
        """A member from a member, its value or name (any case, with or
        without the proto prefix), or its proto number. ``None`` = the
        zero member."""
        if value is None:
            return list(cls)[0]
        if isinstance(value, cls):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls.from_proto(value)
        if isinstance(value, str):
            v = value.strip().lower()
            p = cls._prefix().lower() + "_"
            if v.startswith(p):
                v = v[len(p):]
            for m in cls:
                if m.value == v:
                    return m
        allowed = ", ".join(m.value for m in cls)
        raise ValueError(f"{cls.__name__}: unknown value {value!r} (one of {allowed})")

    def to_proto(self) -> int:
        return self._pb().Value(f"{self._prefix()}_{self.value.upper()}")

    @classmethod
    def from_proto(cls, number: int):
        try:
            name = cls._pb().Name(number)
        except ValueError:
            # A newer server's value this client does not know.
            return list(cls)[0]
        return cls(name[len(cls._prefix()) + 1:].lower())


class AccessLevel(_ProtoEnum):
    """Trust levels, ordered. Unspecified on write means public."""

    UNSPECIFIED = "unspecified"
    PUBLIC = "public"
    INTERNAL = "internal"
    CONFIDENTIAL = "confidential"
    SENSITIVE = "sensitive"

    @classmethod
    def _prefix(cls):
        return "ACCESS_LEVEL"

    @classmethod
    def _pb(cls):
        return common_pb2.AccessLevel


class RetrievalMode(_ProtoEnum):
    """Overrides routing. VECTOR, KEYWORD, GRAPH and HYBRID return raw
    candidate lists (evaluation and debugging)."""

    AUTO = "auto"
    SIMPLE = "simple"
    MULTI_HOP = "multi_hop"
    EXPLORATORY = "exploratory"
    VECTOR = "vector"
    KEYWORD = "keyword"
    GRAPH = "graph"
    HYBRID = "hybrid"

    @classmethod
    def _prefix(cls):
        return "RETRIEVAL_MODE"

    @classmethod
    def _pb(cls):
        return retrieval_pb2.RetrievalMode


class QueryRoute(_ProtoEnum):
    UNSPECIFIED = "unspecified"
    SIMPLE = "simple"
    MULTI_HOP = "multi_hop"
    EXPLORATORY = "exploratory"
    SKIP = "skip"

    @classmethod
    def _prefix(cls):
        return "QUERY_ROUTE"

    @classmethod
    def _pb(cls):
        return retrieval_pb2.QueryRoute


class SkipReason(_ProtoEnum):
    NONE = "none"
    CACHE_HIT = "cache_hit"
    CONTEXT_SUFFICIENT = "context_sufficient"
    NO_RETRIEVAL_NEEDED = "no_retrieval_needed"

    @classmethod
    def _prefix(cls):
        return "SKIP_REASON"

    @classmethod
    def _pb(cls):
        return retrieval_pb2.SkipReason


class ConflictResolution(_ProtoEnum):
    UNSPECIFIED = "unspecified"
    RECENCY = "recency"
    CONFIDENCE = "confidence"
    UNRESOLVED = "unresolved"

    @classmethod
    def _prefix(cls):
        return "CONFLICT_RESOLUTION"

    @classmethod
    def _pb(cls):
        return retrieval_pb2.ConflictResolution


class FeedbackSignal(_ProtoEnum):
    UNSPECIFIED = "unspecified"
    USED = "used"
    HELPFUL = "helpful"
    SUFFICIENT = "sufficient"

    @classmethod
    def _prefix(cls):
        return "FEEDBACK_SIGNAL"

    @classmethod
    def _pb(cls):
        return retrieval_pb2.FeedbackSignal


class MemoryOrigin(_ProtoEnum):
    UNSPECIFIED = "unspecified"
    NONE = "none"
    WORKING = "working"
    GRAPH = "graph"

    @classmethod
    def _prefix(cls):
        return "MEMORY_ORIGIN"

    @classmethod
    def _pb(cls):
        return retrieval_pb2.MemoryOrigin


# ---------------------------------------------------------------- helpers

_UTC = _dt.timezone.utc


def _ts_in(value: Optional[_dt.datetime]) -> Optional[timestamp_pb2.Timestamp]:
    """A datetime as a Timestamp; naive datetimes are taken as UTC."""
    if value is None:
        return None
    if not isinstance(value, _dt.datetime):
        raise TypeError(f"expected datetime, got {type(value).__name__}")
    if value.tzinfo is None:
        value = value.replace(tzinfo=_UTC)
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def _ts_out(msg: Any, name: str) -> Optional[_dt.datetime]:
    if not msg.HasField(name):
        return None
    return getattr(msg, name).ToDatetime(tzinfo=_UTC)


def _struct_in(value: Optional[Dict[str, Any]]) -> Optional[struct_pb2.Struct]:
    if value is None:
        return None
    s = struct_pb2.Struct()
    s.update(value)
    return s


def _struct_out(msg: Any, name: str) -> Dict[str, Any]:
    if not msg.HasField(name):
        return {}
    return json_format.MessageToDict(getattr(msg, name))


def _opt(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


# ---------------------------------------------------------------- memories


@dataclass
class Triple:
    """An OpenIE-style fact: becomes entity nodes and an edge in the graph."""

    subject: str
    relation: str
    object: str

    def to_proto(self) -> common_pb2.Triple:
        return common_pb2.Triple(subject=self.subject, relation=self.relation, object=self.object)

    @classmethod
    def from_proto(cls, m: common_pb2.Triple) -> "Triple":
        return cls(subject=m.subject, relation=m.relation, object=m.object)


@dataclass
class Memory:
    """One memory. On write, output-only fields (agent_id, decay_score,
    ingestion_time, recorded_at, version, tenant_id) are ignored: identity
    comes from the API key, never from the body."""

    content: str = ""
    id: str = ""
    namespace: str = ""
    memory_type: str = ""
    title: str = ""
    access_level: AccessLevel = AccessLevel.UNSPECIFIED
    source_confidence: Optional[float] = None
    event_time: Optional[_dt.datetime] = None
    valid_from: Optional[_dt.datetime] = None
    valid_to: Optional[_dt.datetime] = None
    retracted_at: Optional[_dt.datetime] = None
    supersedes: str = ""
    consolidated: bool = False
    metadata: Dict[str, Any] = field(default_factory=dict)
    source: str = ""
    entities: List[str] = field(default_factory=list)
    triples: List[Triple] = field(default_factory=list)
    embedding: List[float] = field(default_factory=list)
    # Output only.
    agent_id: str = ""
    decay_score: float = 0.0
    ingestion_time: Optional[_dt.datetime] = None
    recorded_at: Optional[_dt.datetime] = None
    version: int = 0
    tenant_id: str = ""

    def to_proto(self) -> common_pb2.Memory:
        m = common_pb2.Memory(
            id=self.id,
            namespace=self.namespace,
            memory_type=self.memory_type,
            content=self.content,
            title=self.title,
            access_level=AccessLevel.coerce(self.access_level).to_proto(),
            supersedes=self.supersedes,
            consolidated=self.consolidated,
            source=self.source,
            entities=list(self.entities),
            triples=[t.to_proto() for t in self.triples],
            embedding=list(self.embedding),
        )
        if self.source_confidence is not None:
            m.source_confidence = self.source_confidence
        for name in ("event_time", "valid_from", "valid_to", "retracted_at"):
            ts = _ts_in(getattr(self, name))
            if ts is not None:
                getattr(m, name).CopyFrom(ts)
        if self.metadata:
            m.metadata.CopyFrom(_struct_in(self.metadata))
        return m

    @classmethod
    def from_proto(cls, m: common_pb2.Memory) -> "Memory":
        return cls(
            content=m.content,
            id=m.id,
            namespace=m.namespace,
            memory_type=m.memory_type,
            title=m.title,
            access_level=AccessLevel.from_proto(m.access_level),
            source_confidence=_opt(m, "source_confidence"),
            event_time=_ts_out(m, "event_time"),
            valid_from=_ts_out(m, "valid_from"),
            valid_to=_ts_out(m, "valid_to"),
            retracted_at=_ts_out(m, "retracted_at"),
            supersedes=m.supersedes,
            consolidated=m.consolidated,
            metadata=_struct_out(m, "metadata"),
            source=m.source,
            entities=list(m.entities),
            triples=[Triple.from_proto(t) for t in m.triples],
            embedding=list(m.embedding),
            agent_id=m.agent_id,
            decay_score=m.decay_score,
            ingestion_time=_ts_out(m, "ingestion_time"),
            recorded_at=_ts_out(m, "recorded_at"),
            version=m.version,
            tenant_id=m.tenant_id,
        )


@dataclass
class TimeRange:
    """On event_time: inclusive start, exclusive end; either may be open."""

    start: Optional[_dt.datetime] = None
    end: Optional[_dt.datetime] = None

    def to_proto(self) -> common_pb2.TimeRange:
        r = common_pb2.TimeRange()
        if self.start is not None:
            r.start.CopyFrom(_ts_in(self.start))
        if self.end is not None:
            r.end.CopyFrom(_ts_in(self.end))
        return r


@dataclass
class Edge:
    """A typed edge between two memories: related, contradicts, supersedes,
    causes, supports, part_of, ... Weight 0 means 1.0."""

    src_id: str
    dst_id: str
    edge_type: str = "related"
    weight: float = 0.0

    def to_proto(self) -> common_pb2.Edge:
        return common_pb2.Edge(
            src_id=self.src_id, dst_id=self.dst_id, edge_type=self.edge_type, weight=self.weight
        )


@dataclass
class UpsertResult:
    id: str
    version: int
    #: a new row was created (False: updated, or unchanged)
    created: bool
    #: the embedding was computed for this call
    embedded: bool

    @classmethod
    def from_proto(cls, m: common_pb2.UpsertResult) -> "UpsertResult":
        return cls(id=m.id, version=m.version, created=m.created, embedded=m.embedded)


@dataclass
class MemoryPage:
    """One page of ``list_memories``: pass ``next_page_token`` back for the
    next one (empty on the last page). ``tenant`` is the API key's tenant."""

    memories: List[Memory]
    next_page_token: str
    tenant: str

    @classmethod
    def from_proto(cls, r: Any) -> "MemoryPage":
        return cls(
            memories=[Memory.from_proto(m) for m in r.memories],
            next_page_token=r.next_page_token,
            tenant=r.tenant,
        )


# ---------------------------------------------------------------- retrieval


@dataclass
class ConversationMessage:
    """role: user | assistant | system | tool. A summary_marker message
    stands for everything before it."""

    role: str
    content: str
    summary_marker: bool = False

    def to_proto(self) -> retrieval_pb2.ConversationMessage:
        return retrieval_pb2.ConversationMessage(
            role=self.role, content=self.content, summary_marker=self.summary_marker
        )


@dataclass
class StrategyHit:
    #: vector | keyword | graph
    strategy: str
    #: 1-based rank in that strategy's list
    rank: int
    score: float


@dataclass
class Provenance:
    """Where a record came from and why it was chosen."""

    strategies: List[StrategyHit]
    rrf_score: float
    checks_passed: List[str]
    confidence: float
    citation: str
    #: cross-encoder probability; None when that check did not run
    relevance: Optional[float]
    temporal_score: float
    #: entities that led the graph strategy here
    via_entities: List[str]

    @classmethod
    def from_proto(cls, p: retrieval_pb2.Provenance) -> "Provenance":
        return cls(
            strategies=[StrategyHit(s.strategy, s.rank, s.score) for s in p.strategies],
            rrf_score=p.rrf_score,
            checks_passed=list(p.checks_passed),
            confidence=p.confidence,
            citation=p.citation,
            relevance=_opt(p, "relevance"),
            temporal_score=p.temporal_score,
            via_entities=list(p.via_entities),
        )


@dataclass
class ScoredMemory:
    memory: Memory
    score: float
    provenance: Provenance
    #: 1-based position in the answer
    rank: int

    @property
    def id(self) -> str:
        return self.memory.id

    @property
    def content(self) -> str:
        return self.memory.content


@dataclass
class ConflictPair:
    memory_a: str
    memory_b: str
    resolution: ConflictResolution
    #: empty when unresolved
    winner_id: str
    edge_type: str

    @classmethod
    def from_proto(cls, c: retrieval_pb2.ConflictPair) -> "ConflictPair":
        return cls(
            memory_a=c.memory_a,
            memory_b=c.memory_b,
            resolution=ConflictResolution.from_proto(c.resolution),
            winner_id=c.winner_id,
            edge_type=c.edge_type,
        )


@dataclass
class StageLatency:
    stage: str
    ms: float


@dataclass
class DroppedCandidate:
    memory_id: str
    stage: str
    reason: str


@dataclass
class RetrieveResult:
    records: List[ScoredMemory]
    route: QueryRoute
    total_candidates: int
    retrieval_confidence: float
    conflicts: List[ConflictPair]
    retry_count: int
    skip_reason: SkipReason
    latency_ms: float
    stage_latencies: List[StageLatency]
    #: stages that ran degraded (a dead or slow component): the answer is partial
    degraded_stages: List[str]
    #: pass to feedback()
    query_id: str
    #: with token_budget > 0: the records packed into a prompt-ready block
    context_block: str
    context_tokens: int
    #: only with explain=True
    dropped: List[DroppedCandidate]
    #: the records hold nothing relevant: the tenant likely has no memory of it
    nothing_relevant: bool
    evidence_score: float

    @property
    def ids(self) -> List[str]:
        return [r.memory.id for r in self.records]

    @classmethod
    def from_proto(cls, r: retrieval_pb2.RetrieveResponse) -> "RetrieveResult":
        return cls(
            records=[
                ScoredMemory(
                    memory=Memory.from_proto(s.memory),
                    score=s.score,
                    provenance=Provenance.from_proto(s.provenance),
                    rank=s.rank,
                )
                for s in r.records
            ],
            route=QueryRoute.from_proto(r.route),
            total_candidates=r.total_candidates,
            retrieval_confidence=r.retrieval_confidence,
            conflicts=[ConflictPair.from_proto(c) for c in r.conflicts],
            retry_count=r.retry_count,
            skip_reason=SkipReason.from_proto(r.skip_reason),
            latency_ms=r.latency_ms,
            stage_latencies=[StageLatency(s.stage, s.ms) for s in r.stage_latencies],
            degraded_stages=list(r.degraded_stages),
            query_id=r.query_id,
            context_block=r.context_block,
            context_tokens=r.context_tokens,
            dropped=[DroppedCandidate(d.memory_id, d.stage, d.reason) for d in r.dropped],
            nothing_relevant=r.nothing_relevant,
            evidence_score=r.evidence_score,
        )


@dataclass
class FeedbackItem:
    """value=True: the memory was used / helpful / sufficient; False: not."""

    memory_id: str
    signal: FeedbackSignal = FeedbackSignal.USED
    value: bool = True

    def to_proto(self) -> retrieval_pb2.FeedbackItem:
        return retrieval_pb2.FeedbackItem(
            memory_id=self.memory_id,
            signal=FeedbackSignal.coerce(self.signal).to_proto(),
            value=self.value,
        )

    @classmethod
    def coerce(
        cls, item: Union["FeedbackItem", Tuple[Any, ...], str]
    ) -> "FeedbackItem":
        """A FeedbackItem, a memory id (USED, True), or a tuple
        ``(memory_id, signal[, value])``."""
        if isinstance(item, cls):
            return item
        if isinstance(item, str):
            return cls(item)
        if isinstance(item, tuple) and 1 <= len(item) <= 3:
            return cls(*item)
        raise TypeError(f"not a feedback item: {item!r}")


# ---------------------------------------------------------------- working memory


@dataclass
class MemoryItem:
    id: str
    content: str
    memory_type: str
    confidence: float
    score: float
    #: working fragments only
    session_id: str
    written_at: Optional[_dt.datetime]
    #: working fragments only
    expires_at: Optional[_dt.datetime]
    text_match: float
    similarity: Optional[float]

    @classmethod
    def from_proto(cls, m: retrieval_pb2.MemoryItem) -> "MemoryItem":
        return cls(
            id=m.id,
            content=m.content,
            memory_type=m.memory_type,
            confidence=m.confidence,
            score=m.score,
            session_id=m.session_id,
            written_at=_ts_out(m, "written_at"),
            expires_at=_ts_out(m, "expires_at"),
            text_match=m.text_match,
            similarity=_opt(m, "similarity"),
        )


@dataclass
class CausalLink:
    memory_id: str
    #: causes | supports
    edge_type: str
    depth: int
    content: str
    confidence: float


@dataclass
class SourceRef:
    memory_id: str
    citation: str
    #: working | vector | keyword | graph | causes | supports
    found_by: List[str]
    namespace: str
    session_id: str


@dataclass
class WorkingMemoryResult:
    origin: MemoryOrigin
    items: List[MemoryItem]
    causal_chain: List[CausalLink]
    sources: List[SourceRef]
    contradictions: List[ConflictPair]
    working_candidates: int
    degraded_stages: List[str]
    latency_ms: float
    query_id: str

    @classmethod
    def from_proto(cls, r: retrieval_pb2.GetMemoryResponse) -> "WorkingMemoryResult":
        return cls(
            origin=MemoryOrigin.from_proto(r.origin),
            items=[MemoryItem.from_proto(i) for i in r.items],
            causal_chain=[
                CausalLink(c.memory_id, c.edge_type, c.depth, c.content, c.confidence)
                for c in r.causal_chain
            ],
            sources=[
                SourceRef(s.memory_id, s.citation, list(s.found_by), s.namespace, s.session_id)
                for s in r.sources
            ],
            contradictions=[ConflictPair.from_proto(c) for c in r.contradictions],
            working_candidates=r.working_candidates,
            degraded_stages=list(r.degraded_stages),
            latency_ms=r.latency_ms,
            query_id=r.query_id,
        )


@dataclass
class DemandShape:
    shape: str
    requested: List[str]
    observed_types: List[str]
    count: int
    concept_candidate: bool


@dataclass
class DemandResult:
    shapes: List[DemandShape]
    observations: int
    concept_candidates: int
    threshold: int

    @classmethod
    def from_proto(cls, r: retrieval_pb2.GetDemandResponse) -> "DemandResult":
        return cls(
            shapes=[
                DemandShape(s.shape, list(s.requested), list(s.observed_types), s.count,
                            s.concept_candidate)
                for s in r.shapes
            ],
            observations=r.observations,
            concept_candidates=r.concept_candidates,
            threshold=r.threshold,
        )


# ---------------------------------------------------------------- knowledge foundry


@dataclass
class FoundryResult:
    #: the memory id
    chunk_id: str
    #: metadata.document_id, else the memory's source, else its id
    document_id: str
    text: str
    score: float
    metadata: Dict[str, Any]


@dataclass
class FoundryStep:
    step_number: int
    #: decompose | retrieve | synthesize
    action: str
    input: str
    result_count: int
    tokens: int
    latency_ms: float
    detail: str


@dataclass
class FoundryResponse:
    request_id: str
    answer: str
    results: List[FoundryResult]
    steps: List[FoundryStep]
    total_tokens_used: int
    total_latency_ms: float
    truncated: bool
    #: budget | latency | max_steps; empty when not truncated
    truncated_reason: str
    #: agentic only: results packed with [Source N] markers
    context: str

    @classmethod
    def from_proto(cls, r: foundry_pb2.FoundryResponse) -> "FoundryResponse":
        return cls(
            request_id=r.request_id,
            answer=r.answer,
            results=[
                FoundryResult(x.chunk_id, x.document_id, x.text, x.score,
                              _struct_out(x, "metadata"))
                for x in r.results
            ],
            steps=[
                FoundryStep(s.step_number, s.action, s.input, s.result_count, s.tokens,
                            s.latency_ms, s.detail)
                for s in r.steps
            ],
            total_tokens_used=r.total_tokens_used,
            total_latency_ms=r.total_latency_ms,
            truncated=r.truncated,
            truncated_reason=r.truncated_reason,
            context=r.context,
        )

