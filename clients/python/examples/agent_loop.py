"""How an agent integrates engram: one retrieve and one write per turn,
feedback on what it used, updates modelled with `supersedes`, and working
memory for notes that only matter within the session.

    ENGRAM_API_KEY=... python clients/python/examples/agent_loop.py

tests/test_examples.py runs run_session() against the test stack, sync and
async (async_agent_loop.py is the same loop on AsyncEngram).
"""

import uuid
from typing import Callable, Dict, List, Optional

from engram_client import Engram, FeedbackItem, FeedbackSignal, RetrieveResult

# An LLM call in a real agent: (prompt context, user message) -> reply and
# the ids of the memories the reply actually relied on.
Llm = Callable[[str, str], "tuple[str, List[str]]"]


def echo_llm(context: str, message: str):
    """Stands in for the model: "uses" every memory whose text it was given."""
    used = [line.split("]", 1)[0].lstrip("[") for line in context.splitlines() if line]
    return f"(reply to {message!r} with {len(used)} memories)", used


class Agent:
    def __init__(self, engram: Engram, session_id: str, llm: Llm = echo_llm):
        self.engram = engram
        self.session_id = session_id
        self.llm = llm
        self.history: List[Dict[str, str]] = []
        # What this agent wrote, by topic, so a change of mind supersedes it.
        self.facts: Dict[str, str] = {}

    def turn(self, message: str, *, fact_topic: Optional[str] = None) -> RetrieveResult:
        self.history.append({"role": "user", "content": message})
        turn_id = str(uuid.uuid4())
        # 1. Retrieve on every turn: the recent conversation is the query;
        #    turn_id makes a repeated call in the same turn free.
        answer = self.engram.retrieve(
            conversation=self.history[-6:],
            turn_id=turn_id,
            limit=5,
            fail_open=True,  # a slow memory must not fail the agent's turn
        )
        context = "\n".join(f"[{r.id}] {r.content}" for r in answer.records)
        reply, used = self.llm(context, message)
        self.history.append({"role": "assistant", "content": reply})
        # 2. Feedback on what the reply used: it tunes future rankings.
        if answer.query_id and used:
            self.engram.feedback(
                answer.query_id,
                [FeedbackItem(mid, FeedbackSignal.USED, True) for mid in used],
            )
        # 3. Write on every turn. A durable fact goes to long-term memory;
        #    when it replaces an earlier one, supersede it (the old one is
        #    kept for history but no longer retrieved by default).
        if fact_topic is not None:
            previous = self.facts.get(fact_topic, "")
            written = self.engram.remember(
                message,
                memory_type="semantic",
                supersedes=previous,
                source=f"chat://{self.session_id}/{turn_id}",
                metadata={"topic": fact_topic},
            )
            self.facts[fact_topic] = written.id
        else:
            # Everything else is a session note: working memory, not Postgres.
            self.engram.remember_working(message, session_id=self.session_id,
                                         ttl_ms=3_600_000)
        return answer


def run_session(engram: Engram, marker: str) -> Dict[str, object]:
    """A short conversation; returns what the tests check."""
    agent = Agent(engram, session_id=f"s-{marker}")
    agent.turn(f"I live in Lisbon {marker}.", fact_topic="home")
    agent.turn(f"Remind me to water the plants {marker}.")
    agent.turn(f"I moved: I live in Porto now {marker}.", fact_topic="home")
    current = engram.retrieve(f"Where does the user live? {marker}", limit=5, no_cache=True)
    history = engram.retrieve(f"Where does the user live? {marker}", limit=5, no_cache=True,
                              include_historical=True)
    notes = engram.get_memory(f"water the plants {marker}", session_id=f"s-{marker}")
    return {
        "current": [r.content for r in current.records],
        "historical": [r.content for r in history.records],
        "notes": [i.content for i in notes.items],
        "home_id": agent.facts["home"],
    }


if __name__ == "__main__":
    with Engram() as client:
        print(run_session(client, uuid.uuid4().hex[:8]))
