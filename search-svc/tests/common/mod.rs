//! Test harness: the real service on port 0 against the shared test Postgres.
#![allow(dead_code)]

use std::sync::OnceLock;

use engram_common::db::{test_database, test_settings};
use engram_common::{AccessLevel, Identity};
use engram_proto as pb;
use engram_proto::search_service_client::SearchServiceClient;
use search_svc::{Embeddings, SearchSvc, serve_svc};
use sqlx::PgPool;
use tonic::transport::Channel;

pub const TOKEN: &str = "test-internal-token";

pub type Client = SearchServiceClient<Channel>;

/// One model load per test binary.
pub fn embeddings() -> Embeddings {
    static E: OnceLock<Embeddings> = OnceLock::new();
    E.get_or_init(|| Embeddings::load_blocking(&test_settings()))
        .clone()
}

pub struct Harness {
    pub client: Client,
    pub pool: PgPool,
    /// The service itself, for what gRPC does not show (the keyword
    /// index's state).
    pub svc: SearchSvc,
    pub addr: std::net::SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

pub async fn start_with(embeddings: Embeddings, scoring: &str) -> Harness {
    start_configured(embeddings, |s| s.search.keyword_scoring = scoring.into()).await
}

/// The service with test settings changed by `configure`.
pub async fn start_configured(
    embeddings: Embeddings,
    configure: impl FnOnce(&mut engram_common::Settings),
) -> Harness {
    let pool = test_database().await.expect("test database");
    let mut settings = test_settings();
    settings.auth.internal_token_opt = Some(TOKEN.into());
    configure(&mut settings);
    let svc = SearchSvc::new(&settings, pool.clone(), embeddings).expect("svc");
    let served = svc.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = serve_svc(listener, served, async move {
            let _ = rx.await;
        })
        .await;
    });
    let client = connect(addr).await;
    Harness {
        client,
        pool,
        svc,
        addr,
        _stop: tx,
    }
}

pub async fn connect(addr: std::net::SocketAddr) -> Client {
    for _ in 0..50 {
        if let Ok(c) = SearchServiceClient::connect(format!("http://{addr}")).await {
            return c.max_decoding_message_size(64 << 20);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("server did not come up");
}

pub async fn start() -> Harness {
    start_with(embeddings(), "bm25").await
}

pub fn tenant() -> String {
    format!("t-{}", uuid::Uuid::new_v4())
}

pub fn ident(tenant: &str, agent: &str, trust: AccessLevel) -> Identity {
    Identity {
        tenant: tenant.into(),
        agent_id: agent.into(),
        trust,
    }
}

pub fn req<T>(msg: T, id: &Identity) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    id.write_internal(r.metadata_mut(), TOKEN);
    r
}

pub fn mem(id: &str, title: &str, content: &str) -> pb::Memory {
    pb::Memory {
        id: id.into(),
        title: title.into(),
        content: content.into(),
        ..Default::default()
    }
}

/// A unit vector along axis `i` (plus a shared component so cosine ties
/// are avoided), for client-supplied embeddings.
pub fn axis(i: usize) -> Vec<f32> {
    let mut v = vec![0.01f32; 384];
    v[i % 384] = 1.0;
    v
}

pub async fn upsert(
    c: &mut Client,
    id: &Identity,
    memories: Vec<pb::Memory>,
) -> pb::UpsertResponse {
    c.upsert(req(pb::UpsertRequest { memories }, id))
        .await
        .expect("upsert")
        .into_inner()
}

pub async fn keyword(
    c: &mut Client,
    id: &Identity,
    text: &str,
    filters: Option<pb::Filters>,
    k: u32,
) -> Vec<pb::SearchHit> {
    c.keyword_search(req(
        pb::KeywordSearchRequest {
            text: text.into(),
            filters,
            k,
        },
        id,
    ))
    .await
    .expect("keyword search")
    .into_inner()
    .hits
}

pub async fn dense(
    c: &mut Client,
    id: &Identity,
    embedding: Vec<f32>,
    filters: Option<pb::Filters>,
    k: u32,
) -> Vec<pb::SearchHit> {
    c.vector_search(req(
        pb::VectorSearchRequest {
            text: String::new(),
            embedding,
            filters,
            k,
            fact_k: 0,
        },
        id,
    ))
    .await
    .expect("vector search")
    .into_inner()
    .hits
}

/// The fact index's sentences nearest `embedding` (no hits asked for).
pub async fn dense_facts(
    c: &mut Client,
    id: &Identity,
    embedding: Vec<f32>,
    fact_k: u32,
) -> Vec<pb::FactHit> {
    c.vector_search(req(
        pb::VectorSearchRequest {
            text: String::new(),
            embedding,
            filters: None,
            k: 1,
            fact_k,
        },
        id,
    ))
    .await
    .expect("vector search with facts")
    .into_inner()
    .facts
}

/// Keyword-searches as `id` until the tenant's keyword index holds every
/// write so far (a search is what schedules its build or update) and still
/// does 150 ms later (each write's notification comes back through the
/// change feed a moment after it and makes the index catch up once more),
/// so the searches after it are answered by the index rather than by SQL.
pub async fn wait_keyword_index(h: &Harness, id: &Identity) {
    let mut client = h.client.clone();
    let current = || h.svc.keyword_index().is_current(&id.tenant);
    for _ in 0..500 {
        if current() {
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            if current() {
                return;
            }
        }
        keyword(&mut client, id, "index", None, 1).await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the keyword index of {} never became current", id.tenant);
}

pub fn ids(hits: &[pb::SearchHit]) -> Vec<String> {
    let mut v: Vec<String> = hits
        .iter()
        .filter_map(|h| h.memory.as_ref().map(|m| m.id.clone()))
        .collect();
    v.sort();
    v
}
