"""The LangChain and LlamaIndex retrievers (engram_client.langchain,
engram_client.llama_index) against the real gateway: each returns engram's
records in engram's order — the current version of a fact first — as the
framework's own documents / nodes, with the memory's id and provenance, in
sync and async form, and drops an answer flagged nothing_relevant only
when asked to."""

import datetime as dt

import pytest

from conftest import word

UTC = dt.timezone.utc


def days_ago(n):
    return (dt.datetime.now(UTC) - dt.timedelta(days=n)).replace(microsecond=0)


@pytest.fixture
def dentist(engram):
    """A namespace holding a fact, its newer version (no update wording)
    and an unrelated note; returns (namespace, person, old id, new id)."""
    ns = "kb-" + word()
    person = "Dana " + word().capitalize()
    old = engram.remember(f"{person}'s dentist is Dr. Adaeze Okafor.", namespace=ns,
                          memory_type="semantic", event_time=days_ago(150))
    new = engram.remember(f"{person}'s dentist is Dr. Ingrid Halvorsen.", namespace=ns,
                          memory_type="semantic", event_time=days_ago(10))
    engram.remember(f"{person} drinks oat milk flat whites.", namespace=ns,
                    memory_type="semantic", event_time=days_ago(20))
    return ns, person, old.id, new.id


def test_langchain_documents_are_engrams_records_current_first(engram, dentist):
    from langchain_core.documents import Document
    from langchain_core.runnables import RunnableLambda

    from engram_client.langchain import EngramRetriever

    ns, person, old_id, new_id = dentist
    question = f"Who is {person}'s dentist?"
    retriever = EngramRetriever(client=engram, namespace=ns, limit=3)
    docs = retriever.invoke(question)
    answer = engram.retrieve(question, namespace=ns, limit=3)
    assert all(isinstance(d, Document) for d in docs)
    assert [d.id for d in docs] == answer.ids
    assert docs[0].id == new_id and "Halvorsen" in docs[0].page_content
    assert old_id in [d.id for d in docs]
    meta = docs[0].metadata
    assert meta["id"] == new_id and meta["rank"] == 1 and meta["namespace"] == ns
    assert meta["strategies"] and meta["query_id"] and meta["event_time"]
    assert meta["nothing_relevant"] is False
    # It composes like any retriever in a chain.
    chain = retriever | RunnableLambda(lambda ds: ds[0].page_content)
    assert "Halvorsen" in chain.invoke(question)


@pytest.mark.asyncio
async def test_langchain_async_agrees_with_sync(engram, aengram, dentist):
    from engram_client.langchain import EngramRetriever

    ns, person, _, new_id = dentist
    question = f"Who is {person}'s dentist?"
    sync = EngramRetriever(client=engram, namespace=ns, limit=3)
    native = EngramRetriever(client=engram, async_client=aengram, namespace=ns, limit=3)
    in_thread = [d.id for d in await sync.ainvoke(question)]
    assert [d.id for d in await native.ainvoke(question)] == in_thread
    assert in_thread[0] == new_id


def test_nothing_relevant_is_kept_unless_asked_to_drop(engram, dentist):
    from engram_client.langchain import EngramRetriever
    from engram_client.llama_index import EngramRetriever as IndexRetriever

    ns, _, _, _ = dentist
    stranger = f"Where does {word().capitalize()} {word().capitalize()} keep the spare key?"
    assert engram.retrieve(stranger, namespace=ns).nothing_relevant
    kept = EngramRetriever(client=engram, namespace=ns).invoke(stranger)
    assert kept and all(d.metadata["nothing_relevant"] for d in kept)
    dropping = EngramRetriever(client=engram, namespace=ns, drop_when_nothing_relevant=True)
    assert dropping.invoke(stranger) == []
    assert IndexRetriever(engram, namespace=ns, drop_when_nothing_relevant=True).retrieve(
        stranger) == []


def test_llama_index_nodes_are_engrams_records_current_first(engram, dentist):
    from llama_index.core.schema import NodeWithScore, TextNode

    from engram_client.llama_index import EngramRetriever

    ns, person, old_id, new_id = dentist
    question = f"Who is {person}'s dentist?"
    nodes = EngramRetriever(engram, namespace=ns, limit=3).retrieve(question)
    answer = engram.retrieve(question, namespace=ns, limit=3)
    assert all(isinstance(n, NodeWithScore) and isinstance(n.node, TextNode) for n in nodes)
    assert [n.node.id_ for n in nodes] == answer.ids
    # engram's own scores, falling with rank (being retrieved counts as use,
    # so a second Retrieve may score a little differently).
    scores = [n.score for n in nodes]
    assert scores == sorted(scores, reverse=True)
    assert scores == [n.node.metadata["score"] for n in nodes]
    assert nodes[0].node.id_ == new_id and "Halvorsen" in nodes[0].node.get_content()
    assert old_id in [n.node.id_ for n in nodes]
    assert nodes[0].node.metadata["query_id"] and nodes[0].node.metadata["rank"] == 1


@pytest.mark.asyncio
async def test_llama_index_async_agrees_with_sync(engram, aengram, dentist):
    from engram_client.llama_index import EngramRetriever

    ns, person, _, new_id = dentist
    question = f"Who is {person}'s dentist?"
    in_thread = await EngramRetriever(engram, namespace=ns, limit=3).aretrieve(question)
    native = await EngramRetriever(engram, async_client=aengram, namespace=ns,
                                   limit=3).aretrieve(question)
    assert [n.node.id_ for n in native] == [n.node.id_ for n in in_thread]
    assert in_thread[0].node.id_ == new_id
