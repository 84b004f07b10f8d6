"""RetrievalService through the sync client: every request field, the
response with provenance, feedback."""

import datetime as dt

from conftest import word
from engram_client import (
    ConversationMessage,
    FeedbackItem,
    FeedbackSignal,
    QueryRoute,
    RetrievalMode,
    RetrieveResult,
    SkipReason,
    TimeRange,
)

UTC = dt.timezone.utc


def test_retrieve_returns_records_with_provenance(engram):
    w = word()
    r = engram.remember(f"Grace Hopper's favourite {w} is the compiler.",
                        source="https://example.test/hopper")
    answer = engram.retrieve(f"What is Grace Hopper's favourite {w}?")
    assert isinstance(answer, RetrieveResult)
    assert answer.query_id
    assert answer.route in (QueryRoute.SIMPLE, QueryRoute.MULTI_HOP, QueryRoute.EXPLORATORY)
    assert answer.skip_reason is SkipReason.NONE
    top = answer.records[0]
    assert top.id == r.id and top.rank == 1
    assert top.memory.content.startswith("Grace Hopper")
    p = top.provenance
    assert p.strategies and {s.strategy for s in p.strategies} <= {"vector", "keyword", "graph"}
    assert all(s.rank >= 1 for s in p.strategies)
    assert p.citation
    assert p.checks_passed
    assert answer.latency_ms > 0 and answer.stage_latencies
    assert [x.rank for x in answer.records] == list(range(1, len(answer.records) + 1))


def test_retrieve_accepts_every_request_field(engram):
    w = word()
    event = dt.datetime(2023, 5, 4, tzinfo=UTC)
    r = engram.remember(f"The {w} launch happened in May.", namespace="launches",
                        memory_type="episodic", event_time=event, metadata={"kind": "launch"})
    answer = engram.retrieve(
        f"When was the {w} launch?",
        memory_types=["episodic"],
        time_range=TimeRange(start=event - dt.timedelta(days=1), end=event + dt.timedelta(days=1)),
        agent_scope=["agent-1"],
        limit=3,
        include_consolidated=True,
        include_historical=False,
        min_confidence=0.1,
        as_of_event=dt.datetime.now(UTC),
        as_of_ingestion=dt.datetime.now(UTC) + dt.timedelta(seconds=5),
        namespace="launches",
        metadata_filter={"kind": "launch"},
        mode=RetrievalMode.AUTO,
        hypotheses=[f"The {w} launch was in May 2023."],
        turn_id=f"turn-{w}",
        token_budget=200,
        explain=True,
        context_sufficient=False,
        skip_rerank=True,
        no_cache=True,
        fail_open=False,
        timeout=10,
    )
    assert r.id in answer.ids
    assert len(answer.records) <= 3
    assert f"The {w} launch" in answer.context_block and answer.context_tokens > 0
    # A filter that excludes it.
    none = engram.retrieve(f"When was the {w} launch?", namespace="launches",
                           metadata_filter={"kind": "other"}, no_cache=True)
    assert r.id not in none.ids


def test_raw_modes_and_strings_for_enums(engram):
    w = word()
    r = engram.remember(f"Keyword only token {w}.")
    for mode in (RetrievalMode.KEYWORD, "keyword", "RETRIEVAL_MODE_HYBRID", "vector"):
        answer = engram.retrieve(f"{w}", mode=mode, no_cache=True)
        assert r.id in answer.ids, mode


def test_conversation_instead_of_text(engram):
    w = word()
    r = engram.remember(f"The user's dog is named Biscuit {w}.")
    answer = engram.retrieve(conversation=[
        ConversationMessage("user", "hello"),
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": f"What is my dog's name {w}?"},
    ], no_cache=True)
    assert r.id in answer.ids


def test_context_sufficient_skips(engram):
    answer = engram.retrieve(f"anything {word()}", context_sufficient=True)
    assert answer.records == []
    assert answer.skip_reason is SkipReason.CONTEXT_SUFFICIENT
    assert answer.route is QueryRoute.SKIP


def test_turn_id_reuses_the_first_answer(engram):
    w = word()
    engram.remember(f"Turn cache fact {w}.")
    first = engram.retrieve(f"turn cache fact {w}", turn_id=f"t-{w}")
    second = engram.retrieve(f"something else entirely {w}", turn_id=f"t-{w}")
    assert second.ids == first.ids


def test_feedback(engram):
    w = word()
    r = engram.remember(f"Feedback target {w} about tide tables.")
    answer = engram.retrieve(f"tide tables {w}", no_cache=True)
    assert r.id in answer.ids
    accepted = engram.feedback(answer.query_id, [
        FeedbackItem(r.id, FeedbackSignal.USED, True),
        (r.id, "helpful", True),
        (r.id, FeedbackSignal.SUFFICIENT),
    ])
    assert accepted == 3
