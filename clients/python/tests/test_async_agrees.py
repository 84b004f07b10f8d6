"""AsyncEngram has exactly Engram's methods and arguments, and both return
the same results for the same calls on the same data."""

import inspect
import uuid

import pytest

from conftest import word
from engram_client import AsyncEngram, Edge, Engram, InvalidArgument, Memory, Unauthenticated

PUBLIC = sorted(
    n for n, f in inspect.getmembers(Engram, inspect.isfunction)
    if not n.startswith("_") and n != "close"
)


def test_same_methods_and_signatures():
    assert len(PUBLIC) == 15, PUBLIC
    for name in PUBLIC:
        s, a = getattr(Engram, name), getattr(AsyncEngram, name)
        assert inspect.iscoroutinefunction(a), name
        assert not inspect.iscoroutinefunction(s), name
        assert inspect.signature(s) == inspect.signature(a), name
        assert s.__doc__ == a.__doc__, name
    for name in ("remember", "upsert", "retrieve", "feedback", "get", "delete", "add_edges",
                 "list_memories", "list_conflicts", "review_conflict",
                 "remember_working", "get_memory", "get_demand", "retrieve_basic",
                 "retrieve_agentic"):
        assert name in PUBLIC
    # Every call takes a per-call deadline.
    for name in PUBLIC:
        assert "timeout" in inspect.signature(getattr(Engram, name)).parameters, name


def test_retrieve_exposes_every_request_field():
    from engram_client._pb import retrieval_pb2

    fields = {f.name for f in retrieval_pb2.RetrieveRequest.DESCRIPTOR.fields}
    params = set(inspect.signature(Engram.retrieve).parameters)
    assert fields <= params, fields - params
    from engram_client._pb import common_pb2

    for msg, method in [(retrieval_pb2.GetMemoryRequest, Engram.get_memory),
                        (common_pb2.ListMemoriesRequest, Engram.list_memories),
                        (common_pb2.ListConflictsRequest, Engram.list_conflicts),
                        (common_pb2.ReviewConflictRequest, Engram.review_conflict)]:
        assert {f.name for f in msg.DESCRIPTOR.fields} <= set(inspect.signature(method).parameters)


@pytest.mark.asyncio
async def test_async_covers_every_method_and_agrees(engram, aengram, tenant):
    w = word()
    kb = str(uuid.uuid4())
    a = await aengram.remember(f"Async written {w}: the tram leaves at nine.", namespace=kb,
                               memory_type="semantic")
    (b,) = await aengram.upsert([Memory(content=f"Async batch {w}: the bus leaves at ten.",
                                        namespace=kb)])
    assert await aengram.add_edges([Edge(a.id, b.id, "related")]) == 1

    # get: identical dataclasses either way.
    got_async = await aengram.get([a.id, b.id])
    assert got_async == engram.get([a.id, b.id])
    assert {m.id for m in got_async} == {a.id, b.id}
    page = await aengram.list_memories(namespace=kb)
    assert page == engram.list_memories(namespace=kb)
    assert {m.id for m in page.memories} == {a.id, b.id}
    conflicts = await aengram.list_conflicts(namespace=kb)
    assert conflicts == engram.list_conflicts(namespace=kb)

    # retrieve: the same records in the same order, with the same provenance.
    q = f"When does the tram leave {w}?"
    ra = await aengram.retrieve(q, no_cache=True, skip_rerank=True, namespace=kb)
    rs = engram.retrieve(q, no_cache=True, skip_rerank=True, namespace=kb)
    assert ra.ids == rs.ids and a.id in ra.ids
    assert [r.memory for r in ra.records] == [r.memory for r in rs.records]
    assert [[h.strategy for h in r.provenance.strategies] for r in ra.records] == \
        [[h.strategy for h in r.provenance.strategies] for r in rs.records]
    assert await aengram.feedback(ra.query_id, [a.id]) == 1

    # Knowledge Foundry.
    fa = await aengram.retrieve_basic(kb, f"tram {w}", mode="keyword")
    fs = engram.retrieve_basic(kb, f"tram {w}", mode="keyword")
    assert [x.chunk_id for x in fa.results] == [x.chunk_id for x in fs.results]
    assert a.id in [x.chunk_id for x in fa.results]
    ag = await aengram.retrieve_agentic(f"tram {w}", kb_ids=[kb], max_steps=1,
                                        max_latency_ms=5000)
    assert a.id in [x.chunk_id for x in ag.results]

    # Working memory.
    note = await aengram.remember_working(f"async note {w}", session_id=f"s-{w}")
    wm = await aengram.get_memory(f"async note {w}", session_id=f"s-{w}")
    assert note.id in [i.id for i in wm.items]
    ws = engram.get_memory(f"async note {w}", session_id=f"s-{w}")
    assert [i.id for i in ws.items] == [i.id for i in wm.items]
    assert (await aengram.get_demand(limit=5)).observations >= 1

    # delete.
    assert await aengram.delete([a.id, b.id, note.id]) == 3
    assert await aengram.get([a.id, b.id]) == []


@pytest.mark.asyncio
async def test_async_errors_are_the_same_types(engram, aengram):
    with pytest.raises(InvalidArgument) as ea:
        await aengram.retrieve("q", limit=1000)
    with pytest.raises(InvalidArgument) as es:
        engram.retrieve("q", limit=1000)
    assert (ea.value.field, ea.value.rule) == (es.value.field, es.value.rule) == \
        ("limit", es.value.rule)
    async with AsyncEngram(engram.target, api_key="k-not-a-key") as bad:
        with pytest.raises(Unauthenticated):
            await bad.get([str(uuid.uuid4())])
