//! graph-svc within bounds, on the real stack (issue 16 item 4, issue 17
//! item 3): tenant graphs share a memory budget and reload after eviction,
//! a first load outlives the query that started it (which degrades), and a
//! PPR answer says when its graph is older than the latest write.

use std::time::Duration;

use engram::stack::{Service, Stack, sha256_hex};
use engram_common::{AccessLevel, Identity, Settings};
use engram_proto::graph_service_client::GraphServiceClient;
use engram_proto::{
    Memory, PprRequest, PprResponse, RetrievalMode, RetrieveRequest, StatsRequest, StatsResponse,
    UpsertRequest,
};
use engram_tests::{settings, stack_with_keys};
use tonic::transport::Channel;

/// Polls at this pace, at most this many times: no timing is asserted.
const POLL: Duration = Duration::from_millis(50);
const POLLS: usize = 600;

/// graph-svc called directly, as the gateway does, for one stack.
struct Graph {
    client: GraphServiceClient<Channel>,
    token: String,
}

impl Graph {
    async fn connect(stack: &Stack) -> anyhow::Result<Self> {
        let addr = stack
            .addr(Service::Graph)
            .ok_or_else(|| anyhow::anyhow!("no graph-svc"))?;
        let token = (stack.settings.auth.internal_token_opt.clone())
            .ok_or_else(|| anyhow::anyhow!("no internal token"))?;
        let client = GraphServiceClient::connect(format!("http://{addr}")).await?;
        Ok(Self { client, token })
    }

    fn req<T>(&self, tenant: &str, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        Identity {
            tenant: tenant.into(),
            agent_id: "agent-1".into(),
            trust: AccessLevel::Internal,
        }
        .write_internal(r.metadata_mut(), &self.token);
        r
    }

    async fn ppr(&mut self, tenant: &str, q: &str) -> Result<PprResponse, tonic::Status> {
        let msg = PprRequest {
            query_text: q.into(),
            ..Default::default()
        };
        let r = self.req(tenant, msg);
        self.client
            .personalized_page_rank(r)
            .await
            .map(|r| r.into_inner())
    }

    /// The answer once the tenant's graph is loaded: a query arriving during
    /// the first load is refused with RESOURCE_EXHAUSTED and asked again.
    async fn ppr_loaded(&mut self, tenant: &str, q: &str) -> anyhow::Result<PprResponse> {
        for _ in 0..POLLS {
            match self.ppr(tenant, q).await {
                Ok(r) => return Ok(r),
                Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                    tokio::time::sleep(POLL).await
                }
                Err(s) => anyhow::bail!("ppr for {tenant}: {s}"),
            }
        }
        anyhow::bail!("{tenant}'s graph never loaded")
    }

    async fn stats(&mut self, tenant: &str) -> anyhow::Result<StatsResponse> {
        let r = self.req(tenant, StatsRequest {});
        Ok(self.client.stats(r).await?.into_inner())
    }
}

/// The tenant an API key of this stack belongs to.
fn tenant_of(stack: &Stack, key: &str) -> anyhow::Result<String> {
    let sha = sha256_hex(key);
    (stack.settings.auth.api_keys.iter())
        .find(|k| k.sha256 == sha)
        .map(|k| k.tenant.clone())
        .ok_or_else(|| anyhow::anyhow!("no tenant for key"))
}

async fn write(
    client: &mut engram::client::Client,
    title: &str,
    content: &str,
) -> anyhow::Result<String> {
    let memory = Memory {
        title: title.into(),
        content: content.into(),
        ..Default::default()
    };
    let r = client
        .memories
        .upsert(UpsertRequest {
            memories: vec![memory],
        })
        .await?
        .into_inner();
    r.results
        .first()
        .map(|r| r.id.clone())
        .ok_or_else(|| anyhow::anyhow!("no upsert result"))
}

fn hit_ids(r: &PprResponse) -> Vec<String> {
    r.hits.iter().map(|h| h.memory_id.clone()).collect()
}

/// Settings where a query waits for its tenant's load as long as it takes.
async fn patient() -> anyhow::Result<Settings> {
    let mut s = settings().await?;
    s.pipeline.graph_timeout_ms = 60_000;
    s.graph.load_wait_ms = 60_000;
    Ok(s)
}

#[tokio::test]
async fn two_tenants_over_a_tiny_budget_take_turns_and_both_keep_answering() -> anyhow::Result<()> {
    let mut s = patient().await?;
    // Smaller than any graph: only the graph used last may stay.
    s.graph.memory_budget_bytes = 1;
    let (stack, uri, keys) = stack_with_keys(s, &[("a", "internal"), ("b", "internal")]).await?;
    let mut ids = Vec::new();
    let mut tenants = Vec::new();
    for (key, name) in keys.iter().zip(["Lothair Nordberg", "Ermengarde Vasquez"]) {
        let mut c = engram::client::Client::connect(&uri, key).await?;
        let content = format!("{name} keeps the archive of the northern harbour.");
        ids.push(write(&mut c, name, &content).await?);
        tenants.push(tenant_of(&stack, key)?);
    }
    let mut g = Graph::connect(&stack).await?;
    for round in 0..3 {
        for (i, (tenant, name)) in tenants
            .iter()
            .zip(["Lothair Nordberg", "Ermengarde Vasquez"])
            .enumerate()
        {
            let r = g.ppr_loaded(tenant, &format!("Who is {name}?")).await?;
            let found = hit_ids(&r);
            assert!(
                found.contains(&ids[i]),
                "round {round}: {tenant} lost its memory: {found:?}"
            );
            assert!(
                !found.contains(&ids[1 - i]),
                "round {round}: another tenant's memory"
            );
            let mine = g.stats(tenant).await?;
            let other = g.stats(&tenants[1 - i]).await?;
            assert!(
                mine.loaded,
                "round {round}: the graph just used was evicted"
            );
            assert!(
                !other.loaded,
                "round {round}: both graphs stayed over a 1-byte budget"
            );
            assert_eq!(mine.loaded_tenants, 1, "{mine:?}");
            assert!(mine.total_bytes > mine.memory_budget_bytes, "{mine:?}");
        }
    }
    stack.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_first_load_outlives_the_query_that_started_it() -> anyhow::Result<()> {
    let mut s = settings().await?;
    // No query waits for a load at all: every first query degrades.
    s.graph.load_wait_ms = 0;
    let (stack, uri, keys) = stack_with_keys(s, &[("a", "internal"), ("b", "internal")]).await?;
    let (a, b) = (tenant_of(&stack, &keys[0])?, tenant_of(&stack, &keys[1])?);
    let mut ca = engram::client::Client::connect(&uri, &keys[0]).await?;
    let mut cb = engram::client::Client::connect(&uri, &keys[1]).await?;
    let q = "Where does Teutberga Lindqvist work?";
    let fact = "Teutberga Lindqvist works at the observatory of Valdemar.";
    let id_a = write(&mut ca, "Teutberga Lindqvist", fact).await?;
    write(&mut cb, "Teutberga Lindqvist", fact).await?;

    // Directly: the first query is refused with RESOURCE_EXHAUSTED (neutral
    // for the gateway's breaker, never retried by it) ...
    let mut g = Graph::connect(&stack).await?;
    let first = g.ppr(&a, q).await.expect_err("nothing can load in no time");
    assert_eq!(first.code(), tonic::Code::ResourceExhausted, "{first}");
    // ... and the load it started goes on: a later query answers from it.
    let later = g.ppr_loaded(&a, q).await?;
    assert!(hit_ids(&later).contains(&id_a), "{later:?}");

    // Through the gateway the same refusal degrades the graph channel of a
    // hybrid query (the others answer; a graph-only query has nothing else
    // and fails), and the next queries use the loaded graph.
    let ask = || RetrieveRequest {
        text: q.into(),
        mode: RetrievalMode::Hybrid as i32,
        no_cache: true,
        ..Default::default()
    };
    let degraded = cb.retrieval.retrieve(ask()).await?.into_inner();
    assert!(
        degraded.degraded_stages.iter().any(|d| d == "graph"),
        "{:?}",
        degraded.degraded_stages
    );
    let mut answered = false;
    for _ in 0..POLLS {
        let r = cb.retrieval.retrieve(ask()).await?.into_inner();
        if !r.degraded_stages.iter().any(|d| d == "graph") && !r.records.is_empty() {
            answered = true;
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    assert!(
        answered,
        "the gateway never got an answer from {b}'s loaded graph"
    );
    stack.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_ppr_answer_is_stale_from_a_write_until_its_rebuild_finishes() -> anyhow::Result<()> {
    let mut s = patient().await?;
    // A long quiet time, so the stale window is wide enough to observe.
    s.graph.debounce_ms = 3000;
    s.graph.max_debounce_ms = 3000;
    let (stack, uri, keys) = stack_with_keys(s, &[("a", "internal")]).await?;
    let tenant = tenant_of(&stack, &keys[0])?;
    let mut c = engram::client::Client::connect(&uri, &keys[0]).await?;
    let old = write(
        &mut c,
        "Boso Halvorsen",
        "Boso Halvorsen repairs clocks in Arles.",
    )
    .await?;
    let mut g = Graph::connect(&stack).await?;
    let q = "What does Boso Halvorsen do?";
    let mut fresh = None;
    for _ in 0..POLLS {
        let r = g.ppr_loaded(&tenant, q).await?;
        if !r.stale {
            fresh = Some(r);
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let fresh = fresh.ok_or_else(|| anyhow::anyhow!("the first graph never became fresh"))?;
    assert!(hit_ids(&fresh).contains(&old), "{fresh:?}");

    let new = write(
        &mut c,
        "Boso Halvorsen",
        "Boso Halvorsen now restores organs in Nîmes.",
    )
    .await?;
    let mut saw_stale = false;
    let mut after = None;
    for _ in 0..POLLS {
        let r = g.ppr_loaded(&tenant, q).await?;
        match (r.stale, saw_stale) {
            (true, _) => saw_stale = true,
            (false, true) => {
                after = Some(r);
                break;
            }
            (false, false) => {}
        }
        tokio::time::sleep(POLL).await;
    }
    assert!(saw_stale, "no answer said stale after the write");
    let after = after.ok_or_else(|| anyhow::anyhow!("the graph never became fresh again"))?;
    // Fresh means the write is in the graph.
    assert!(hit_ids(&after).contains(&new), "{after:?}");
    stack.shutdown().await;
    Ok(())
}
