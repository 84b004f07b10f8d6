//! `engram bench`'s write-to-visible lag: how long after a write is
//! acknowledged until graph-svc's walk finds it.
//!
//! Dense and keyword search read Postgres, so a memory is searchable the
//! moment its Upsert returns. graph-svc serves a tenant from an in-memory
//! graph that a change notification marks stale and a paced rebuild
//! replaces whole, with the old graph serving meanwhile (docs/operability.md,
//! "Graph memory, first loads and rebuilds"); at 100K memories that rebuild
//! is the lag an agent sees between writing a fact and a multi-hop walk
//! reaching it.

use std::time::{Duration, Instant};

use engram_proto::graph_service_client::GraphServiceClient;
use engram_proto::{DeleteRequest, Memory, PprRequest, UpsertRequest};
use engram_stack::client::Client;
use tonic::transport::Channel;

/// Wraps a PPR request in the tenant's internal identity (the bench's
/// `internal`), so this module needs nothing of the bench but its caller's.
pub(crate) type AsTenant<'a> = &'a dyn Fn(PprRequest) -> tonic::Request<PprRequest>;

/// Rounds measured (the first rebuild after a quiet spell, then one paced
/// behind the delete's rebuild).
const ROUNDS: usize = 2;
/// How often the walk is asked again while the write is not visible.
const POLL: Duration = Duration::from_millis(25);
/// Give up on a round after this long (reported as null).
const GIVE_UP: Duration = Duration::from_secs(120);

/// A name no corpus holds, one per round and run, letters only so the
/// entity extractor reads it as a name.
fn probe_name(round: usize) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as usize)
        .unwrap_or(round);
    let suffix: String = (0..4)
        .map(|i| char::from(b'a' + ((nanos >> (i * 5)) % 26) as u8))
        .collect();
    format!(
        "Zorvath Quillemar{suffix}{}",
        char::from(b'a' + round as u8)
    )
}

/// One PPR call asking about `name`: (the walk found `id`, the graph was stale).
async fn walk_finds(
    graph: &mut GraphServiceClient<Channel>,
    as_tenant: AsTenant<'_>,
    name: &str,
    id: &str,
) -> anyhow::Result<(bool, bool)> {
    let req = PprRequest {
        query_text: name.to_string(),
        ..Default::default()
    };
    let resp = graph
        .personalized_page_rank(as_tenant(req))
        .await?
        .into_inner();
    let found = resp.hits.iter().any(|h| h.memory_id == id);
    Ok((found, resp.stale))
}

/// Waits until the tenant's graph has no pending change, so one round's
/// rebuild does not start inside the previous round's.
async fn settle(
    graph: &mut GraphServiceClient<Channel>,
    as_tenant: AsTenant<'_>,
) -> anyhow::Result<()> {
    let t = Instant::now();
    while t.elapsed() < GIVE_UP {
        let (_, stale) = walk_finds(graph, as_tenant, "settle", "").await?;
        if !stale {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

/// Writes one memory naming a fresh entity through the public API, then
/// asks graph-svc about that entity until the walk returns the memory and
/// the graph is no longer stale; deletes the memory afterwards. Reports
/// the milliseconds from the acknowledged write, per round.
pub(crate) async fn graph_write_to_visible(
    graph_uri: String,
    client: &Client,
    as_tenant: AsTenant<'_>,
) -> anyhow::Result<serde_json::Value> {
    let mut graph = GraphServiceClient::connect(graph_uri)
        .await?
        .max_decoding_message_size(64 << 20);
    let mut rounds = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        settle(&mut graph, as_tenant).await?;
        let name = probe_name(round);
        let id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string();
        let memory = Memory {
            id: id.clone(),
            title: name.clone(),
            content: format!("{name} opened the lag probe archive in Velmorand."),
            ..Default::default()
        };
        let mut writer = client.clone();
        writer
            .memories
            .upsert(UpsertRequest {
                memories: vec![memory],
            })
            .await?;
        let t = Instant::now();
        let mut visible_ms_opt = None;
        while t.elapsed() < GIVE_UP {
            let (found, stale) = walk_finds(&mut graph, as_tenant, &name, &id).await?;
            if found && !stale {
                visible_ms_opt = Some((t.elapsed().as_secs_f64() * 10_000.0).round() / 10.0);
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        writer
            .memories
            .delete(DeleteRequest { ids: vec![id] })
            .await?;
        rounds.push(visible_ms_opt);
    }
    Ok(serde_json::json!({
        "graph_ms": rounds,
        "poll_ms": POLL.as_millis() as u64,
        "note": "from the acknowledged Upsert until graph-svc's walk returns the memory on a graph that is not stale; dense and keyword search see it at once",
    }))
}
