//! The `engram` binary's library: the CLI commands, the JSONL ingest format
//! (`ingest`) and the demo. Starting services (`stack`) and the gateway
//! client (`client`) live in `engram-stack`, shared with the lab; they are
//! re-exported so `engram::stack` and `engram::client` stay the paths the
//! integration tests use.

pub mod bench;
pub mod commands;
pub mod demo;
pub mod eval;
pub mod ingest;
pub mod split;
pub mod tune;

pub use engram_stack::{client, stack};
