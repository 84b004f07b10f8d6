"""WorkingMemoryService and KnowledgeFoundryService through the sync client."""

import uuid

import pytest

from conftest import word
from engram_client import (
    DemandResult,
    Edge,
    FoundryResponse,
    MemoryOrigin,
    PermissionDenied,
    WorkingMemoryResult,
)


def test_working_memory_first(engram):
    w = word()
    session = f"s-{w}"
    note = engram.remember_working(f"The user is debugging the {w} parser right now.",
                                   session_id=session, ttl_ms=60_000, source_confidence=0.8)
    assert note.id and note.version == 1
    got = engram.get_memory(f"{w} parser", session_id=session, limit=5, include_sources=True,
                            min_confidence=0.1, max_depth=2)
    assert isinstance(got, WorkingMemoryResult)
    assert got.origin is MemoryOrigin.WORKING
    (item,) = [i for i in got.items if i.id == note.id]
    assert item.session_id == session and item.memory_type == "working"
    assert item.confidence == pytest.approx(0.8)
    assert item.expires_at is not None and item.written_at is not None
    assert any(s.memory_id == note.id and "working" in s.found_by for s in got.sources)
    assert got.working_candidates >= 1 and got.query_id
    # Another session sees nothing of it: the graph answers instead.
    other = engram.get_memory(f"{w} parser", session_id=f"other-{w}", compact=True)
    assert note.id not in [i.id for i in other.items]
    assert other.origin in (MemoryOrigin.GRAPH, MemoryOrigin.NONE)
    # Delete removes working notes too.
    assert engram.delete([note.id]) == 1


def test_get_memory_falls_back_to_the_graph(engram):
    w = word()
    cause = engram.remember(f"The {w} cache was cold.")
    claim = engram.remember(f"The {w} service was slow on Monday.")
    engram.add_edges([Edge(cause.id, claim.id, "causes")])
    got = engram.get_memory(f"Why was the {w} service slow?", include_sources=True)
    assert got.origin is MemoryOrigin.GRAPH
    assert claim.id in [i.id for i in got.items]
    assert all(link.edge_type in ("causes", "supports") for link in got.causal_chain)


def test_get_demand(engram):
    engram.retrieve(f"demand probe {word()}")
    d = engram.get_demand(limit=10)
    assert isinstance(d, DemandResult)
    assert d.observations >= 1 and d.threshold >= 1
    assert len(d.shapes) <= 10
    assert engram.get_demand().observations >= d.observations


def test_foundry_basic_and_agentic(engram, tenant):
    w = word()
    kb = str(uuid.uuid4())
    r = engram.remember(f"The {w} warranty lasts two years.", namespace=kb,
                        metadata={"document_id": f"doc-{w}"})
    basic = engram.retrieve_basic(kb, f"{w} warranty", mode="keyword", top_k=5,
                                  filters={"document_id": f"doc-{w}"})
    assert isinstance(basic, FoundryResponse)
    (hit,) = [x for x in basic.results if x.chunk_id == r.id]
    assert hit.document_id == f"doc-{w}" and w in hit.text
    assert hit.metadata == {"document_id": f"doc-{w}"}
    assert basic.steps and basic.steps[0].action == "retrieve" and basic.request_id
    vec = engram.retrieve_basic(kb, f"How long does the {w} warranty last?",
                                similarity_threshold=0.0, tenant_id=tenant)
    assert r.id in [x.chunk_id for x in vec.results]

    agentic = engram.retrieve_agentic(f"How long is the {w} warranty?", kb_ids=[kb],
                                      max_steps=2, reasoning_effort="low", top_k_per_step=3,
                                      token_budget=1000, max_latency_ms=5000, mode="hybrid")
    assert r.id in [x.chunk_id for x in agentic.results]
    assert any(s.action == "retrieve" for s in agentic.steps)
    assert agentic.context and agentic.total_tokens_used > 0


def test_foundry_refuses_another_tenant(engram):
    with pytest.raises(PermissionDenied):
        engram.retrieve_basic(str(uuid.uuid4()), "anything", tenant_id="someone-else")


def test_foundry_learns_the_tenant_from_the_key(engram, tenant):
    saved, engram.tenant_id = engram.tenant_id, None
    try:
        r = engram.retrieve_basic(str(uuid.uuid4()), f"anything {word()}", mode="keyword")
        assert r.results == []
        assert engram.tenant_id == tenant
    finally:
        engram.tenant_id = saved
