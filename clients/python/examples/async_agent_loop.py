"""agent_loop.py's turn on the asyncio client: the retrieve for this turn
and the working note of the previous one run concurrently.

    ENGRAM_API_KEY=... python clients/python/examples/async_agent_loop.py
"""

import asyncio
import uuid
from typing import Dict, List

from engram_client import AsyncEngram, FeedbackItem


async def turn(engram: AsyncEngram, session_id: str, history: List[Dict[str, str]],
               message: str) -> List[str]:
    history.append({"role": "user", "content": message})
    answer, _ = await asyncio.gather(
        engram.retrieve(conversation=history[-6:], turn_id=str(uuid.uuid4()), limit=5,
                        fail_open=True),
        engram.remember_working(message, session_id=session_id),
    )
    used = [r.id for r in answer.records[:2]]  # what the model relied on
    if answer.query_id and used:
        await engram.feedback(answer.query_id, [FeedbackItem(i) for i in used])
    history.append({"role": "assistant", "content": f"ok ({len(answer.records)} memories)"})
    return [r.content for r in answer.records]


async def run_session(engram: AsyncEngram, marker: str) -> Dict[str, object]:
    await engram.remember(f"The user's cat is called Miso {marker}.", memory_type="semantic")
    history: List[Dict[str, str]] = []
    first = await turn(engram, f"s-{marker}", history, f"What is my cat called? {marker}")
    notes = await engram.get_memory(f"cat {marker}", session_id=f"s-{marker}")
    return {"first": first, "notes": [i.content for i in notes.items]}


async def main() -> None:
    async with AsyncEngram() as client:
        print(await run_session(client, uuid.uuid4().hex[:8]))


if __name__ == "__main__":
    asyncio.run(main())
