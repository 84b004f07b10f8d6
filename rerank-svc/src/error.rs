//! The one error type of rerank-svc and its single mapping to gRPC status.

use engram_common::identity::IdentityError;
use engram_models::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input, already phrased as `field: rule`.
    #[error("{0}")]
    InvalidArgument(String),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// No cross-encoder is loaded; retrying will not help until it is installed.
    #[error("cross-encoder unavailable: {0}")]
    ModelUnavailable(String),
    /// The bulkhead is full: the caller should skip reranking, not wait.
    #[error("rerank queue is full ({capacity} waiting)")]
    Overloaded { capacity: usize },
    /// The queue ahead and this request's pairs would take longer than the
    /// caller's deadline leaves: skipped before it takes any CPU.
    #[error(
        "rerank would take ~{estimate_ms} ms with {left_ms} ms left before the deadline; skipped"
    )]
    TooLate { estimate_ms: u64, left_ms: u64 },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub fn too_late(late: crate::backlog::Late) -> Self {
        Self::TooLate {
            estimate_ms: late.estimate.as_millis() as u64,
            left_ms: late.left.as_millis() as u64,
        }
    }

    pub fn invalid(field: impl std::fmt::Display, rule: impl std::fmt::Display) -> Self {
        Self::InvalidArgument(format!("{field}: {rule}"))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument(m) => tonic::Status::invalid_argument(m),
            Error::Identity(e) => e.into(),
            Error::ModelUnavailable(_) => tonic::Status::failed_precondition(e.to_string()),
            Error::Overloaded { .. } | Error::TooLate { .. } => {
                tonic::Status::resource_exhausted(e.to_string())
            }
            Error::Model(ModelError::InvalidArgument(m)) => {
                tonic::Status::invalid_argument(format!("max_length: {m}"))
            }
            Error::Model(e) => {
                tracing::error!(error = %e, "cross-encoder failed");
                tonic::Status::internal("cross-encoder failed")
            }
            Error::Internal(m) => {
                tracing::error!(error = %m, "internal error");
                tonic::Status::internal("internal error")
            }
        }
    }
}
