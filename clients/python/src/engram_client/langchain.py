"""engram as a LangChain retriever (``pip install engram-retrieval[langchain]``).

    from engram_client import Engram
    from engram_client.langchain import EngramRetriever

    retriever = EngramRetriever(client=Engram(), limit=5)
    docs = retriever.invoke("where does the user live now?")

Each :class:`~langchain_core.documents.Document` holds a memory's text as
``page_content``, its id as ``id`` and its provenance as ``metadata`` (id,
score, rank, title, namespace, memory_type, event_time, version,
strategies, citation, confidence, the answer's ``query_id`` for
``feedback`` and its ``nothing_relevant`` flag). The documents come in
engram's order: the current version of a fact before an outdated one.

``ainvoke`` uses ``async_client`` (an :class:`~engram_client.AsyncEngram`)
when given, else runs the sync client in a thread. With
``drop_when_nothing_relevant=True`` an answer engram flags as holding
nothing relevant becomes an empty list, so the model is not handed
unrelated memories.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForRetrieverRun,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from pydantic import ConfigDict, Field
except ImportError as e:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "engram_client.langchain needs langchain-core: pip install 'engram-retrieval[langchain]'"
    ) from e

from ._records import metadata, retrieve_kwargs
from .types import RetrieveResult

__all__ = ["EngramRetriever"]


class EngramRetriever(BaseRetriever):
    """Retrieves a tenant's memories from engram for a LangChain chain."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    #: an :class:`~engram_client.Engram`
    client: Any
    #: an :class:`~engram_client.AsyncEngram`, for ``ainvoke``
    async_client: Optional[Any] = None
    #: at most this many documents (engram's default when None)
    limit: Optional[int] = None
    #: only this namespace ("" = the default namespace)
    namespace: str = ""
    #: only these memory types ("episodic", "semantic", "procedural", …)
    memory_types: Sequence[str] = ()
    #: return no documents when engram flags the answer nothing_relevant
    drop_when_nothing_relevant: bool = False
    #: any other ``retrieve`` keyword argument (token_budget, mode, …)
    retrieve_options: Dict[str, Any] = Field(default_factory=dict)

    def _kwargs(self) -> Dict[str, Any]:
        return retrieve_kwargs(self.limit, self.namespace, self.memory_types, self.retrieve_options)

    def _documents(self, answer: RetrieveResult) -> List[Document]:
        if self.drop_when_nothing_relevant and answer.nothing_relevant:
            return []
        return [
            Document(page_content=r.memory.content, id=r.memory.id, metadata=metadata(r, answer))
            for r in answer.records
        ]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> List[Document]:
        return self._documents(self.client.retrieve(query, **self._kwargs()))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> List[Document]:
        if self.async_client is None:
            return await super()._aget_relevant_documents(query, run_manager=run_manager)
        answer = await self.async_client.retrieve(query, **self._kwargs())
        return self._documents(answer)
