//! `RetrievalService`: authenticate, HyDE for a conversation window, the
//! validated query, one pipeline run; and `fail_open`, for agents that must
//! never block on memory: they would rather act without it than wait on an
//! error, so a runtime failure becomes an empty, degraded answer.

use engram_proto::retrieval_service_server::RetrievalService;
use engram_proto::{FeedbackRequest, FeedbackResponse, RetrieveRequest, RetrieveResponse};
use tokio::time::Instant;
use tonic::{Code, Request, Response, Status};

use crate::gateway::Gateway;
use crate::pipeline::ctx::ms_since;
use crate::pipeline::feedback::Feedback;
use crate::query::Query;
use crate::surfaces::conversation;

#[derive(Clone)]
pub struct Retrieval(pub Gateway);

#[tonic::async_trait]
impl RetrievalService for Retrieval {
    async fn retrieve(
        &self,
        request: Request<RetrieveRequest>,
    ) -> Result<Response<RetrieveResponse>, Status> {
        let start = Instant::now();
        let fail_open = request.get_ref().fail_open;
        match retrieve_common(&self.0, request, start).await {
            Ok(r) => Ok(Response::new(r)),
            Err(status) if fail_open && is_runtime_failure(status.code()) => {
                tracing::warn!(code = ?status.code(), "retrieval failed open");
                Ok(Response::new(RetrieveResponse {
                    query_id: uuid::Uuid::new_v4().to_string(),
                    degraded_stages: vec!["fail_open".into()],
                    latency_ms: ms_since(start),
                    ..Default::default()
                }))
            }
            Err(status) => Err(status),
        }
    }

    async fn feedback(
        &self,
        request: Request<FeedbackRequest>,
    ) -> Result<Response<FeedbackResponse>, Status> {
        let identity = self.0.authenticate(request.metadata())?;
        let _permit = self.0.admit(&identity, 1)?;
        let feedback = Feedback::try_from(request.into_inner())?;
        let accepted = self.0.pipeline().feedback(identity, feedback)?;
        Ok(Response::new(FeedbackResponse { accepted }))
    }
}

/// One `Retrieve`, under one deadline from its arrival: the ceiling, or the
/// caller's shorter one. HyDE runs inside it (at most half of what is left)
/// and never for a turn that was already answered.
async fn retrieve_common(
    gw: &Gateway,
    request: Request<RetrieveRequest>,
    start: Instant,
) -> Result<RetrieveResponse, Status> {
    let deadline = gw.deadline(request.metadata(), start);
    let identity = gw.authenticate(request.metadata())?;
    let _permit = gw.admit_costing(&identity, crate::query::read_cost(request.get_ref()))?;
    let mut req = request.into_inner();
    let answered =
        !req.turn_id.is_empty() && gw.pipeline().caches().has_turn(&identity, &req.turn_id);
    if !answered && let Some(h) = conversation::hypotheses(gw, &identity, &req, deadline).await {
        req.hypotheses = h;
    }
    let q = Query::try_from(req)?;
    Ok(gw.retrieve(identity, q, start, deadline).await?)
}

/// Failures the caller cannot fix by changing the request: these are the
/// ones `fail_open` turns into an empty answer.
fn is_runtime_failure(code: Code) -> bool {
    !matches!(
        code,
        Code::InvalidArgument | Code::Unauthenticated | Code::PermissionDenied
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_runtime_failures_fail_open() {
        assert!(is_runtime_failure(Code::Unavailable));
        assert!(is_runtime_failure(Code::DeadlineExceeded));
        assert!(is_runtime_failure(Code::Internal));
        assert!(!is_runtime_failure(Code::InvalidArgument));
        assert!(!is_runtime_failure(Code::Unauthenticated));
    }
}
