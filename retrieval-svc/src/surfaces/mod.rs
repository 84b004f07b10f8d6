//! What the gateway offers around the pipeline: working memory (Layer 6),
//! Knowledge Foundry basic / agentic retrieval with its rule-based
//! decomposition, demand tracking, HyDE for conversation windows, the
//! optional LLM client, and the write front. Surfaces call the pipeline;
//! the pipeline never calls them.

pub mod changes;
pub mod conversation;
pub mod decompose;
pub mod demand;
pub mod foundry;
pub mod llm;
pub mod working;
pub mod writes;
