//! The lab: `engram eval` (recall and latency through the public API),
//! `engram bench` (latency, throughput and RSS on a synthetic tenant, in one
//! process or one per service: `split`) and `engram tune` (fits the per-route
//! fusion weights and the cross-encoder blend offline). None of it serves
//! traffic, so it lives outside the product crate; the `engram` binary
//! flattens [`LabCommand`] into its command line and delegates to [`run`].
//!
//! From the gateway it uses only `retrieval_svc::lab` (the fusion, the route
//! evidence and the blend `engram tune` replays); services are started and
//! called through `engram-stack`.

mod abstain;
mod bench;
mod commands;
mod current_eval;
mod eval;
mod longmemeval;
mod mixed;
mod profile;
pub mod ranker;
pub mod soak;
mod split;
mod tune;
mod updates_eval;
mod visible;

pub use commands::{CorpusFiles, EvalCommon, EvalDataset, LabCommand, RankerAction, run};
