//! The `engram` binary's library: the CLI commands (`memories`: list, export,
//! import and wipe what a tenant stored; `mcp`: the MCP server), the JSONL
//! ingest format (`ingest`) and the demo. The lab commands (eval, bench, tune) live in
//! `engram-lab`; starting services (`stack`) and the gateway client
//! (`client`) live in `engram-stack`, shared with the lab, and are
//! re-exported so `engram::stack` and `engram::client` stay the paths the
//! integration tests use.

pub mod commands;
pub mod conflicts;
pub mod demo;
pub mod ingest;
pub mod mcp;
pub mod memories;

pub use engram_stack::{client, stack};
