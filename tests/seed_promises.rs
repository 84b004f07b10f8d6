//! What the seed documents promise, checked end to end (issue 17): each test
//! reproduces a defect on the real stack (every service on port 0, the
//! shared test Postgres) and proves it gone.

use engram::client::Client;
use engram::stack::{Service, Stack};
use engram_proto::{Memory, RetrievalMode, RetrieveRequest, TimeRange, UpsertRequest};
use engram_tests::TestStack;
use prost_types::Timestamp;

fn at(seconds: i64) -> Option<Timestamp> {
    Some(Timestamp { seconds, nanos: 0 })
}

#[tokio::test]
async fn a_retry_never_widens_what_the_caller_set() -> anyhow::Result<()> {
    let ts = TestStack::start("internal").await?;
    let mut c = ts.client().await?;
    let t0 = 1_700_000_000;
    // Nothing inside the window, or above the confidence floor: the first
    // attempt finds nothing, and every retry must still find nothing.
    let outside = Memory {
        content: "The quarterly rollout of the billing migration slipped a week.".into(),
        event_time: at(t0 + 120),
        ..Default::default()
    };
    let doubtful = Memory {
        content: "The quarterly rollout of the billing migration may slip.".into(),
        event_time: at(t0 + 50),
        source_confidence: Some(0.4),
        ..Default::default()
    };
    c.memories
        .upsert(UpsertRequest {
            memories: vec![outside, doubtful],
        })
        .await?;
    for mode in [RetrievalMode::Auto, RetrievalMode::Simple] {
        let r = c
            .retrieval
            .retrieve(RetrieveRequest {
                text: "when does the quarterly billing migration rollout happen?".into(),
                time_range: Some(TimeRange {
                    start: at(t0),
                    end: at(t0 + 100),
                }),
                min_confidence: Some(0.5),
                mode: mode as i32,
                no_cache: true,
                ..Default::default()
            })
            .await?
            .into_inner();
        assert!(
            r.retry_count >= 1,
            "{mode:?}: the weak answer was not retried"
        );
        assert!(
            r.records.is_empty(),
            "{mode:?}: a retry returned what the caller filtered out: {:?}",
            r.records
        );
    }
    ts.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_write_makes_the_turns_cached_answer_stale() -> anyhow::Result<()> {
    let ts = TestStack::start("internal").await?;
    let mut c = ts.client().await?;
    let m = |content: &str| Memory {
        content: content.into(),
        ..Default::default()
    };
    let ask = || RetrieveRequest {
        text: "who leads the billing migration?".into(),
        turn_id: "turn-7".into(),
        ..Default::default()
    };
    c.memories
        .upsert(UpsertRequest {
            memories: vec![m("Alice leads the billing migration.")],
        })
        .await?;
    let first = c.retrieval.retrieve(ask()).await?.into_inner();
    assert!(!first.records.is_empty());
    let news = "Bob now leads the billing migration; Alice moved to search.";
    c.memories
        .upsert(UpsertRequest {
            memories: vec![m(news)],
        })
        .await?;
    let again = c.retrieval.retrieve(ask()).await?.into_inner();
    let contents: Vec<_> = (again.records.iter())
        .filter_map(|r| r.memory.as_ref().map(|m| m.content.as_str()))
        .collect();
    assert!(
        contents.contains(&news),
        "the turn's answer from before the write was served: {contents:?}"
    );
    ts.shutdown().await;
    Ok(())
}

/// The ids `mode` returns for the office question, as of `as_of_opt`.
async fn office_ids(
    c: &mut Client,
    as_of_opt: Option<Timestamp>,
    mode: RetrievalMode,
) -> anyhow::Result<Vec<String>> {
    let r = c
        .retrieval
        .retrieve(RetrieveRequest {
            text: "Where is the Acme office?".into(),
            as_of_ingestion: as_of_opt,
            mode: mode as i32,
            no_cache: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(r.records
        .iter()
        .filter_map(|s| s.memory.as_ref().map(|m| m.id.clone()))
        .collect())
}

#[tokio::test]
async fn as_of_returns_the_version_of_that_time_in_every_mode() -> anyhow::Result<()> {
    let ts = TestStack::start("internal").await?;
    let mut c = ts.client().await?;
    let old_id = uuid::Uuid::new_v4().to_string();
    let old = Memory {
        id: old_id.clone(),
        content: "The Acme office is in Berlin, on Torstrasse.".into(),
        entities: vec!["Acme".into(), "Berlin".into()],
        ..Default::default()
    };
    c.memories
        .upsert(UpsertRequest {
            memories: vec![old],
        })
        .await?;
    let recorded = c
        .memories
        .get(engram_proto::GetRequest {
            ids: vec![old_id.clone()],
            include_embedding: false,
        })
        .await?
        .into_inner()
        .memories
        .first()
        .and_then(|m| m.recorded_at)
        .ok_or_else(|| anyhow::anyhow!("no recorded_at"))?;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let new_id = uuid::Uuid::new_v4().to_string();
    let new = Memory {
        id: new_id.clone(),
        content: "The Acme office moved from Berlin to Munich.".into(),
        entities: vec!["Acme".into(), "Munich".into()],
        supersedes: old_id.clone(),
        ..Default::default()
    };
    c.memories
        .upsert(UpsertRequest {
            memories: vec![new],
        })
        .await?;
    // 100 ms after the first version was recorded, 200 ms before the second.
    let nanos = i64::from(recorded.nanos) + 100_000_000;
    let before_change = Timestamp {
        seconds: recorded.seconds + nanos / 1_000_000_000,
        nanos: (nanos % 1_000_000_000) as i32,
    };
    for mode in [
        RetrievalMode::Auto,
        RetrievalMode::Simple,
        RetrievalMode::MultiHop,
        RetrievalMode::Exploratory,
        RetrievalMode::Vector,
        RetrievalMode::Keyword,
        RetrievalMode::Graph,
        RetrievalMode::Hybrid,
    ] {
        let ids = office_ids(&mut c, Some(before_change), mode).await?;
        assert!(
            !ids.contains(&new_id),
            "{mode:?}: the newer version: {ids:?}"
        );
        if mode != RetrievalMode::Graph {
            assert!(ids.contains(&old_id), "{mode:?}: no old version: {ids:?}");
        }
    }
    // Without as_of, today's version only.
    let ids = office_ids(&mut c, None, RetrievalMode::Auto).await?;
    assert!(ids.contains(&new_id) && !ids.contains(&old_id), "{ids:?}");
    ts.shutdown().await;
    Ok(())
}

/// A TCP forwarder that can be cut (every connection closed, new ones
/// refused) and restored: Postgres going away and coming back, as the
/// services see it, without stopping the Postgres other tests share.
struct Proxy {
    addr: std::net::SocketAddr,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cuts: tokio::sync::watch::Sender<u64>,
}

impl Proxy {
    async fn start(upstream: std::net::SocketAddr) -> anyhow::Result<Self> {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (cuts, _) = tokio::sync::watch::channel(0u64);
        let (is_open, cut_rx) = (open.clone(), cuts.subscribe());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !is_open.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let mut cut = cut_rx.clone();
                cut.mark_unchanged();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Ok(Self { addr, open, cuts })
    }

    fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    fn restore(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Polls a service's health until it is `want`, for at most 30 s.
async fn health_becomes(stack: &Stack, svc: Service, want: i32) -> anyhow::Result<()> {
    let addr = stack
        .addr(svc)
        .ok_or_else(|| anyhow::anyhow!("{svc:?} not running"))?;
    for _ in 0..60 {
        if engram::stack::health_status(addr, svc).await == Some(want) {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    anyhow::bail!("{svc:?} health never became {want}")
}

#[tokio::test]
async fn health_follows_postgres_away_and_back() -> anyhow::Result<()> {
    const SERVING: i32 = 1;
    const NOT_SERVING: i32 = 2;
    let mut settings = engram_tests::settings().await?;
    let url = settings
        .database
        .url_opt
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no database url"))?;
    let (head, rest) = url
        .split_once('@')
        .ok_or_else(|| anyhow::anyhow!("url {url} has no host"))?;
    let (host_port, db) = rest
        .split_once('/')
        .ok_or_else(|| anyhow::anyhow!("url {url} has no database"))?;
    let upstream = tokio::net::lookup_host(host_port)
        .await?
        .next()
        .ok_or_else(|| anyhow::anyhow!("cannot resolve {host_port}"))?;
    let proxy = Proxy::start(upstream).await?;
    settings.database.url_opt = Some(format!("{head}@{}/{db}", proxy.addr));
    settings.auth.internal_token_opt = Some(engram::stack::random_token());
    let services = [Service::Search, Service::Graph].into_iter().collect();
    let ts = TestStack::start_with(settings, services, "internal").await?;
    for svc in [Service::Search, Service::Graph] {
        health_becomes(&ts.stack, svc, SERVING).await?;
    }
    proxy.cut();
    for svc in [Service::Search, Service::Graph] {
        health_becomes(&ts.stack, svc, NOT_SERVING).await?;
    }
    proxy.restore();
    for svc in [Service::Search, Service::Graph] {
        health_becomes(&ts.stack, svc, SERVING).await?;
    }
    ts.shutdown().await;
    Ok(())
}
