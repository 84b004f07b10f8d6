//! Any set of engram's services in one process (`stack`) and the gateway
//! client with an API key (`client`). The `engram` binary, the lab
//! (`engram-lab`: eval, bench, tune) and the integration tests all start
//! services and call the gateway through these two modules; `out` is what
//! the CLI prints with (a closed stdout is an error to return, not a panic);
//! `cli` is the start-up and exit both binaries share.

pub mod cli;
pub mod client;
pub mod out;
pub mod stack;
