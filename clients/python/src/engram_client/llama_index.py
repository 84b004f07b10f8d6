"""engram as a LlamaIndex retriever (``pip install engram-retrieval[llama-index]``).

    from engram_client import Engram
    from engram_client.llama_index import EngramRetriever

    retriever = EngramRetriever(Engram(), limit=5)
    nodes = retriever.retrieve("where does the user live now?")

Each :class:`~llama_index.core.schema.NodeWithScore` holds a
:class:`~llama_index.core.schema.TextNode` whose ``id_`` is the memory's
id, ``text`` its content and ``metadata`` its provenance (the same keys as
the LangChain retriever's), scored by engram's score, in engram's order.
``aretrieve`` uses ``async_client`` when given, else the sync client. With
``drop_when_nothing_relevant=True`` an answer engram flags as holding
nothing relevant becomes an empty list.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional, Sequence

try:
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as e:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "engram_client.llama_index needs llama-index-core: "
        "pip install 'engram-retrieval[llama-index]'"
    ) from e

from ._records import metadata, retrieve_kwargs
from .types import RetrieveResult

__all__ = ["EngramRetriever"]


class EngramRetriever(BaseRetriever):
    """Retrieves a tenant's memories from engram for a LlamaIndex query."""

    def __init__(
        self,
        client: Any,
        *,
        async_client: Optional[Any] = None,
        limit: Optional[int] = None,
        namespace: str = "",
        memory_types: Sequence[str] = (),
        drop_when_nothing_relevant: bool = False,
        retrieve_options: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        self.client = client
        self.async_client = async_client
        self.drop_when_nothing_relevant = drop_when_nothing_relevant
        self._options = retrieve_kwargs(limit, namespace, memory_types, retrieve_options or {})
        super().__init__(**kwargs)

    def _nodes(self, answer: RetrieveResult) -> List[NodeWithScore]:
        if self.drop_when_nothing_relevant and answer.nothing_relevant:
            return []
        return [
            NodeWithScore(
                node=TextNode(id_=r.memory.id, text=r.memory.content, metadata=metadata(r, answer)),
                score=r.score,
            )
            for r in answer.records
        ]

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        return self._nodes(self.client.retrieve(query_bundle.query_str, **self._options))

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        if self.async_client is None:
            return await asyncio.to_thread(self._retrieve, query_bundle)
        answer = await self.async_client.retrieve(query_bundle.query_str, **self._options)
        return self._nodes(answer)
