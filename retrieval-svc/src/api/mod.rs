//! Thin adapters from the wire to the gateway: each handler authenticates,
//! validates with a `TryFrom` of the request, makes one call into the
//! pipeline or a surface, and maps the error to a gRPC or HTTP status.

pub mod checks;
pub mod conflicts;
pub mod console;
pub mod foundry;
pub mod http;
pub mod memory;
pub mod openapi;
pub mod rest;
pub mod retrieval;
pub mod status;
pub mod working;
