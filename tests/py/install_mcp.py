"""Installs the official MCP Python SDK that tests/mcp.rs drives `engram mcp` with.

The client must share no code with the server (rmcp), hence Python's `mcp`.
Every package of its dependency tree is pinned (as pip resolved mcp==2.3.0
for CPython 3.11 on Linux) and installed with --no-deps, so a fresh machine
gets exactly what was tested; platform wheels (cffi, cryptography,
pydantic-core, rpds-py) come from PyPI for the machine's Python.

Usage: python3 tests/py/install_mcp.py ENGRAM_HOME
Prints the install directory (HOME/mcptools); installs only when its
marker differs from the pins below.
"""

import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
from _pinned import install_pins

PKGS = [
    "mcp==2.3.0",
    "mcp-types==2.3.0",
    "annotated-types==0.8.0",
    "anyio==4.16.0",
    "attrs==26.1.0",
    "cffi==2.1.1",
    "click==8.5.1",
    "cryptography==50.0.2",
    "h11==0.16.0",
    "httpcore2==2.16.2",
    "httpx2==2.16.2",
    "idna==3.20",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "opentelemetry-api==1.45.2",
    "pycparser==3.12",
    "pydantic==2.14.3",
    "pydantic-core==2.50.4",
    "pyjwt==2.15.1",
    "python-multipart==0.0.34",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "sse-starlette==3.7.0",
    "starlette==1.10.0",
    "truststore==0.10.5",
    "typing-extensions==4.16.0",
    "typing-inspection==0.4.5",
    "uvicorn==0.54.0",
]
MARKER = ".engram-mcptools"


def install(home):
    """Into HOME/mcptools, atomically: a half-finished install is never seen."""
    return install_pins(os.path.join(home, "mcptools"), PKGS, MARKER)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(install(sys.argv[1]))
