//! The CLI's gRPC client: the public gateway with an API key attached.

use engram_proto::knowledge_foundry_service_client::KnowledgeFoundryServiceClient;
use engram_proto::memory_service_client::MemoryServiceClient;
use engram_proto::retrieval_service_client::RetrievalServiceClient;
use engram_proto::{AddEdgesRequest, Edge};
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::{Channel, Endpoint};

#[derive(Clone)]
pub struct ApiKey(MetadataValue<tonic::metadata::Ascii>);

impl Interceptor for ApiKey {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

pub type Retrieval =
    RetrievalServiceClient<tonic::service::interceptor::InterceptedService<Channel, ApiKey>>;
pub type Memories =
    MemoryServiceClient<tonic::service::interceptor::InterceptedService<Channel, ApiKey>>;
pub type Foundry =
    KnowledgeFoundryServiceClient<tonic::service::interceptor::InterceptedService<Channel, ApiKey>>;

/// The public clients over one channel.
#[derive(Clone)]
pub struct Client {
    pub retrieval: Retrieval,
    pub memories: Memories,
    pub foundry: Foundry,
}

impl Client {
    pub async fn connect(uri: &str, api_key: &str) -> anyhow::Result<Self> {
        let channel = Endpoint::from_shared(uri.to_string())?
            .connect()
            .await
            .map_err(|e| {
                anyhow::anyhow!("cannot reach the gateway at {uri}: {e}; is `engram up` running?")
            })?;
        let key = ApiKey(format!("Bearer {api_key}").parse().map_err(|_| {
            anyhow::anyhow!("the API key contains characters not allowed in metadata")
        })?);
        Ok(Self {
            retrieval: RetrievalServiceClient::with_interceptor(channel.clone(), key.clone())
                .max_decoding_message_size(64 << 20),
            foundry: KnowledgeFoundryServiceClient::with_interceptor(channel.clone(), key.clone())
                .max_decoding_message_size(64 << 20),
            memories: MemoryServiceClient::with_interceptor(channel, key)
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20),
        })
    }

    /// Adds `edges` through the gateway, [`EDGE_BATCH`] per call; returns
    /// how many were new. No call at all for no edges.
    pub async fn add_edges(&mut self, edges: &[Edge]) -> anyhow::Result<u64> {
        let mut added = 0;
        for chunk in edges.chunks(EDGE_BATCH) {
            let r = self
                .memories
                .add_edges(AddEdgesRequest {
                    edges: chunk.to_vec(),
                })
                .await?;
            added += u64::from(r.into_inner().added);
        }
        Ok(added)
    }
}

/// Edges per AddEdges call: search-svc writes at most 1,000 per batch.
pub const EDGE_BATCH: usize = 1000;

/// Memories per Upsert call of a bulk load (`engram ingest`, and the bench's
/// figure of it).
pub const INGEST_BATCH: usize = 500;

/// Upsert calls of a bulk load in flight at once: one batch embeds while
/// the other writes.
pub const INGEST_IN_FLIGHT: usize = 2;
