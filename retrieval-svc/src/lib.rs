//! The public gateway: RetrievalService (the six-stage pipeline) and
//! MemoryService (the write front), talking to search-, graph- and
//! rerank-svc only over gRPC through one resilience stack per RPC.

pub mod assembly;
pub mod auth;
pub mod cache;
pub mod conversation;
pub mod decompose;
pub mod demand;
pub mod downstream;
pub mod error;
pub mod evidence;
pub mod feedback;
pub mod foundry;
pub mod fusion;
pub mod http;
pub mod llm;
pub mod metrics;
pub mod router;
pub mod search;
pub mod service;
pub mod validation;
pub mod working;

/// The small surface the lab (`engram tune`, `engram eval`) replays
/// offline: the gateway's own fusion, evidence routing, cross-encoder blend
/// and passage format, so what is fitted is exactly what runs.
pub mod lab {
    pub use crate::assembly::blend;
    pub use crate::evidence::{Evidence, route as route_by_evidence};
    pub use crate::fusion::{rank_fusion, weights_for};
    pub use crate::router::{Route, classify};
    pub use crate::validation::passage;
}

use std::future::Future;

use engram_common::Settings;
use engram_proto::knowledge_foundry_service_server::KnowledgeFoundryServiceServer;
use engram_proto::memory_service_server::MemoryServiceServer;
use engram_proto::retrieval_service_server::RetrievalServiceServer;
use engram_proto::working_memory_service_server::WorkingMemoryServiceServer;
use tokio::net::TcpListener;
use tonic::service::Routes;

pub use service::Gateway;

/// Serves the gateway on `listener` until `shutdown`. Downstream channels
/// connect lazily, so a downstream that is not up yet is not an error here.
pub async fn run(
    listener: TcpListener,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if settings
        .auth
        .internal_token_opt
        .as_deref()
        .is_none_or(str::is_empty)
    {
        tracing::warn!("no internal token configured: downstream calls will be refused");
    }
    serve_gateway(listener, Gateway::new(settings)?, shutdown).await
}

/// [`run`] with a gateway built by the caller, so the same instance can also
/// back the HTTP JSON API and the admin `/metrics` ([`Gateway::metrics_text`]).
pub async fn serve_gateway(
    listener: TcpListener,
    gateway: Gateway,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let opts = engram_common::server::ServeOptions::from(&gateway.settings().listen);
    let (reporter, health) = engram_common::server::health();
    reporter
        .set_serving::<RetrievalServiceServer<conversation::FailOpen>>()
        .await;
    reporter.set_serving::<MemoryServiceServer<Gateway>>().await;
    reporter
        .set_serving::<WorkingMemoryServiceServer<working::Working>>()
        .await;
    reporter
        .set_serving::<KnowledgeFoundryServiceServer<foundry::Foundry>>()
        .await;
    let routes = Routes::new(RetrievalServiceServer::new(conversation::FailOpen(
        gateway.clone(),
    )))
    .add_service(KnowledgeFoundryServiceServer::new(foundry::Foundry(
        gateway.clone(),
    )))
    .add_service(WorkingMemoryServiceServer::new(working::Working(
        gateway.clone(),
    )))
    .add_service(MemoryServiceServer::new(gateway));
    tracing::info!(addr = ?listener.local_addr().ok(), "retrieval gateway listening");
    engram_common::server::serve_with(listener, routes, health, opts, shutdown).await?;
    Ok(())
}
