"""Typed errors: InvalidArgument carries the server's field and rule."""

import uuid

import grpc
import pytest

from engram_client import (
    EngramError,
    Engram,
    InvalidArgument,
    Memory,
    Unauthenticated,
)
from engram_client.errors import DeadlineExceeded, from_rpc_error, parse_invalid_argument


@pytest.mark.parametrize("message,field,rule", [
    ("invalid argument text: must not be empty", "text", "must not be empty"),
    ("invalid argument limit: must be in 1..=100", "limit", "must be in 1..=100"),
    ("search: memories[0].content: must not be empty", "memories[0].content",
     "must not be empty"),
    ("invalid argument memories.metadata.session_id: is required",
     "memories.metadata.session_id", "is required"),
    ("search: invalid value: numeric field overflow", None,
     "search: invalid value: numeric field overflow"),
    ("something else", None, "something else"),
])
def test_parse_invalid_argument(message, field, rule):
    assert parse_invalid_argument(message) == (field, rule)


def test_invalid_argument_is_also_a_value_error():
    class Fake(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.INVALID_ARGUMENT

        def details(self):
            return "invalid argument top_k: must be in 1..=100"

        def trailing_metadata(self):
            return (("retry-after-ms", "5"),)

    e = from_rpc_error(Fake())
    assert isinstance(e, InvalidArgument) and isinstance(e, ValueError)
    assert (e.field, e.rule) == ("top_k", "must be in 1..=100")
    assert e.code is grpc.StatusCode.INVALID_ARGUMENT and e.metadata == {"retry-after-ms": "5"}
    assert "top_k" in str(e)


def test_the_servers_end_of_a_deadline_is_a_deadline():
    """tonic answers CANCELLED "Timeout expired" when the client's
    grpc-timeout runs out on the server first: still a DeadlineExceeded."""

    class Fake(grpc.RpcError):
        def __init__(self, details):
            self._details = details

        def code(self):
            return grpc.StatusCode.CANCELLED

        def details(self):
            return self._details

        def trailing_metadata(self):
            return ()

    assert isinstance(from_rpc_error(Fake("Timeout expired")), DeadlineExceeded)
    assert not isinstance(from_rpc_error(Fake("the caller went away")), DeadlineExceeded)


@pytest.mark.parametrize("call,field", [
    (lambda c: c.retrieve(""), "text"),
    (lambda c: c.retrieve("x" * 5000), "text"),
    (lambda c: c.retrieve("q", limit=0), "limit"),
    (lambda c: c.retrieve("q", min_confidence=2.0), "min_confidence"),
    (lambda c: c.retrieve(conversation=[{"role": "robot", "content": "hi"}]),
     "conversation.role"),
    (lambda c: c.get_memory(""), "query"),
    (lambda c: c.get_memory("q", max_depth=9), "max_depth"),
    (lambda c: c.get_demand(limit=0), "limit"),
    (lambda c: c.feedback("", [str(uuid.uuid4())]), "query_id"),
    (lambda c: c.retrieve_basic("", "q"), "kb_id"),
    (lambda c: c.retrieve_basic(str(uuid.uuid4()), "q", top_k=500), "top_k"),
    (lambda c: c.retrieve_agentic("q", reasoning_effort="extreme"), "reasoning_effort"),
    (lambda c: c.upsert([]), "memories"),
    (lambda c: c.remember("   "), "content"),
    (lambda c: c.remember("x", id="not-a-uuid"), "id"),
    (lambda c: c.remember("x", memory_type="Bad Type!"), "memory_type"),
    (lambda c: c.remember_working("x", session_id=""), "session_id"),
    (lambda c: c.add_edges([]), "edges"),
])
def test_invalid_argument_names_the_field(engram, call, field):
    with pytest.raises(InvalidArgument) as info:
        call(engram)
    e = info.value
    assert e.field is not None, e.message
    assert e.field.split(".")[-1].split("[")[0] == field.split(".")[-1], e.message
    assert e.rule and e.rule in e.message


def test_bad_key_is_unauthenticated(engram):
    with Engram(engram.target, api_key="k-not-a-key") as bad:
        with pytest.raises(Unauthenticated):
            bad.retrieve("anything")
        with pytest.raises(Unauthenticated):
            bad.upsert([Memory(content="nope")])


def test_every_error_is_an_engram_error(engram):
    with pytest.raises(EngramError) as info:
        engram.retrieve("")
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT


def test_configuration_errors(monkeypatch):
    monkeypatch.delenv("ENGRAM_API_KEY", raising=False)
    with pytest.raises(ValueError, match="ENGRAM_API_KEY"):
        Engram()
    with pytest.raises(ValueError, match="timeout"):
        Engram(api_key="k", timeout=0)
    monkeypatch.setenv("ENGRAM_API_KEY", "k-env")
    monkeypatch.setenv("ENGRAM_URL", "https://memory.example.test:443/")
    with Engram() as c:
        assert c.target == "memory.example.test:443"
        assert c._credentials is not None
        assert c._metadata == (("authorization", "Bearer k-env"),)
    monkeypatch.delenv("ENGRAM_URL")
    with Engram() as c:
        assert c.target == "127.0.0.1:50051" and c.timeout == 5.0
