//! search-svc bounds what one request may cost (issue 16, item 4): a
//! statement_timeout per query kind and a cap on requests in flight. A
//! query past its bound is DEADLINE_EXCEEDED, a request over the cap is
//! RESOURCE_EXHAUSTED at once, and neither is ever INTERNAL; the gateway
//! answers degraded and keeps its breakers closed. Real stack on port 0,
//! shared test Postgres. No assertion on how long anything took.

use engram::stack::{Service, Stack};
use engram_common::{AccessLevel, Identity, Settings};
use engram_proto as pb;
use engram_proto::search_service_client::SearchServiceClient;
use engram_proto::{RetrievalMode, RetrieveRequest, UpsertRequest};
use engram_tests::TestStack;
use tonic::transport::Channel;

type Search = SearchServiceClient<Channel>;

const VOCAB: usize = 300;

fn token(n: usize) -> String {
    format!("zq{:03}", n % VOCAB)
}

/// Every word of the vocabulary: BM25 scores each of ~700 candidates
/// against 300 terms, far more than a 1 ms statement allows.
fn heavy_query() -> String {
    (0..VOCAB).map(token).collect::<Vec<_>>().join(" ")
}

/// 600 memories of 80 vocabulary words each, with client vectors (no model).
fn heavy_memories() -> Vec<pb::Memory> {
    (0..600)
        .map(|i| {
            let words: Vec<String> = (0..80).map(|j| token(i * 7 + j * 13 + j * j)).collect();
            let mut embedding = vec![0.01f32; 384];
            embedding[i % 384] = 1.0;
            pb::Memory {
                content: words.join(" "),
                embedding,
                ..Default::default()
            }
        })
        .collect()
}

struct Direct {
    search: Search,
    identity: Identity,
    token: String,
}

impl Direct {
    async fn connect(ts: &TestStack) -> anyhow::Result<Self> {
        let addr = ts
            .stack
            .addr(Service::Search)
            .ok_or_else(|| anyhow::anyhow!("no search-svc"))?;
        let token = ts.stack.settings.auth.internal_token_opt.clone();
        Ok(Self {
            search: SearchServiceClient::connect(format!("http://{addr}")).await?,
            identity: Identity {
                tenant: ts.tenant.clone(),
                agent_id: "agent-1".into(),
                trust: AccessLevel::Internal,
            },
            token: token.ok_or_else(|| anyhow::anyhow!("no internal token"))?,
        })
    }

    fn req<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        self.identity.write_internal(r.metadata_mut(), &self.token);
        r
    }

    async fn fill(&mut self) -> anyhow::Result<()> {
        let all = heavy_memories();
        for chunk in all.chunks(200) {
            let memories = chunk.to_vec();
            let r = self.req(UpsertRequest { memories });
            self.search.upsert(r).await?;
        }
        Ok(())
    }

    fn keyword(&self) -> tonic::Request<pb::KeywordSearchRequest> {
        self.req(pb::KeywordSearchRequest {
            text: heavy_query(),
            filters: None,
            k: 10,
        })
    }
}

async fn stack(configure: impl FnOnce(&mut Settings)) -> anyhow::Result<TestStack> {
    let mut settings = engram_tests::settings().await?;
    configure(&mut settings);
    TestStack::start_with(settings, Service::ALL.into_iter().collect(), "internal").await
}

/// Every `engram_retrieval_circuit_state` line of the gateway (0 = closed).
async fn circuit_states(stack: &Stack) -> anyhow::Result<Vec<String>> {
    engram_tests::metric_lines(stack, "engram_retrieval_circuit_state").await
}

async fn assert_breakers_closed(stack: &Stack) -> anyhow::Result<()> {
    let states = circuit_states(stack).await?;
    assert!(!states.is_empty());
    for line in &states {
        assert!(line.ends_with(" 0"), "a breaker opened: {states:#?}");
    }
    Ok(())
}

#[tokio::test]
async fn a_keyword_query_past_its_statement_timeout_is_deadline_exceeded_and_the_gateway_degrades()
-> anyhow::Result<()> {
    let ts = stack(|s| s.search.statement_timeout_keyword_ms = 1).await?;
    let mut direct = Direct::connect(&ts).await?;
    direct.fill().await?;
    for _ in 0..3 {
        let e = direct
            .search
            .keyword_search(direct.keyword())
            .await
            .expect_err("a 1 ms keyword bound");
        assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
    }
    // Writes and other kinds keep their own bounds.
    let one = heavy_memories().swap_remove(0);
    let r = direct.req(UpsertRequest {
        memories: vec![one],
    });
    direct.search.upsert(r).await?;

    // HYBRID: vector, keyword and graph in one attempt, so the answer's
    // trace is the attempt whose keyword call was cancelled (AUTO may retry
    // on a route that leaves keyword out).
    let mut c = ts.client().await?;
    let r = c
        .retrieval
        .retrieve(RetrieveRequest {
            text: heavy_query(),
            mode: RetrievalMode::Hybrid as i32,
            no_cache: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(
        r.degraded_stages.iter().any(|s| s == "keyword"),
        "{:?}",
        r.degraded_stages
    );
    assert_breakers_closed(&ts.stack).await?;
    ts.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn over_max_concurrent_requests_search_sheds_with_resource_exhausted_never_internal()
-> anyhow::Result<()> {
    let ts = stack(|s| s.search.max_concurrent_requests = 1).await?;
    let mut direct = Direct::connect(&ts).await?;
    direct.fill().await?;
    let calls = (0..32).map(|_| {
        let mut search = direct.search.clone();
        let req = direct.keyword();
        tokio::spawn(async move { search.keyword_search(req).await.map(|_| ()) })
    });
    let mut codes = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        codes.push(match call.await? {
            Ok(()) => tonic::Code::Ok,
            Err(e) => e.code(),
        });
    }
    assert!(codes.contains(&tonic::Code::Ok), "{codes:?}");
    assert!(codes.contains(&tonic::Code::ResourceExhausted), "{codes:?}");
    assert!(
        codes
            .iter()
            .all(|c| matches!(c, tonic::Code::Ok | tonic::Code::ResourceExhausted)),
        "{codes:?}"
    );

    // Through the gateway: refusals are breaker-neutral, answers degrade.
    let c = ts.client().await?;
    let asks = (0..8).map(|i| {
        let mut retrieval = c.retrieval.clone();
        let text = format!("{} {}", token(i), token(i + 1));
        tokio::spawn(async move {
            let req = RetrieveRequest {
                text,
                no_cache: true,
                ..Default::default()
            };
            retrieval.retrieve(req).await.map(|_| ())
        })
    });
    for ask in asks.collect::<Vec<_>>() {
        if let Err(e) = ask.await? {
            assert!(
                !matches!(e.code(), tonic::Code::Internal | tonic::Code::Unknown),
                "{e:?}"
            );
        }
    }
    assert_breakers_closed(&ts.stack).await?;
    ts.shutdown().await;
    Ok(())
}
