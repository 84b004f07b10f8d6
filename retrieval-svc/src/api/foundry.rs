//! `KnowledgeFoundryService`: authenticate, validate, then basic or agentic
//! retrieval (surfaces/foundry.rs).

use engram_proto::knowledge_foundry_service_server::KnowledgeFoundryService;
use engram_proto::{AgenticRetrieveRequest, BasicRetrieveRequest, FoundryResponse};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::gateway::Gateway;
use crate::metrics::FoundryOutcome;
use crate::surfaces::foundry::{AGENTIC_IN_FLIGHT, Agentic, Basic, agentic, basic};

/// The gRPC `KnowledgeFoundryService` over a shared [`Gateway`].
#[derive(Clone)]
pub struct Foundry(pub Gateway);

#[tonic::async_trait]
impl KnowledgeFoundryService for Foundry {
    async fn retrieve_basic(
        &self,
        request: Request<BasicRetrieveRequest>,
    ) -> Result<Response<FoundryResponse>, Status> {
        let start = Instant::now();
        let r = async {
            let identity = self.0.authenticate(request.metadata())?;
            let _permit = self.0.admit(&identity, 1)?;
            let deadline = self.0.deadline(request.metadata(), start);
            let b = Basic::try_from(request.into_inner())?;
            basic(&self.0, identity, b, start, deadline).await
        }
        .await;
        observe(&self.0, "basic", start, &r);
        Ok(Response::new(r?))
    }

    async fn retrieve_agentic(
        &self,
        request: Request<AgenticRetrieveRequest>,
    ) -> Result<Response<FoundryResponse>, Status> {
        let start = Instant::now();
        let r = async {
            let identity = self.0.authenticate(request.metadata())?;
            let _permit = self.0.admit(&identity, AGENTIC_IN_FLIGHT)?;
            let a = Agentic::try_from(request.into_inner())?;
            agentic(&self.0, identity, a, start).await
        }
        .await;
        observe(&self.0, "agentic", start, &r);
        Ok(Response::new(r?))
    }
}

/// The `kf_retrieval_*` families, for every outcome (refusals included).
pub fn observe(
    gw: &Gateway,
    mode: &'static str,
    start: Instant,
    r: &Result<FoundryResponse, Error>,
) {
    let (outcome, results, tokens, steps) = match r {
        Ok(resp) if resp.truncated => (
            "truncated",
            resp.results.len(),
            resp.total_tokens_used,
            resp.steps.len(),
        ),
        Ok(resp) => (
            "ok",
            resp.results.len(),
            resp.total_tokens_used,
            resp.steps.len(),
        ),
        Err(_) => ("error", 0, 0, 0),
    };
    gw.metrics().observe_foundry(&FoundryOutcome {
        mode,
        outcome,
        elapsed: start.elapsed(),
        results,
        tokens,
        steps,
    });
}
