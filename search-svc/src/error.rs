//! The one error type of search-svc and its single mapping to gRPC status
//! codes, so every handler reports the same failure the same way.

use engram_common::identity::IdentityError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input, already phrased as `field: rule`.
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    NotFound(String),
    /// The embedding model is not loaded and the call needs it.
    #[error("{0}")]
    ModelUnavailable(String),
    /// Concurrent writers kept changing the same rows; the client may retry.
    #[error("{0}")]
    Conflict(String),
    /// Every request slot is taken (`search.max_concurrent_requests`).
    #[error("{0}")]
    Busy(String),
    /// The database cannot be reached; nothing was applied and the caller
    /// may retry.
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("embedding failed: {0}")]
    Embedding(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub fn invalid(field: impl std::fmt::Display, rule: impl std::fmt::Display) -> Self {
        Self::InvalidArgument(format!("{field}: {rule}"))
    }

    /// Deadlocks and serialization failures are worth one more attempt.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Database(sqlx::Error::Database(db)) => {
                matches!(db.code().as_deref(), Some("40P01" | "40001"))
            }
            Self::Conflict(_) => true,
            _ => false,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument(m) => tonic::Status::invalid_argument(m),
            Error::PermissionDenied(m) => tonic::Status::permission_denied(m),
            Error::NotFound(m) => tonic::Status::not_found(m),
            Error::ModelUnavailable(m) => tonic::Status::failed_precondition(m),
            Error::Conflict(m) => tonic::Status::aborted(m),
            Error::Busy(m) => tonic::Status::resource_exhausted(m),
            Error::Unavailable(m) => tonic::Status::unavailable(m),
            Error::Identity(e) => e.into(),
            // query_canceled: our statement_timeout (bounds.rs) stopped a
            // statement that ran too long. The call ran out of time, which
            // is what DEADLINE_EXCEEDED says; it is not a server bug.
            Error::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("57014") => {
                tracing::warn!(error = %db, "database statement timed out");
                tonic::Status::deadline_exceeded("database statement timed out")
            }
            // A deadlock or a serialization failure: two callers' work met,
            // nothing is broken, and the same call again may pass.
            Error::Database(sqlx::Error::Database(db))
                if matches!(db.code().as_deref(), Some("40P01" | "40001")) =>
            {
                tracing::warn!(error = %db, "transaction conflict");
                tonic::Status::aborted("transaction conflict; retry")
            }
            // Data exceptions (SQLSTATE class 22: a value Postgres cannot
            // store or compare) are the caller's input, not our failure;
            // the boundary should have named the field already.
            Error::Database(sqlx::Error::Database(db))
                if db.code().is_some_and(|c| c.starts_with("22")) =>
            {
                tracing::warn!(error = %db, "database refused a value");
                tonic::Status::invalid_argument(format!("invalid value: {}", db.message()))
            }
            Error::Database(e) => {
                tracing::error!(error = %e, "database error");
                match e {
                    sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) => {
                        tonic::Status::unavailable("database unavailable")
                    }
                    _ => tonic::Status::internal("database error"),
                }
            }
            // The detail (a model path, a task's panic, a query) is for the
            // log, never for the caller, as in graph-svc and rerank-svc.
            Error::Embedding(m) => {
                tracing::error!(error = %m, "embedding failed");
                tonic::Status::internal("embedding failed")
            }
            Error::Internal(m) => {
                tracing::error!(error = %m, "internal error");
                tonic::Status::internal("internal error")
            }
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Internal failures answer a fixed message; the detail goes to the log
    /// only (issue 47, item 20: it reached the gateway's callers).
    #[test]
    fn internal_details_never_reach_the_caller() {
        let secret = "SELECT content FROM memories WHERE tenant_id = 'acme' -- password=hunter2";
        for (e, message) in [
            (Error::Internal(secret.into()), "internal error"),
            (Error::Embedding(secret.into()), "embedding failed"),
            (
                Error::Database(sqlx::Error::Protocol(secret.into())),
                "database error",
            ),
        ] {
            let s = tonic::Status::from(e);
            assert_eq!(s.code(), tonic::Code::Internal);
            assert_eq!(s.message(), message);
            assert!(!s.to_string().contains("hunter2"), "{s}");
        }
        // The caller's own mistakes still name the field.
        let s = tonic::Status::from(Error::invalid("ids", "must not be empty"));
        assert_eq!(s.message(), "ids: must not be empty");
    }
}
