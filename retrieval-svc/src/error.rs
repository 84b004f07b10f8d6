//! The gateway's one error type. Every failure path ends here so the mapping
//! to gRPC status codes is decided in exactly one exhaustive match.

use tonic::Status;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid argument {field}: {rule}")]
    InvalidArgument { field: &'static str, rule: String },
    #[error("unauthenticated: {0}")]
    Unauthenticated(&'static str),
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// Every Stage 2 strategy failed or its breaker is open.
    #[error("retrieval circuit open")]
    RetrievalCircuitOpen,
    /// Every Stage 2 strategy ran past its own timeout (no breaker open):
    /// transient, so UNAVAILABLE (retryable) too, but said as it is.
    #[error("every search strategy timed out")]
    RetrievalTimedOut,
    #[error("pipeline deadline exceeded before any result")]
    DeadlineExceeded,
    /// A pass-through call (write path) failed downstream.
    #[error("{service} failed: {status}")]
    Downstream {
        service: &'static str,
        status: Status,
    },
    #[error("{service} unavailable: {reason}")]
    DownstreamUnavailable {
        service: &'static str,
        reason: String,
    },
    /// The caller's tenant is over its rate or concurrency share.
    #[error("tenant limit: {what}; retry after {retry_after_ms} ms")]
    TenantLimit {
        what: &'static str,
        retry_after_ms: u64,
    },
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    pub fn invalid(field: &'static str, rule: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field,
            rule: rule.into(),
        }
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        let msg = e.to_string();
        match e {
            Error::InvalidArgument { .. } => Status::invalid_argument(msg),
            Error::Unauthenticated(_) => Status::unauthenticated(msg),
            Error::PermissionDenied(_) => Status::permission_denied(msg),
            Error::RetrievalCircuitOpen | Error::RetrievalTimedOut => Status::unavailable(msg),
            Error::DeadlineExceeded => Status::deadline_exceeded(msg),
            // Client-side mistakes reported by the downstream keep their code;
            // everything else is the gateway's dependency failing.
            Error::Downstream { service, status } => match status.code() {
                tonic::Code::InvalidArgument
                | tonic::Code::NotFound
                | tonic::Code::AlreadyExists
                | tonic::Code::PermissionDenied
                | tonic::Code::FailedPrecondition
                | tonic::Code::OutOfRange
                | tonic::Code::ResourceExhausted => {
                    Status::new(status.code(), format!("{service}: {}", status.message()))
                }
                // The downstream's own words (a query, a path, a panic) are
                // for the log; the caller learns which service and how.
                tonic::Code::DeadlineExceeded => {
                    tracing::warn!(service, status = %status, "downstream call ran out of time");
                    Status::deadline_exceeded(format!("{service} failed: deadline exceeded"))
                }
                code => {
                    tracing::error!(service, status = %status, "downstream call failed");
                    Status::unavailable(format!("{service} failed: {code:?}"))
                }
            },
            Error::DownstreamUnavailable { .. } => Status::unavailable(msg),
            // The retry hint also travels as metadata a client can read
            // without parsing the message.
            Error::TenantLimit { retry_after_ms, .. } => {
                let mut status = Status::resource_exhausted(msg);
                if let Ok(v) = retry_after_ms.to_string().parse() {
                    status.metadata_mut().insert("retry-after-ms", v);
                }
                status
            }
            // A fixed message, as graph-svc, rerank-svc and search-svc
            // answer: the detail is logged here, never sent.
            Error::Internal(detail) => {
                tracing::error!(error = %detail, "internal error");
                Status::internal("internal error")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_mapped() {
        let s: Status = Error::invalid("text", "must not be empty").into();
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(s.message().contains("text"));
        let s: Status = Error::RetrievalCircuitOpen.into();
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert!(s.message().contains("retrieval circuit open"));
        let s: Status = Error::Downstream {
            service: "search",
            status: Status::invalid_argument("bad id"),
        }
        .into();
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
    }

    /// An internal failure, the gateway's own or a downstream's, answers a
    /// fixed message naming at most the service and the code: never the
    /// detail (a query, a path, a secret), which is logged instead (issue
    /// 47, item 20).
    #[test]
    fn internal_details_never_reach_the_caller() {
        let secret = "SELECT content FROM memories WHERE tenant_id = 'acme' -- password=hunter2";
        let s: Status = Error::Internal(secret.into()).into();
        assert_eq!(s.code(), tonic::Code::Internal);
        assert_eq!(s.message(), "internal error");
        for (code, want) in [
            (tonic::Code::Internal, tonic::Code::Unavailable),
            (tonic::Code::Unknown, tonic::Code::Unavailable),
            (tonic::Code::DataLoss, tonic::Code::Unavailable),
            (tonic::Code::DeadlineExceeded, tonic::Code::DeadlineExceeded),
        ] {
            let s: Status = Error::Downstream {
                service: "search",
                status: Status::new(code, secret),
            }
            .into();
            assert_eq!(s.code(), want, "{code:?}");
            assert!(s.message().starts_with("search failed"), "{s}");
            assert!(!s.to_string().contains("hunter2"), "{code:?}: {s}");
        }
    }
}
