//! gRPC contracts of engram (package `engram.v1`): the public gateway
//! (`RetrievalService`, `MemoryService`) and the internal services.

#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("engram.v1");
}

/// Encoded `FileDescriptorSet` of every engram proto, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/engram_descriptor.bin"));

pub use v1::*;

/// The fewest scores a `ScoreResponse` carries when rerank-svc scored only
/// the head of a request (rerank.proto): rerank-svc never cuts a request
/// below it, and the gateway treats a shorter list as malformed.
pub const MIN_RERANK_HEAD: usize = 3;
