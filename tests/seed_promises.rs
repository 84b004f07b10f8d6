//! What the seed documents promise, checked end to end (issue 17): each test
//! reproduces a defect on the real stack (every service on port 0, the
//! shared test Postgres) and proves it gone.

use engram::client::Client;
use engram::stack::{Service, Stack};
use engram_proto::search_service_client::SearchServiceClient;
use engram_proto::{Memory, RetrievalMode, RetrieveRequest, SkipReason, TimeRange, UpsertRequest};
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
            omit_entities: false,
            vectors_only: false,
            ..Default::default()
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
        if engram::stack::health_status(addr, svc, &stack.settings.tls).await == Some(want) {
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

#[tokio::test]
async fn a_write_that_bypasses_this_gateway_still_makes_its_cached_answers_stale()
-> anyhow::Result<()> {
    let ts = TestStack::start("internal").await?;
    let mut c = ts.client().await?;
    engram_tests::remember(&mut c, "The standup is at 9:30 in room Atlas.").await?;
    let ask = || RetrieveRequest {
        text: "when and where is the standup?".into(),
        ..Default::default()
    };
    // Cached: asked twice until the second is a hit (the feed's start-up
    // resync may land between the first two).
    let mut cached = false;
    for _ in 0..20 {
        c.retrieval.retrieve(ask()).await?;
        let again = c.retrieval.retrieve(ask()).await?.into_inner();
        if again.skip_reason == SkipReason::CacheHit as i32 {
            cached = true;
            break;
        }
    }
    assert!(cached, "the answer was never cached");
    // Another gateway replica's write: straight into search-svc, as that
    // replica would send it; this gateway never sees the call.
    let search = ts
        .stack
        .addr(Service::Search)
        .ok_or_else(|| anyhow::anyhow!("no search-svc"))?;
    let mut direct = SearchServiceClient::connect(format!("http://{search}")).await?;
    let mut req = tonic::Request::new(UpsertRequest {
        memories: vec![Memory {
            content: "The standup moved to 10:00 in room Borealis.".into(),
            ..Default::default()
        }],
    });
    let writer = engram_common::Identity {
        tenant: ts.tenant.clone(),
        agent_id: "agent-1".into(),
        trust: engram_common::AccessLevel::Internal,
    };
    let token = ts.stack.settings.auth.internal_token_opt.clone();
    writer.write_internal(req.metadata_mut(), token.as_deref().unwrap_or(""));
    direct.upsert(req).await?;
    // The change reaches this gateway through search-svc's feed; poll (a
    // bounded wait, not a timing assertion) until the answer is recomputed.
    let mut fresh_opt = None;
    for _ in 0..100 {
        let r = c.retrieval.retrieve(ask()).await?.into_inner();
        if r.skip_reason != SkipReason::CacheHit as i32 {
            fresh_opt = Some(r);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let fresh = fresh_opt.ok_or_else(|| anyhow::anyhow!("still the cached answer after 10 s"))?;
    assert!(
        fresh
            .records
            .iter()
            .filter_map(|s| s.memory.as_ref())
            .any(|m| m.content.contains("Borealis")),
        "{fresh:?}"
    );
    ts.shutdown().await;
    Ok(())
}

/// The gateway's /metrics lines that start with `prefix`, as (series, value).
async fn metrics(stack: &Stack, prefix: &str) -> anyhow::Result<Vec<(String, f64)>> {
    let lines = engram_tests::metric_lines(stack, prefix).await?;
    Ok(lines
        .iter()
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect())
}

async fn metric(stack: &Stack, series: &str) -> anyhow::Result<f64> {
    Ok(metrics(stack, series)
        .await?
        .into_iter()
        .find(|(s, _)| s == series)
        .map_or(0.0, |(_, v)| v))
}

#[tokio::test]
async fn metrics_read_feedback_and_the_foundry_as_the_seed_defines_them() -> anyhow::Result<()> {
    use engram_proto::{
        AgenticRetrieveRequest, BasicRetrieveRequest, FeedbackItem, FeedbackRequest, FeedbackSignal,
    };
    let ts = TestStack::start("sensitive").await?;
    let mut c = ts.client().await?;
    engram::demo::load_sample(&mut c, &ts.tenant).await?;
    let r = c
        .retrieval
        .retrieve(RetrieveRequest {
            text: "Who leads the project that migrates the billing system?".into(),
            limit: Some(4),
            no_cache: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    let ids: Vec<String> = (r.records.iter())
        .filter_map(|s| s.memory.as_ref().map(|m| m.id.clone()))
        .collect();
    assert!(ids.len() >= 2, "{r:?}");
    let item = |id: &str, signal: FeedbackSignal, value: bool| FeedbackItem {
        memory_id: id.into(),
        signal: signal as i32,
        value,
    };
    let feedback = |query_id: &str, items: Vec<FeedbackItem>| FeedbackRequest {
        query_id: query_id.into(),
        items,
    };
    // One returned memory was helpful, another not used: a hit, 1/k.
    let judged = vec![
        item(&ids[0], FeedbackSignal::Helpful, true),
        item(&ids[1], FeedbackSignal::Used, false),
    ];
    c.retrieval.feedback(feedback(&r.query_id, judged)).await?;
    // Nothing used: a miss, 0/k. Feedback on an answer never given: a hit,
    // but no precision (k unknown).
    let unused = vec![item(&ids[0], FeedbackSignal::Used, false)];
    c.retrieval.feedback(feedback(&r.query_id, unused)).await?;
    let unknown = vec![item(&ids[0], FeedbackSignal::Used, true)];
    c.retrieval
        .feedback(feedback("no-such-answer", unknown))
        .await?;

    let s = &ts.stack;
    assert_eq!(
        metric(s, "engram_retrieval_hit_rate{result=\"hit\"}").await?,
        2.0
    );
    assert_eq!(
        metric(s, "engram_retrieval_hit_rate{result=\"miss\"}").await?,
        1.0
    );
    assert_eq!(
        metric(s, "engram_retrieval_precision_at_k_count").await?,
        2.0
    );
    let precision = metric(s, "engram_retrieval_precision_at_k_sum").await?;
    assert!(
        (precision - 1.0 / ids.len() as f64).abs() < 1e-9,
        "{precision}"
    );
    // The self-RAG histogram holds the cross-encoder's scores of what was
    // returned, one per scored record, not one confidence per answer.
    let scored = (r.records.iter())
        .filter(|s| s.provenance.as_ref().is_some_and(|p| p.relevance.is_some()))
        .count();
    assert_eq!(
        metric(s, "engram_retrieval_selfrag_score_count").await?,
        scored as f64
    );

    // The Foundry's own families, for answers and refusals alike.
    let kb = uuid::Uuid::new_v4().to_string();
    let basic = BasicRetrieveRequest {
        kb_id: kb.clone(),
        query: "Who leads billing?".into(),
        tenant_id: ts.tenant.clone(),
        ..Default::default()
    };
    c.foundry.retrieve_basic(basic.clone()).await?;
    let refused = BasicRetrieveRequest {
        query: String::new(),
        ..basic
    };
    assert!(c.foundry.retrieve_basic(refused).await.is_err());
    let agentic = AgenticRetrieveRequest {
        query: "Who leads billing?".into(),
        tenant_id: ts.tenant.clone(),
        kb_ids: vec![kb],
        reasoning_effort: "low".into(),
        ..Default::default()
    };
    c.foundry.retrieve_agentic(agentic).await?;
    let kf = metrics(s, "kf_retrieval_requests_total{").await?;
    let count = |mode: &str, outcome: &str| {
        let series =
            format!("kf_retrieval_requests_total{{mode=\"{mode}\",outcome=\"{outcome}\"}}");
        kf.iter()
            .find(|(s, _)| *s == series)
            .map_or(0.0, |(_, v)| *v)
    };
    assert_eq!(count("basic", "ok"), 1.0, "{kf:?}");
    assert_eq!(count("basic", "error"), 1.0, "{kf:?}");
    assert_eq!(
        count("agentic", "ok") + count("agentic", "truncated"),
        1.0,
        "{kf:?}"
    );
    assert_eq!(metric(s, "kf_retrieval_agentic_steps_count").await?, 1.0);
    ts.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn records_carry_their_rank_and_conflicts_their_edge_type_on_the_real_stack()
-> anyhow::Result<()> {
    let ts = TestStack::start("internal").await?;
    let mut c = ts.client().await?;
    let (a, b) = (
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
    );
    let note = |id: &str, content: &str| Memory {
        id: id.into(),
        content: content.into(),
        ..Default::default()
    };
    c.memories
        .upsert(UpsertRequest {
            memories: vec![
                note(&a, "The office coffee machine is on the third floor."),
                note(&b, "The office coffee machine is on the fifth floor."),
            ],
        })
        .await?;
    c.add_edges(&[engram_proto::Edge {
        src_id: a.clone(),
        dst_id: b.clone(),
        edge_type: "contradicts".into(),
        weight: 1.0,
    }])
    .await?;
    let r = c
        .retrieval
        .retrieve(RetrieveRequest {
            text: "where is the office coffee machine?".into(),
            no_cache: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    let ranks: Vec<u32> = r.records.iter().map(|s| s.rank).collect();
    let expected: Vec<u32> = (1..=u32::try_from(ranks.len())?).collect();
    assert_eq!(ranks, expected, "{r:?}");
    assert!(
        r.conflicts.iter().any(|p| p.edge_type == "contradicts"),
        "{:?}",
        r.conflicts
    );

    // The edge can be taken back (issue 47, item 20): once graph-svc has
    // the change, the pair is no longer reported.
    let deleted = c
        .memories
        .delete_edges(engram_proto::DeleteEdgesRequest {
            edges: vec![engram_proto::EdgeKey {
                src_id: a.clone(),
                dst_id: b.clone(),
                edge_type: "contradicts".into(),
            }],
        })
        .await?
        .into_inner()
        .deleted;
    assert_eq!(deleted, 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = c
            .retrieval
            .retrieve(RetrieveRequest {
                text: "where is the office coffee machine?".into(),
                no_cache: true,
                ..Default::default()
            })
            .await?
            .into_inner();
        if !r.conflicts.iter().any(|p| p.edge_type == "contradicts") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still reported 10 s after the delete: {:?}",
            r.conflicts
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    ts.shutdown().await;
    Ok(())
}
