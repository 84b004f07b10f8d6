"""What the framework integrations (langchain.py, llama_index.py) say about
one retrieved record: the same metadata in both, built from the typed
answer, so a document or node always carries where it came from."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from .types import RetrieveResult, ScoredMemory


def metadata(record: ScoredMemory, answer: RetrieveResult) -> Dict[str, Any]:
    """The record's provenance as plain JSON-able values: its id (for
    ``feedback``/``get``), score and rank, what kind of memory it is, when it
    happened, which strategies found it, its citation, and the answer's
    ``query_id`` and ``nothing_relevant`` flag."""
    m = record.memory
    p = record.provenance
    return {
        "id": m.id,
        "score": record.score,
        "rank": record.rank,
        "title": m.title,
        "namespace": m.namespace,
        "memory_type": m.memory_type,
        "event_time": m.event_time.isoformat() if m.event_time else None,
        "version": m.version,
        "strategies": [h.strategy for h in p.strategies],
        "citation": p.citation,
        "confidence": p.confidence,
        "query_id": answer.query_id,
        "nothing_relevant": answer.nothing_relevant,
    }


def retrieve_kwargs(
    limit: Optional[int],
    namespace: str,
    memory_types: Any,
    extra: Mapping[str, Any],
) -> Dict[str, Any]:
    """The keyword arguments of ``retrieve`` the integrations pass on."""
    kw: Dict[str, Any] = dict(extra)
    if limit is not None:
        kw["limit"] = limit
    if namespace:
        kw["namespace"] = namespace
    if memory_types:
        kw["memory_types"] = list(memory_types)
    return kw
