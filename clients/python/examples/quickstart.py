"""Quickstart: write a memory, retrieve it with its provenance, say it helped.

Run against a gateway (`engram up` prints a dev key and writes
.engram/dev-api-key):

    ENGRAM_API_KEY=$(cat .engram/dev-api-key) python clients/python/examples/quickstart.py

tests/test_examples.py runs this file's main() against the test stack.
"""

from engram_client import Engram, FeedbackSignal


def main(engram: Engram, topic: str = "green tea") -> str:
    engram.remember(
        f"The user prefers {topic} over coffee in the afternoon.",
        memory_type="semantic",
        source="chat://session-42/turn-3",
        source_confidence=0.9,
    )
    answer = engram.retrieve(f"What does the user like to drink? {topic}", limit=5)
    for r in answer.records:
        hits = ", ".join(f"{h.strategy}#{h.rank}" for h in r.provenance.strategies)
        print(f"{r.rank}. {r.content}  [{r.provenance.citation}; {hits}]")
    top = answer.records[0]
    engram.feedback(answer.query_id, [(top.id, FeedbackSignal.HELPFUL, True)])
    return top.content


if __name__ == "__main__":
    with Engram() as client:  # ENGRAM_URL (default 127.0.0.1:50051), ENGRAM_API_KEY
        main(client)
