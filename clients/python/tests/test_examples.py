"""The examples in clients/python/examples (quoted in docs/clients.md and
the README) run against the live gateway."""

import datetime as dt
import importlib.util
import os

import pytest

from conftest import word

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}",
                                                  os.path.join(EXAMPLES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quickstart(engram, capsys):
    w = word()
    top = load("quickstart").main(engram, topic=f"green tea {w}")
    assert w in top
    assert "1. " in capsys.readouterr().out
    # It cleaned up: nothing of it is left in the tenant, in any namespace.
    newest = engram.list_memories(page_size=1000, newest_first=True, include_historical=True)
    assert not [m for m in newest.memories if w in m.content], "quickstart left its memory"


def test_agent_loop(engram):
    w = word()
    out = load("agent_loop").run_session(engram, w)
    assert any("Porto" in c for c in out["current"]), out
    assert not any("Lisbon" in c for c in out["current"]), out
    assert any("Lisbon" in c for c in out["historical"]), out
    assert any("water the plants" in c for c in out["notes"]), out
    (home,) = engram.get([out["home_id"]])
    assert "Porto" in home.content and home.supersedes


def test_frameworks(engram, capsys):
    person = "Dana " + word().capitalize()
    top = load("frameworks").main(engram, person=person)
    assert "Halvorsen" in top["langchain"] and "Halvorsen" in top["llama_index"], top
    out = capsys.readouterr().out
    assert "LangChain:" in out and "LlamaIndex:" in out
    newest = engram.list_memories(page_size=1000, newest_first=True, include_historical=True)
    assert not [m for m in newest.memories if person in m.content], "frameworks left its memories"


@pytest.mark.asyncio
async def test_async_agent_loop(aengram):
    w = word()
    out = await load("async_agent_loop").run_session(aengram, w)
    assert any("Miso" in c for c in out["first"]), out
    assert any("cat" in c for c in out["notes"]), out


HERE = os.path.dirname(os.path.abspath(__file__))


def python_blocks(path):
    with open(path) as f:
        text = f.read()
    return [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]


def test_readme_blocks_run(engram, capsys):
    import engram_client

    blocks = python_blocks(os.path.join(HERE, "..", "README.md"))
    assert len(blocks) == 3
    defined = {}
    for block in blocks:
        # Each block on its own (the first binds and closes its own client).
        scope = {"engram": engram, "InvalidArgument": engram_client.InvalidArgument}
        exec(compile(block, "README.md", "exec"), scope)
        defined.update(scope)
    out = capsys.readouterr().out
    assert "limit -> must be in 1..=100" in out, out

    # The review loop, on an update the stack detects (python_client.rs
    # turns search.update_detection on).
    now = dt.datetime.now(dt.timezone.utc)
    ns = f"readme-{word()}"
    old = engram.remember("Priya lives in Berlin.", namespace=ns, memory_type="semantic",
                          event_time=now - dt.timedelta(days=150))
    new = engram.remember("Priya moved to Amsterdam.", namespace=ns, memory_type="semantic",
                          event_time=now - dt.timedelta(days=10))
    decided = []
    defined["review_updates"](engram, ns, lambda c: decided.append(c) or "confirm")
    assert [(c.new_id, c.old_id) for c in decided] == [(new.id, old.id)]
    assert "'Priya lives in Berlin.' -> 'Priya moved to Amsterdam.'" in capsys.readouterr().out
    assert engram.list_conflicts(namespace=ns).conflicts == []
    (confirmed,) = engram.list_conflicts(namespace=ns, include_confirmed=True).conflicts
    assert confirmed.confirmed_at is not None and confirmed.old_closed


def test_docs_quote_the_examples():
    docs = os.path.join(HERE, "..", "..", "..", "docs", "clients.md")
    if not os.path.exists(docs):
        pytest.skip("not in a repository checkout")
    lines = set()
    for name in os.listdir(EXAMPLES):
        if name.endswith(".py"):
            with open(os.path.join(EXAMPLES, name)) as f:
                lines |= {line.strip() for line in f}
    blocks = python_blocks(docs)
    assert len(blocks) >= 2
    for block in blocks:
        for line in block.splitlines():
            assert line.strip() in lines, f"docs/clients.md quotes no example here: {line!r}"


def test_readme_python_block(engram):
    """The README's five-minute Python block, as printed, against the live
    gateway (it reads ENGRAM_URL and ENGRAM_API_KEY as a reader's shell would)."""
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "..", "README.md")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "EngramRetriever" in block and "engram.delete" in block, block
    exec(compile(block, "README.md", "exec"), {})
    left = engram.list_memories(page_size=1000, include_historical=True, namespace="quickstart")
    assert not left.memories, "the README block left its memory"
