//! The one error type of graph-svc and its single mapping to gRPC status.

use engram_common::identity::IdentityError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input, already phrased as `field: rule`.
    #[error("{0}")]
    InvalidArgument(String),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("internal error: {0}")]
    Internal(String),
    /// The tenant's first graph load is still running in the background:
    /// the query degrades rather than wait past its bound.
    #[error("tenant graph is loading")]
    Loading,
    /// A shared first load failed; already mapped (and logged) once.
    #[error("graph load failed: {}", .0.message())]
    Load(tonic::Status),
}

impl Error {
    pub fn invalid(field: impl std::fmt::Display, rule: impl std::fmt::Display) -> Self {
        Self::InvalidArgument(format!("{field}: {rule}"))
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument(m) => tonic::Status::invalid_argument(m),
            Error::Identity(e) => e.into(),
            Error::Database(e) => {
                tracing::error!(error = %e, "database error");
                match e {
                    sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => {
                        tonic::Status::unavailable("graph store unavailable")
                    }
                    _ => tonic::Status::internal("graph store error"),
                }
            }
            Error::Internal(m) => {
                tracing::error!(error = %m, "internal error");
                tonic::Status::internal("internal error")
            }
            // RESOURCE_EXHAUSTED: the gateway's breaker counts it neutral
            // and does not retry it; its pipeline degrades the graph list.
            Error::Loading => {
                tonic::Status::resource_exhausted("tenant graph is loading; retry shortly")
            }
            Error::Load(status) => status,
        }
    }
}
