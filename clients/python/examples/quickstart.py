"""Quickstart: write a memory, retrieve it with its provenance, say it helped.

Run against a gateway (`engram up` prints a dev key and writes
.engram/dev-api-key):

    ENGRAM_API_KEY=$(cat .engram/dev-api-key) python clients/python/examples/quickstart.py

It writes into a namespace of its own (`quickstart-<random>`), searches only
there and deletes what it wrote at the end: your own memories neither
answer it nor keep its sample fact.

tests/test_examples.py runs this file's main() against the test stack.
"""

import uuid

from engram_client import Engram, FeedbackSignal


def main(engram: Engram, topic: str = "green tea") -> str:
    namespace = f"quickstart-{uuid.uuid4().hex[:8]}"  # this run's own
    note = engram.remember(
        f"The user prefers {topic} over coffee in the afternoon.",
        namespace=namespace,
        memory_type="semantic",
        source="chat://session-42/turn-3",
        source_confidence=0.9,
    )
    try:
        answer = engram.retrieve(
            f"What does the user like to drink? {topic}", namespace=namespace, limit=5
        )
        for r in answer.records:
            hits = ", ".join(f"{h.strategy}#{h.rank}" for h in r.provenance.strategies)
            print(f"{r.rank}. {r.content}  [{r.provenance.citation}; {hits}]")
        top = answer.records[0]
        engram.feedback(answer.query_id, [(top.id, FeedbackSignal.HELPFUL, True)])
        return top.content
    finally:
        engram.delete([note.id])  # leave nothing behind


if __name__ == "__main__":
    with Engram() as client:  # ENGRAM_URL (default 127.0.0.1:50051), ENGRAM_API_KEY
        main(client)
