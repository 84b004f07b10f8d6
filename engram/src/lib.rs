//! The `engram` binary's library: starting any set of services in one
//! process (`stack`), the client used by the CLI (`client`), the JSONL
//! ingest format (`ingest`) and the demo.

pub mod bench;
pub mod client;
pub mod commands;
pub mod demo;
pub mod eval;
pub mod ingest;
pub mod split;
pub mod stack;
pub mod tune;
