"""engram behind LangChain and LlamaIndex: the same memories, as each
framework's retriever (pip install 'engram-retrieval[langchain]' or
'engram-retrieval[llama-index]').

    ENGRAM_API_KEY=$(cat .engram/dev-api-key) python clients/python/examples/frameworks.py

It writes a fact and its newer version (no update wording) into a namespace
of its own, asks both frameworks, and deletes what it wrote: both see the
current version first. tests/test_examples.py runs main() against the test
stack.
"""

import uuid
from datetime import datetime, timezone

from engram_client import Engram
from engram_client.langchain import EngramRetriever
from engram_client.llama_index import EngramRetriever as IndexRetriever


def main(engram: Engram, person: str = "Dana") -> dict:
    namespace = f"frameworks-{uuid.uuid4().hex[:8]}"  # this run's own
    notes = [
        engram.remember(f"{person}'s dentist is Dr. Okafor.", namespace=namespace,
                        event_time=datetime(2025, 1, 20, tzinfo=timezone.utc)),
        engram.remember(f"{person}'s dentist is Dr. Halvorsen.", namespace=namespace,
                        event_time=datetime(2025, 9, 2, tzinfo=timezone.utc)),
    ]
    try:
        question = f"Who is {person}'s dentist?"
        retriever = EngramRetriever(client=engram, namespace=namespace, limit=5)
        docs = retriever.invoke(question)
        print("LangChain:", [(d.page_content, d.metadata["citation"]) for d in docs])
        nodes = IndexRetriever(engram, namespace=namespace, limit=5).retrieve(question)
        print("LlamaIndex:", [(n.node.text, round(n.score, 3)) for n in nodes])
        return {"langchain": docs[0].page_content, "llama_index": nodes[0].node.text}
    finally:
        engram.delete([n.id for n in notes])  # leave nothing behind


if __name__ == "__main__":
    with Engram() as client:
        print(main(client))
