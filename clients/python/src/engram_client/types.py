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
import re
from dataclasses import dataclass, field, fields
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
    "ConflictDecision",
    "Triple",
    "Memory",
    "TimeRange",
    "Edge",
    "UpsertResult",
    "MemoryPage",
    "DetectedConflict",
    "ConflictPage",
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
    def _prefix(cls) -> str:
        """``AccessLevel`` -> ``ACCESS_LEVEL``."""
        return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).upper()

    @classmethod
    def _pb(cls) -> Any:
        """The proto enum of the same name."""
        return getattr(retrieval_pb2, cls.__name__, None) or getattr(common_pb2, cls.__name__)

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


class QueryRoute(_ProtoEnum):
    UNSPECIFIED = "unspecified"
    SIMPLE = "simple"
    MULTI_HOP = "multi_hop"
    EXPLORATORY = "exploratory"
    SKIP = "skip"


class SkipReason(_ProtoEnum):
    NONE = "none"
    CACHE_HIT = "cache_hit"
    CONTEXT_SUFFICIENT = "context_sufficient"
    NO_RETRIEVAL_NEEDED = "no_retrieval_needed"


class ConflictResolution(_ProtoEnum):
    UNSPECIFIED = "unspecified"
    RECENCY = "recency"
    CONFIDENCE = "confidence"
    UNRESOLVED = "unresolved"


class FeedbackSignal(_ProtoEnum):
    UNSPECIFIED = "unspecified"
    USED = "used"
    HELPFUL = "helpful"
    SUFFICIENT = "sufficient"


class MemoryOrigin(_ProtoEnum):
    UNSPECIFIED = "unspecified"
    NONE = "none"
    WORKING = "working"
    GRAPH = "graph"


class ConflictDecision(_ProtoEnum):
    """How ``review_conflict`` settles a detected pair. CONFIRM: the newer
    memory does replace the older one (the edge stays, marked confirmed,
    and the old memory's validity ends at the new one's event time).
    REJECT: not an update (the edge is removed, an auto-supersede it caused
    is undone, and the pair is never flagged again)."""

    CONFIRM = "confirm"
    REJECT = "reject"

    @classmethod
    def coerce(cls, value: Union["_ProtoEnum", str, int, None]):
        """As for the other enums, but there is no default: None (or the
        proto's UNSPECIFIED) is refused."""
        if value is None or (isinstance(value, int) and not isinstance(value, bool)
                             and value not in [m.to_proto() for m in cls]):
            raise ValueError(f"{cls.__name__}: a decision is required (one of confirm, reject),"
                             f" got {value!r}")
        return super().coerce(value)


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


def _from(cls: Any, msg: Any, **special: Any) -> Any:
    """``cls`` from ``msg``: each dataclass field from the proto field of
    the same name (repeated ones as lists), unless ``special`` gives it."""
    values = {}
    for f in fields(cls):
        if f.name in special:
            values[f.name] = special[f.name]
            continue
        v = getattr(msg, f.name)
        values[f.name] = v if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") else list(v)
    return cls(**values)


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
        return _from(cls, m)


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
        times = ("event_time", "valid_from", "valid_to", "retracted_at", "ingestion_time",
                 "recorded_at")
        return _from(
            cls, m, **{t: _ts_out(m, t) for t in times},
            access_level=AccessLevel.from_proto(m.access_level),
            source_confidence=_opt(m, "source_confidence"),
            metadata=_struct_out(m, "metadata"),
            triples=[Triple.from_proto(t) for t in m.triples],
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
        return _from(cls, m)


@dataclass
class MemoryPage:
    """One page of ``list_memories``: pass ``next_page_token`` back for the
    next one (empty on the last page). ``tenant`` is the API key's tenant."""

    memories: List[Memory]
    next_page_token: str
    tenant: str

    @classmethod
    def from_proto(cls, r: Any) -> "MemoryPage":
        return _from(cls, r, memories=[Memory.from_proto(m) for m in r.memories])


@dataclass
class DetectedConflict:
    """A pair the write-time update detector flagged (a system-detected
    ``contradicts`` edge): ``new_id`` is the newer memory, ``old_id`` the one
    it appears to update. Listed by ``list_conflicts``, settled by
    ``review_conflict``."""

    new_id: str
    old_id: str
    #: the detector's probability that this is an update, 0..1
    score: float
    #: what changed, e.g. ``update detected (score 0.91): "berlin" -> "amsterdam"``
    reason: str
    #: the two memories' text, cut to 200 characters
    new_content: str
    old_content: str
    new_event_time: Optional[_dt.datetime]
    old_event_time: Optional[_dt.datetime]
    detected_at: Optional[_dt.datetime]
    #: set once a reviewer confirmed the pair
    confirmed_at: Optional[_dt.datetime]
    #: the old memory's validity was closed (auto-supersede or a confirm)
    old_closed: bool

    @classmethod
    def from_proto(cls, c: common_pb2.DetectedConflict) -> "DetectedConflict":
        times = ("new_event_time", "old_event_time", "detected_at", "confirmed_at")
        return _from(cls, c, **{t: _ts_out(c, t) for t in times})


@dataclass
class ConflictPage:
    """One page of ``list_conflicts``, newest detection first: pass
    ``next_page_token`` back for the next one (empty on the last page)."""

    conflicts: List[DetectedConflict]
    next_page_token: str

    @classmethod
    def from_proto(cls, r: Any) -> "ConflictPage":
        return _from(cls, r, conflicts=[DetectedConflict.from_proto(c) for c in r.conflicts])


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
        return _from(cls, p, strategies=[_from(StrategyHit, s) for s in p.strategies],
                     relevance=_opt(p, "relevance"))


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
    #: "contradicts" (a graph edge) or "same_slot" (two versions of one fact)
    edge_type: str
    #: why the two conflict: for "same_slot", the values that differ
    reason: str = ""
    #: how sure it is that the newer replaces the older (0..1; 0 unscored)
    score: float = 0.0

    @classmethod
    def from_proto(cls, c: retrieval_pb2.ConflictPair) -> "ConflictPair":
        return _from(cls, c, resolution=ConflictResolution.from_proto(c.resolution))


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
        return _from(
            cls, r,
            records=[
                _from(ScoredMemory, s, memory=Memory.from_proto(s.memory),
                      provenance=Provenance.from_proto(s.provenance))
                for s in r.records
            ],
            route=QueryRoute.from_proto(r.route),
            conflicts=[ConflictPair.from_proto(c) for c in r.conflicts],
            skip_reason=SkipReason.from_proto(r.skip_reason),
            stage_latencies=[_from(StageLatency, s) for s in r.stage_latencies],
            dropped=[_from(DroppedCandidate, d) for d in r.dropped],
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
        return _from(cls, m, written_at=_ts_out(m, "written_at"),
                     expires_at=_ts_out(m, "expires_at"), similarity=_opt(m, "similarity"))


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
        return _from(
            cls, r,
            origin=MemoryOrigin.from_proto(r.origin),
            items=[MemoryItem.from_proto(i) for i in r.items],
            causal_chain=[_from(CausalLink, c) for c in r.causal_chain],
            sources=[_from(SourceRef, s) for s in r.sources],
            contradictions=[ConflictPair.from_proto(c) for c in r.contradictions],
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
        return _from(cls, r, shapes=[_from(DemandShape, s) for s in r.shapes])


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
        return _from(
            cls, r,
            results=[_from(FoundryResult, x, metadata=_struct_out(x, "metadata"))
                     for x in r.results],
            steps=[_from(FoundryStep, s) for s in r.steps],
        )

