"""Reviewing the updates engram detected at write time: list_conflicts and
review_conflict (MemoryService.ListConflicts / ReviewConflict). The stack of
tests/python_client.rs runs with search.update_detection on; every test
keeps to a namespace of its own (detection compares memories within one
namespace), so the other tests' pairs never show up here."""

import datetime as dt
import uuid

import pytest

from conftest import word
from engram_client import (
    ConflictDecision,
    ConflictPage,
    DetectedConflict,
    InvalidArgument,
    NotFound,
)

UTC = dt.timezone.utc
OLD = "Priya lives in Berlin."
NEW = "Priya moved to Amsterdam."


def days_ago(n):
    return (dt.datetime.now(UTC) - dt.timedelta(days=n)).replace(microsecond=0)


def write_update(engram, ns):
    """The old fact (150 days ago), then the newer one that changes it."""
    old = engram.remember(OLD, namespace=ns, memory_type="semantic", event_time=days_ago(150))
    new = engram.remember(NEW, namespace=ns, memory_type="semantic", event_time=days_ago(10))
    return old.id, new.id


def pairs(page):
    return [(c.new_id, c.old_id) for c in page.conflicts]


def test_decision_accepts_the_enum_or_its_name():
    assert ConflictDecision.coerce("confirm") is ConflictDecision.CONFIRM
    assert ConflictDecision.coerce("REJECT") is ConflictDecision.REJECT
    assert ConflictDecision.coerce("CONFLICT_DECISION_REJECT") is ConflictDecision.REJECT
    assert ConflictDecision.coerce(ConflictDecision.CONFIRM) is ConflictDecision.CONFIRM
    assert ConflictDecision.REJECT.to_proto() == 2
    # There is no default decision.
    for bad in (None, "", "maybe", 0):
        with pytest.raises(ValueError):
            ConflictDecision.coerce(bad)


def test_a_namespace_without_updates_lists_an_empty_page(engram):
    page = engram.list_conflicts(namespace=f"conflicts-{word()}")
    assert page == ConflictPage(conflicts=[], next_page_token="")
    page = engram.list_conflicts(namespace=f"conflicts-{word()}", page_size=200,
                                 include_confirmed=True)
    assert page.conflicts == [] and page.next_page_token == ""


@pytest.mark.parametrize("kwargs,field", [
    ({"page_size": 0}, "page_size"),
    ({"page_size": 201}, "page_size"),
    ({"page_token": "not-a-token"}, "page_token"),
    ({"namespace": "n" * 129}, "namespace"),
])
def test_list_conflicts_names_the_bad_field(engram, kwargs, field):
    with pytest.raises(InvalidArgument) as e:
        engram.list_conflicts(**kwargs)
    assert e.value.field == field, e.value.message


def test_reviewing_an_unknown_pair_is_not_found(engram):
    for decision in ("confirm", ConflictDecision.REJECT):
        with pytest.raises(NotFound):
            engram.review_conflict(str(uuid.uuid4()), str(uuid.uuid4()), decision)


def test_review_conflict_names_the_bad_field(engram):
    with pytest.raises(InvalidArgument) as e:
        engram.review_conflict("not-a-uuid", str(uuid.uuid4()), "reject")
    assert e.value.field == "new_id", e.value.message
    with pytest.raises(InvalidArgument) as e:
        engram.review_conflict(str(uuid.uuid4()), "", ConflictDecision.CONFIRM)
    assert e.value.field == "old_id", e.value.message
    # A decision the client does not know never reaches the server.
    with pytest.raises(ValueError):
        engram.review_conflict(str(uuid.uuid4()), str(uuid.uuid4()), "postpone")


def test_a_detected_update_is_listed_and_a_reject_removes_it(engram):
    ns = f"conflicts-{word()}"
    old_id, new_id = write_update(engram, ns)
    page = engram.list_conflicts(namespace=ns)
    assert pairs(page) == [(new_id, old_id)], page
    assert page.next_page_token == ""
    (c,) = page.conflicts
    assert isinstance(c, DetectedConflict)
    assert (c.new_content, c.old_content) == (NEW, OLD)
    assert 0.0 < c.score <= 1.0 and c.reason
    assert abs(c.new_event_time - days_ago(10)) < dt.timedelta(minutes=1)
    assert abs(c.old_event_time - days_ago(150)) < dt.timedelta(minutes=1)
    assert c.detected_at is not None and c.detected_at.tzinfo is not None
    assert c.confirmed_at is None and c.old_closed is False

    assert engram.review_conflict(new_id, old_id, "reject") is None
    assert engram.list_conflicts(namespace=ns).conflicts == []
    assert engram.list_conflicts(namespace=ns, include_confirmed=True).conflicts == []
    # The pair is gone: reviewing it again finds nothing.
    with pytest.raises(NotFound):
        engram.review_conflict(new_id, old_id, "confirm")
    # Both memories stay, and the old one is current again.
    got = {m.id: m for m in engram.get([old_id, new_id])}
    assert set(got) == {old_id, new_id} and got[old_id].valid_to is None


def test_a_confirm_closes_the_old_memory_and_pages_hold_both_pairs(engram):
    a, b = f"conflicts-{word()}", f"conflicts-{word()}"
    old_a, new_a = write_update(engram, a)
    old_b, new_b = write_update(engram, b)

    # Page through everything awaiting review, one pair a page.
    seen, token = [], ""
    for _ in range(1000):
        page = engram.list_conflicts(page_size=1, page_token=token)
        assert len(page.conflicts) <= 1
        seen += pairs(page)
        token = page.next_page_token
        if not token:
            break
    assert (new_a, old_a) in seen and (new_b, old_b) in seen
    # Newest detection first.
    assert seen.index((new_b, old_b)) < seen.index((new_a, old_a))

    c = engram.review_conflict(new_a, old_a, ConflictDecision.CONFIRM)
    assert isinstance(c, DetectedConflict) and (c.new_id, c.old_id) == (new_a, old_a)
    assert c.confirmed_at is not None and c.old_closed is True
    # Confirmed pairs await no review; include_confirmed still lists them.
    assert engram.list_conflicts(namespace=a).conflicts == []
    assert engram.list_conflicts(namespace=a, include_confirmed=True).conflicts == [c]
    # The old memory is history now: closed at the newer one's event time.
    (old,) = engram.get([old_a])
    assert old.valid_to == c.new_event_time
    # The other namespace's pair is untouched.
    assert pairs(engram.list_conflicts(namespace=b)) == [(new_b, old_b)]


@pytest.mark.asyncio
async def test_async_conflicts_agree(engram, aengram):
    ns = f"conflicts-{word()}"
    old_id, new_id = write_update(engram, ns)
    page = await aengram.list_conflicts(namespace=ns)
    assert page == engram.list_conflicts(namespace=ns)
    assert pairs(page) == [(new_id, old_id)]
    with pytest.raises(NotFound):
        await aengram.review_conflict(str(uuid.uuid4()), str(uuid.uuid4()), "reject")
    with pytest.raises(InvalidArgument) as e:
        await aengram.review_conflict("nope", old_id, "reject")
    assert e.value.field == "new_id"
    assert await aengram.review_conflict(new_id, old_id, "reject") is None
    assert (await aengram.list_conflicts(namespace=ns)).conflicts == []
