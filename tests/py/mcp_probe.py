"""Drives `engram mcp` with the official MCP Python SDK (tests/mcp.rs).

Usage:
  mcp_probe.py stdio NAMESPACE COMMAND [ARG...]   spawn the server, speak over its stdio
  mcp_probe.py http NAMESPACE URL                 streamable HTTP at URL

Lists the tools, calls each one on a fresh namespace, checks what comes
back, and checks that bad arguments are tool errors (isError) naming the
argument. Prints one JSON summary line on success; any failed check exits
non-zero with the reason on stderr.
"""

import json
import os
import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

TOOLS = {"search_memory", "get_memory", "remember", "forget", "memory_feedback"}


class ProbeError(Exception):
    pass


def check(ok, what):
    if not ok:
        raise ProbeError(what)


def text_of(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def call_ok(session, name, args):
    r = await session.call_tool(name, args)
    check(not r.is_error, f"{name}({args}) failed: {text_of(r)}")
    data = r.structured_content
    if data is None:
        data = json.loads(text_of(r))
    return data


async def call_err(session, name, args, field):
    r = await session.call_tool(name, args)
    text = text_of(r)
    check(r.is_error, f"{name}({args}) should be a tool error, got {text}")
    check(field in text, f"{name}({args}): the error should name {field!r}: {text}")
    return text


async def probe(session, ns):
    await session.initialize()
    listed = await session.list_tools()
    names = {t.name for t in listed.tools}
    check(names == TOOLS, f"tools: {sorted(names)}")
    for t in listed.tools:
        check(t.description and len(t.description) > 40, f"{t.name} has no real description")
        props = t.input_schema.get("properties", {})
        check(props, f"{t.name} has no argument schema")
        for arg, schema in props.items():
            check(schema.get("description"), f"{t.name}.{arg} has no description")
        check("tenant" not in props and "agent_id" not in props, f"{t.name} takes an identity")

    fact = "Ada Lovelace wrote the first published program, for Babbage's Analytical Engine."
    stored = await call_ok(session, "remember", {
        "content": fact, "title": "Ada Lovelace", "memory_type": "semantic",
        "namespace": ns, "source": "test://mcp",
    })
    mid = stored["id"]
    check(mid and stored["created"], f"remember: {stored}")

    found = await call_ok(session, "search_memory", {
        "query": "Who wrote the first program for the Analytical Engine?",
        "namespace": ns, "limit": 5,
    })
    ids = [r["id"] for r in found["records"]]
    check(mid in ids, f"search_memory did not return the note: {found}")
    check("Analytical Engine" in found["context"], f"no context block: {found}")
    check(found["query_id"], "search_memory has no query_id")
    top = found["records"][ids.index(mid)]
    check(top["provenance"]["citation"] and top["provenance"]["found_by"], f"no provenance: {top}")

    fb = await call_ok(session, "memory_feedback", {
        "query_id": found["query_id"], "memory_ids": [mid], "signal": "used",
    })
    check(fb["accepted"] == 1, f"memory_feedback: {fb}")

    recalled = await call_ok(session, "get_memory", {
        "query": "Ada Lovelace Analytical Engine", "max_depth": 1, "include_sources": True,
    })
    check(recalled["origin"] == "graph", f"get_memory without a session: {recalled}")
    check(any(i["id"] == mid for i in recalled["items"]), f"get_memory: {recalled}")

    session_id = f"s-{ns}"
    note = await call_ok(session, "remember", {
        "content": "The user is drafting a talk about Ada Lovelace for Friday.",
        "session_id": session_id,
    })
    check(note["working_memory"], f"remember with session_id: {note}")
    recalled = await call_ok(session, "get_memory", {
        "query": "what talk is the user drafting", "session_id": session_id, "compact": True,
    })
    check(recalled["origin"] == "working", f"get_memory in the session: {recalled}")

    gone = await call_ok(session, "forget", {"ids": [mid]})
    check(gone["deleted"] == 1, f"forget: {gone}")
    after = await call_ok(session, "search_memory", {"query": "Analytical Engine", "namespace": ns})
    check(mid not in [r["id"] for r in after["records"]], "forgotten note still found")

    errors = [
        await call_err(session, "search_memory", {"query": "x", "limit": 0}, "limit"),
        await call_err(session, "search_memory", {"limit": 3}, "query"),
        await call_err(session, "search_memory", {"query": "x", "lmit": 3}, "lmit"),
        await call_err(session, "remember", {"content": 5}, "content"),
        await call_err(session, "get_memory", {"query": "x", "max_depth": 9}, "max_depth"),
        await call_err(session, "memory_feedback",
                       {"query_id": found["query_id"], "memory_ids": [mid], "signal": "loved"}, "signal"),
        await call_err(session, "forget", {"ids": ["not-a-uuid"]}, "ids"),
    ]
    return {"tools": sorted(names), "remembered": mid, "errors": errors}


async def main(argv):
    mode, ns = argv[1], argv[2]
    if mode == "stdio":
        # The server's identity is its own configuration: the key travels in
        # its environment (the SDK passes only a safe default set otherwise).
        env = {k: os.environ[k] for k in ["ENGRAM_API_KEY"] if k in os.environ}
        params = StdioServerParameters(command=argv[3], args=argv[4:], env=env)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                return await probe(session, ns)
    if mode == "http":
        async with streamable_http_client(argv[3]) as (read, write):
            async with ClientSession(read, write) as session:
                return await probe(session, ns)
    raise ProbeError(f"unknown mode {mode}")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    try:
        summary = anyio.run(main, sys.argv)
    except ProbeError as e:
        print(f"probe failed: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(summary))
