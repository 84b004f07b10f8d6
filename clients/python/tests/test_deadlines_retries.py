"""Deadlines and retries against an in-process fake gateway (the generated
servicers from the wheel) that can hang or fail on demand, and deadlines on
the real one. Reads are retried on UNAVAILABLE only; writes never are."""

import asyncio
import threading
import time
from concurrent import futures

import grpc
import pytest

from engram_client import (
    AsyncEngram,
    DeadlineExceeded,
    Engram,
    Internal,
    Memory,
    Unavailable,
)
from engram_client._pb import common_pb2, retrieval_pb2, retrieval_pb2_grpc


class Fake(retrieval_pb2_grpc.RetrievalServiceServicer, retrieval_pb2_grpc.MemoryServiceServicer):
    """Fails the first `fail` calls with `code`, sleeps `delay` seconds, and
    records every call's method, remaining deadline and metadata."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = []
        self.fail = 0
        self.code = grpc.StatusCode.UNAVAILABLE
        self.delay = 0.0

    def _enter(self, method, context):
        with self.lock:
            self.calls.append((method, context.time_remaining(),
                               dict(context.invocation_metadata())))
            failing = self.fail > 0
            if failing:
                self.fail -= 1
        if failing:
            context.abort(self.code, "injected failure")
        if self.delay:
            time.sleep(self.delay)

    def Retrieve(self, request, context):
        self._enter("Retrieve", context)
        return retrieval_pb2.RetrieveResponse(query_id="q-1", records=[
            retrieval_pb2.ScoredMemory(memory=common_pb2.Memory(id="m-1", content=request.text),
                                       score=0.5, rank=1)
        ])

    def Feedback(self, request, context):
        self._enter("Feedback", context)
        return retrieval_pb2.FeedbackResponse(accepted=len(request.items))

    def Upsert(self, request, context):
        self._enter("Upsert", context)
        return common_pb2.UpsertResponse(results=[
            common_pb2.UpsertResult(id="m-1", version=1, created=True) for _ in request.memories
        ])

    def Get(self, request, context):
        self._enter("Get", context)
        return common_pb2.GetResponse(memories=[common_pb2.Memory(id=i) for i in request.ids])

    def Delete(self, request, context):
        self._enter("Delete", context)
        return common_pb2.DeleteResponse(deleted=len(request.ids))

    def ListConflicts(self, request, context):
        self._enter("ListConflicts", context)
        return common_pb2.ListConflictsResponse(conflicts=[
            common_pb2.DetectedConflict(new_id="n-1", old_id="o-1", score=0.9)
        ])

    def ReviewConflict(self, request, context):
        self._enter("ReviewConflict", context)
        return common_pb2.ReviewConflictResponse()

    def methods(self):
        return [c[0] for c in self.calls]


@pytest.fixture
def fake():
    f = Fake()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(f, server)
    retrieval_pb2_grpc.add_MemoryServiceServicer_to_server(f, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    f.target = f"127.0.0.1:{port}"
    yield f
    server.stop(0)


def test_default_deadline_and_key_on_every_call(fake):
    with Engram(fake.target, api_key="k-1") as c:
        c.retrieve("hello")
        c.upsert([Memory(content="x")])
        c.retrieve("hello", timeout=1.5)
    (_, t1, md1), (_, t2, md2), (_, t3, _) = fake.calls
    assert 4.0 < t1 <= 5.1 and 4.0 < t2 <= 5.1
    assert 1.0 < t3 <= 1.6
    assert md1["authorization"] == "Bearer k-1" == md2["authorization"]
    assert md1["user-agent"].startswith("engram-client-python/")


def test_client_timeout_is_the_default(fake):
    with Engram(fake.target, api_key="k", timeout=2.0) as c:
        c.get(["a"])
    assert 1.0 < fake.calls[0][1] <= 2.1


def test_deadline_holds_against_a_hanging_server(fake):
    fake.delay = 3.0
    with Engram(fake.target, api_key="k") as c:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            c.retrieve("slow", timeout=0.3)
        assert time.monotonic() - t0 < 1.5


def test_reads_retry_on_unavailable(fake):
    fake.fail = 2
    with Engram(fake.target, api_key="k", retry_backoff=0.01) as c:
        assert c.retrieve("x").ids == ["m-1"]
        assert fake.methods() == ["Retrieve"] * 3
        fake.calls.clear()
        fake.fail = 1
        assert [m.id for m in c.get(["a"])] == ["a"]
        assert fake.methods() == ["Get"] * 2
        fake.calls.clear()
        fake.fail = 2
        assert [x.new_id for x in c.list_conflicts().conflicts] == ["n-1"]
        assert fake.methods() == ["ListConflicts"] * 3


def test_reads_give_up_after_max_retries(fake):
    fake.fail = 10
    with Engram(fake.target, api_key="k", max_retries=2, retry_backoff=0.01) as c:
        with pytest.raises(Unavailable):
            c.retrieve("x")
    assert fake.methods() == ["Retrieve"] * 3


def test_writes_are_never_retried(fake):
    with Engram(fake.target, api_key="k", retry_backoff=0.01) as c:
        for method, call in [
            ("Upsert", lambda: c.upsert([Memory(content="x")])),
            ("Upsert", lambda: c.remember("x")),
            ("Delete", lambda: c.delete(["a"])),
            ("Feedback", lambda: c.feedback("q", ["m"])),
            ("ReviewConflict", lambda: c.review_conflict("n", "o", "reject")),
        ]:
            fake.calls.clear()
            fake.fail = 1
            with pytest.raises(Unavailable):
                call()
            assert fake.methods() == [method]


def test_other_codes_are_not_retried(fake):
    fake.fail = 1
    fake.code = grpc.StatusCode.INTERNAL
    with Engram(fake.target, api_key="k", retry_backoff=0.01) as c:
        with pytest.raises(Internal):
            c.retrieve("x")
    assert fake.methods() == ["Retrieve"]


def test_retries_stay_within_the_deadline():
    # Nothing listens here: every attempt is UNAVAILABLE.
    with Engram("127.0.0.1:1", api_key="k", max_retries=100, retry_backoff=0.05) as c:
        t0 = time.monotonic()
        with pytest.raises((Unavailable, DeadlineExceeded)):
            c.retrieve("x", timeout=0.5)
        assert time.monotonic() - t0 < 1.5


@pytest.mark.asyncio
async def test_async_deadline_retry_and_writes(fake):
    async with AsyncEngram(fake.target, api_key="k-a", retry_backoff=0.01) as c:
        await c.retrieve("x")
        assert 4.0 < fake.calls[-1][1] <= 5.1
        assert fake.calls[-1][2]["authorization"] == "Bearer k-a"
        fake.calls.clear()
        fake.fail = 2
        assert (await c.retrieve("x")).ids == ["m-1"]
        assert fake.methods() == ["Retrieve"] * 3
        fake.calls.clear()
        fake.fail = 1
        with pytest.raises(Unavailable):
            await c.remember("x")
        assert fake.methods() == ["Upsert"]
        fake.delay = 3.0
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await c.retrieve("slow", timeout=0.3)
        assert time.monotonic() - t0 < 1.5
        fake.delay = 0.0


def test_deadline_holds_on_the_real_gateway(engram):
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        engram.retrieve("anything at all", timeout=0.001, no_cache=True)
    assert time.monotonic() - t0 < 1.0


@pytest.mark.asyncio
async def test_async_deadline_holds_on_the_real_gateway(aengram):
    with pytest.raises(DeadlineExceeded):
        await asyncio.wait_for(aengram.retrieve("anything", timeout=0.001, no_cache=True), 2)


def test_the_gateway_honours_the_callers_deadline(engram):
    # Agentic retrieval may run for max_latency_ms (here 30 s); the call's
    # 0.8 s deadline travels as grpc-timeout and bounds it either way.
    t0 = time.monotonic()
    try:
        engram.retrieve_agentic("Which decisions led to the outage and who made them?",
                                max_latency_ms=30_000, max_steps=20, timeout=0.8)
    except DeadlineExceeded:
        pass
    assert time.monotonic() - t0 < 2.0
