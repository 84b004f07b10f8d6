//! What every engram service shares: settings, identity propagation, the
//! embedded Postgres, the project-local installs, conversions and the server
//! scaffolding (health + reflection + graceful shutdown).

pub mod admin;
pub mod bootstrap;
pub mod conn;
pub mod convert;
pub mod db;
pub mod entities;
pub mod identity;
pub mod panic;
pub mod pg;
pub mod scrub;
pub mod sentences;
pub mod server;
pub mod settings;
pub mod telemetry;
pub mod text;
pub mod tls;

pub use identity::{AccessLevel, Identity};
pub use settings::Settings;
