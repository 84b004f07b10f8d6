//! End-to-end: the gateway over the REAL search-, graph- and rerank-svc on
//! port 0, real Postgres (shared test database, fresh tenant), real models.

use std::time::Duration;

use engram_common::settings::ApiKeySettings;
use engram_proto::memory_service_client::MemoryServiceClient;
use engram_proto::retrieval_service_client::RetrievalServiceClient;
use engram_proto::*;
use sha2::Digest;
use tokio::net::TcpListener;
use tonic::Request;

#[tokio::test]
async fn gateway_over_real_services() -> anyhow::Result<()> {
    let pool = engram_common::db::test_database().await?;
    let mut s = engram_common::db::test_settings();
    let tenant = format!("t-{}", uuid::Uuid::new_v4());
    let key = format!("k-{}", uuid::Uuid::new_v4());
    s.auth.internal_token_opt = Some(uuid::Uuid::new_v4().to_string());
    s.auth.api_keys = vec![ApiKeySettings {
        sha256: hex::encode(sha2::Sha256::digest(key.as_bytes())),
        tenant: tenant.clone(),
        agent_id: "e2e".into(),
        trust: "sensitive".into(),
    }];
    let (ls, lg, lr, lgw) = (
        TcpListener::bind("127.0.0.1:0").await?,
        TcpListener::bind("127.0.0.1:0").await?,
        TcpListener::bind("127.0.0.1:0").await?,
        TcpListener::bind("127.0.0.1:0").await?,
    );
    s.downstream.search = format!("http://{}", ls.local_addr()?);
    s.downstream.graph = format!("http://{}", lg.local_addr()?);
    s.downstream.rerank = format!("http://{}", lr.local_addr()?);
    let gw = format!("http://{}", lgw.local_addr()?);
    let never = || std::future::pending::<()>();
    tokio::spawn(search_svc::run(ls, s.clone(), pool.clone(), never()));
    tokio::spawn(graph_svc::run(lg, s.clone(), pool, never()));
    tokio::spawn(rerank_svc::run(lr, s.clone(), never()));
    tokio::spawn(retrieval_svc::run(lgw, s, never()));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let auth = |r: &mut tonic::metadata::MetadataMap| {
        r.insert("x-api-key", key.parse().expect("ascii"));
    };
    let mut mem = MemoryServiceClient::connect(gw.clone()).await?;
    let mut req = Request::new(UpsertRequest {
        memories: [
            (
                "Deploys go through the blue-green pipeline on Fridays.",
                "Deploy",
            ),
            (
                "Rollbacks are triggered by the on-call engineer.",
                "Rollback",
            ),
            ("The cafeteria serves pasta on Tuesdays.", "Cafeteria"),
        ]
        .iter()
        .map(|(c, t)| Memory {
            content: (*c).into(),
            title: (*t).into(),
            ..Default::default()
        })
        .collect(),
    });
    auth(req.metadata_mut());
    mem.upsert(req).await?;
    // graph-svc rebuilds from change notifications.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut c = RetrievalServiceClient::connect(gw).await?;
    for mode in [
        RetrievalMode::Auto,
        RetrievalMode::Vector,
        RetrievalMode::Hybrid,
    ] {
        let mut req = Request::new(RetrieveRequest {
            text: "how do deploys work?".into(),
            mode: mode as i32,
            token_budget: 100,
            no_cache: true,
            ..Default::default()
        });
        auth(req.metadata_mut());
        let r = c.retrieve(req).await?.into_inner();
        eprintln!(
            "{mode:?}: {:.1} ms, stages {:?}",
            r.latency_ms,
            r.stage_latencies
                .iter()
                .map(|s| format!("{}={:.1}", s.stage, s.ms))
                .collect::<Vec<_>>()
        );
        assert!(
            r.degraded_stages.is_empty(),
            "{mode:?}: {:?}",
            r.degraded_stages
        );
        let top = r.records[0].memory.as_ref().map(|m| m.title.clone());
        assert_eq!(top.as_deref(), Some("Deploy"), "{mode:?}");
    }
    Ok(())
}
