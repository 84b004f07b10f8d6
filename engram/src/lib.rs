//! The `engram` binary's library: the CLI commands (`memories`: list, export,
//! import and wipe what a tenant stored; `mcp`: the MCP server), the JSONL
//! ingest format (`ingest`) and the demo. The lab commands (eval, bench,
//! tune, soak, ranker) live in `engram-lab`, a binary of its own that
//! `lab` runs for them, so this crate links none of it. Starting services
//! (`stack`) and the gateway client
//! (`client`) live in `engram-stack`, shared with the lab, and are
//! re-exported so `engram::stack` and `engram::client` stay the paths the
//! integration tests use.

pub mod commands;
pub mod conflicts;
pub mod demo;
pub mod ingest;
pub mod lab;
pub mod mcp;
pub mod memories;

pub use engram_stack::{client, stack};
