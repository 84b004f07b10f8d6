"""Python client for engram, the retrieval service for AI agents' long-term
memory.

    from engram_client import Engram

    with Engram() as engram:            # ENGRAM_URL, ENGRAM_API_KEY
        engram.remember("The user prefers green tea.")
        for r in engram.retrieve("what does the user drink?").records:
            print(r.rank, r.content, r.provenance.citation)

:class:`AsyncEngram` has the same methods as coroutines. Failures raise
:class:`EngramError` subclasses; :class:`InvalidArgument` carries the
offending ``field`` and its ``rule``.
"""

from .client import DEFAULT_TARGET, DEFAULT_TIMEOUT, VERSION, AsyncEngram, Engram
from . import errors as _errors
from .errors import *  # noqa: F401,F403
from .types import *  # noqa: F401,F403
from .types import __all__ as _types_all

__version__ = VERSION

__all__ = (
    ["Engram", "AsyncEngram", "DEFAULT_TARGET", "DEFAULT_TIMEOUT"]
    # The exception types; parse_invalid_argument stays in engram_client.errors.
    + [n for n in _errors.__all__ if n != "parse_invalid_argument"]
    + list(_types_all)
)
