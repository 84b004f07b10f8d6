"""MemoryService through the sync client: remember/upsert, get, delete,
add_edges, supersedes; every field of a Memory survives the round trip."""

import datetime as dt
import os
import uuid

import pytest

from conftest import word
from engram_client import AccessLevel, Edge, InvalidArgument, Memory, MemoryPage, Triple, UpsertResult

UTC = dt.timezone.utc


def test_installed_wheel_is_what_runs():
    import engram_client
    from engram_client._pb import retrieval_pb2, retrieval_pb2_grpc

    here = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    assert not os.path.abspath(engram_client.__file__).startswith(here), engram_client.__file__
    # Generated at build time, from the repository's protos.
    assert retrieval_pb2.DESCRIPTOR.name == "engram/v1/retrieval.proto"
    assert hasattr(retrieval_pb2_grpc, "WorkingMemoryServiceStub")
    assert not os.path.exists(os.path.join(here, "src", "engram_client", "_pb"))


def test_remember_and_get_every_field(engram, tenant):
    w = word()
    mid = str(uuid.uuid4())
    event = dt.datetime(2024, 3, 1, 12, 30, tzinfo=UTC)
    r = engram.remember(
        f"Ada reviewed the {w} design document.",
        id=mid,
        namespace="project-x",
        memory_type="semantic",
        title=f"Review {w}",
        access_level=AccessLevel.INTERNAL,
        source_confidence=0.75,
        event_time=event,
        valid_from=event,
        valid_to=event + dt.timedelta(days=30),
        metadata={"team": "core", "priority": 2},
        source="https://example.test/docs/1",
        entities=["Ada", f"{w} design"],
        triples=[Triple("Ada", "reviewed", f"{w} design")],
    )
    assert r == UpsertResult(id=mid, version=1, created=True, embedded=True)

    (m,) = engram.get([mid])
    assert isinstance(m, Memory)
    assert (m.id, m.content, m.namespace, m.memory_type) == (
        mid, f"Ada reviewed the {w} design document.", "project-x", "semantic")
    assert m.title == f"Review {w}"
    assert m.access_level is AccessLevel.INTERNAL
    assert m.source_confidence == pytest.approx(0.75)
    assert m.event_time == event and m.valid_from == event
    assert m.valid_to == event + dt.timedelta(days=30)
    assert m.metadata == {"team": "core", "priority": 2}
    assert m.source == "https://example.test/docs/1"
    assert "Ada" in m.entities
    # Triples become graph edges; Get returns the memory row, not them.
    # Output-only fields come from the server and the key's identity.
    assert m.agent_id == "agent-1"
    if tenant:
        assert m.tenant_id == tenant
    assert m.version == 1
    assert m.ingestion_time is not None and m.ingestion_time.tzinfo is not None
    assert m.embedding == []  # the public Get never returns vectors
    # A string id is accepted as well as a list.
    assert engram.get(mid) == [m]


def test_upsert_batch_is_idempotent_and_versions_changes(engram):
    w = word()
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    first = engram.upsert([Memory(id=a, content=f"alpha {w}"), Memory(id=b, content=f"beta {w}")])
    assert [x.id for x in first] == [a, b]
    assert all(x.created and x.version == 1 for x in first)
    again = engram.upsert([Memory(id=a, content=f"alpha {w}")])
    assert again[0].id == a and not again[0].created and again[0].version == 1
    changed = engram.upsert([Memory(id=a, content=f"alpha changed {w}")])
    assert changed[0].version == 2
    # A plain string is a memory with default fields.
    (s,) = engram.upsert([f"gamma {w}"])
    assert s.created and uuid.UUID(s.id)


def test_delete(engram):
    r = engram.remember(f"to be deleted {word()}")
    assert engram.delete([r.id]) == 1
    assert engram.get([r.id]) == []
    assert engram.delete(r.id) == 0


def test_add_edges(engram):
    w = word()
    a = engram.remember(f"The deploy failed {w}.")
    b = engram.remember(f"The disk was full {w}.")
    added = engram.add_edges([
        Edge(b.id, a.id, "causes"),
        Edge(a.id, b.id, "related", weight=0.5),
    ])
    assert added == 2


def test_supersedes_hides_the_old_version(engram):
    w = word()
    old = engram.remember(f"The office is on floor 3 {w}.", memory_type="semantic")
    new = engram.remember(f"The office moved to floor 7 {w}.", memory_type="semantic",
                          supersedes=old.id)
    now = engram.retrieve(f"which floor is the office on {w}", no_cache=True)
    assert new.id in now.ids and old.id not in now.ids
    hist = engram.retrieve(f"which floor is the office on {w}", no_cache=True,
                           include_historical=True)
    assert old.id in hist.ids and new.id in hist.ids


def test_list_memories_pages(engram, tenant):
    ns = f"list-{word()}"
    written = [r.id for r in engram.upsert([Memory(content=f"item {i} {ns}", namespace=ns)
                                            for i in range(3)])]
    first = engram.list_memories(namespace=ns, page_size=2)
    assert isinstance(first, MemoryPage) and len(first.memories) == 2 and first.next_page_token
    if tenant:
        assert first.tenant == tenant
    second = engram.list_memories(namespace=ns, page_size=2, page_token=first.next_page_token)
    assert len(second.memories) == 1 and second.next_page_token == ""
    ids = [m.id for m in first.memories + second.memories]
    assert sorted(ids) == sorted(written)
    newest = engram.list_memories(namespace=ns, newest_first=True, memory_types=["episodic"])
    assert [m.id for m in newest.memories] == ids[::-1]
    with pytest.raises(InvalidArgument) as e:
        engram.list_memories(page_size=0)
    assert e.value.field == "page_size"
