//! The load `engram soak` drives through the public API: a seeded corpus
//! per tenant, an open-loop reader (requests leave on a clock, so a slow
//! answer never lowers the offered load), a writer that remembers which ids
//! were acknowledged (and can pass each on as it is acknowledged), the
//! soak's recycler that reads back and deletes the oldest of them while the
//! load runs, and tenant A's flood of hostile requests.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use engram_proto::{
    AgenticRetrieveRequest, DeleteRequest, GetRequest, Memory, RetrievalMode, RetrieveRequest,
    UpsertRequest,
};
use engram_stack::client::Client;
use tokio::task::JoinSet;

/// No client call waits longer than this: past the gateway's 3 s ceiling,
/// so a p100 above the ceiling is seen, but a hung call cannot stall a run.
const CLIENT_DEADLINE: Duration = Duration::from_secs(10);

/// Routes the reader cycles through (the mix `engram bench` uses plus auto).
const MODES: [RetrievalMode; 4] = [
    RetrievalMode::Auto,
    RetrievalMode::Simple,
    RetrievalMode::MultiHop,
    RetrievalMode::Exploratory,
];

const COLOURS: [&str; 6] = ["red", "blue", "green", "amber", "violet", "grey"];
const THINGS: [&str; 6] = ["ledger", "router", "notebook", "badge", "printer", "key"];
const PLACES: [&str; 6] = ["archive", "lab", "vault", "office", "depot", "annex"];

/// What happened to one request: when it left, how long it took, and
/// either the stages its answer was degraded by or the gRPC code it failed with.
#[derive(Debug, Clone)]
pub struct Sample {
    pub at: Instant,
    pub ms: f64,
    pub outcome: Result<Vec<String>, tonic::Code>,
    /// The error's message, for the report's first few distinct ones.
    pub message_opt: Option<String>,
}

/// The seeded fact `i` of a tenant and the question that finds it.
fn fact(tag: &str, i: usize) -> (String, String) {
    let (c, t, p) = (COLOURS[i % 6], THINGS[(i / 6) % 6], PLACES[(i / 36) % 6]);
    let project = format!("{tag}-project-{i}");
    (
        format!("The {c} {t} of {project} is kept in the {p}, shelf {i}."),
        format!("Where is the {c} {t} of {project} kept?"),
    )
}

fn seed_id(tag: &str, i: usize) -> String {
    uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("soak:{tag}:{i}").as_bytes(),
    )
    .to_string()
}

/// Writes `n` facts (server-side embeddings, idempotent ids) and returns
/// the questions the reader asks.
pub async fn seed(client: &mut Client, tag: &str, n: usize) -> anyhow::Result<Vec<String>> {
    let all: Vec<(String, String)> = (0..n).map(|i| fact(tag, i)).collect();
    for (start, chunk) in (0..n).step_by(50).zip(all.chunks(50)) {
        let memories = chunk
            .iter()
            .enumerate()
            .map(|(j, (content, _))| Memory {
                id: seed_id(tag, start + j),
                content: content.clone(),
                memory_type: "semantic".into(),
                ..Default::default()
            })
            .collect();
        client.memories.upsert(UpsertRequest { memories }).await?;
    }
    Ok(all.into_iter().map(|(_, q)| q).collect())
}

/// Writes `n` memories of 60 KiB into `tag`'s tenant (idempotent ids):
/// what `high`'s expensive reads ask for 100 of at once.
pub async fn seed_large(client: &mut Client, tag: &str, n: usize) -> anyhow::Result<()> {
    let line = "The archive ledger lists every router and badge by shelf and date. ";
    let body = line.repeat(60 * 1024 / line.len());
    for start in (0..n).step_by(10) {
        let memories = (start..(start + 10).min(n))
            .map(|i| Memory {
                id: seed_id(&format!("{tag}-large"), i),
                content: format!("Archive item {i}. {body}"),
                memory_type: "semantic".into(),
                ..Default::default()
            })
            .collect();
        client.memories.upsert(UpsertRequest { memories }).await?;
    }
    Ok(())
}

fn code_name(code: tonic::Code) -> String {
    format!("{code:?}")
}

/// One retrieval as the steady tenant sends it.
async fn one_read(mut c: Client, text: String, mode: RetrievalMode) -> Sample {
    let at = Instant::now();
    let mut req = tonic::Request::new(RetrieveRequest {
        text,
        limit: Some(10),
        mode: mode as i32,
        no_cache: true,
        ..Default::default()
    });
    req.set_timeout(CLIENT_DEADLINE);
    let (outcome, message_opt) = match c.retrieval.retrieve(req).await {
        Ok(r) => (Ok(r.into_inner().degraded_stages), None),
        Err(s) => (Err(s.code()), Some(s.message().chars().take(200).collect())),
    };
    let ms = at.elapsed().as_secs_f64() * 1000.0;
    Sample {
        at,
        ms,
        outcome,
        message_opt,
    }
}

/// A clock that ticks `per_second` times a second (at least once a minute).
fn ticker(per_second: f64) -> tokio::time::Interval {
    let period = Duration::from_secs_f64(1.0 / per_second.max(1.0 / 60.0));
    let mut t = tokio::time::interval(period);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// Open-loop reads at `qps` over `questions` and the route mix until `stop`.
pub async fn reads(
    client: Client,
    qps: f64,
    questions: Arc<Vec<String>>,
    stop: Arc<AtomicBool>,
) -> Vec<Sample> {
    let mut tick = ticker(qps);
    let mut set = JoinSet::new();
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let text = questions[i % questions.len().max(1)].clone();
        set.spawn(one_read(client.clone(), text, MODES[i % MODES.len()]));
        i += 1;
    }
    set.join_all().await
}

/// Closed-loop reads with `concurrency` in flight for `secs`: the
/// saturation rate the soak's load is set against.
pub async fn saturation_qps(
    client: &Client,
    questions: &[String],
    concurrency: usize,
    secs: f64,
) -> f64 {
    let start = Instant::now();
    let mut set = JoinSet::new();
    for w in 0..concurrency.max(1) {
        let (c, qs) = (client.clone(), questions.to_vec());
        set.spawn(async move {
            let mut n = 0usize;
            while start.elapsed().as_secs_f64() < secs {
                let i = w * 7919 + n;
                one_read(c.clone(), qs[i % qs.len().max(1)].clone(), MODES[i % 4]).await;
                n += 1;
            }
            n
        });
    }
    let total: usize = set.join_all().await.into_iter().sum();
    total as f64 / start.elapsed().as_secs_f64().max(1e-9)
}

/// What the writer saw: the ids the gateway acknowledged and the failures.
#[derive(Debug, Default)]
pub struct Writes {
    pub acked: Vec<String>,
    pub failed: BTreeMap<String, usize>,
    pub ms: Vec<f64>,
    /// Every write as a sample (no degraded stages), to cut by window.
    pub log: Vec<Sample>,
}

/// One memory written; `Ok(id)` only when the answer names it.
async fn one_write(
    mut c: Client,
    tag: String,
    n: usize,
) -> (Instant, f64, Result<String, tonic::Code>) {
    let id = uuid::Uuid::new_v4().to_string();
    let mut req = tonic::Request::new(UpsertRequest {
        memories: vec![Memory {
            id: id.clone(),
            content: format!(
                "Soak write {n} of {tag}: the {} parcel arrived.",
                COLOURS[n % 6]
            ),
            ..Default::default()
        }],
    });
    req.set_timeout(CLIENT_DEADLINE);
    let t = Instant::now();
    let r = c.memories.upsert(req).await;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    match r {
        Ok(r) if r.get_ref().results.iter().any(|x| x.id == id) => (t, ms, Ok(id)),
        Ok(_) => (t, ms, Err(tonic::Code::Unknown)),
        Err(s) => (t, ms, Err(s.code())),
    }
}

/// Where the writer passes each acknowledged id the moment it is
/// acknowledged (unbounded: the recycler drains it every second).
pub type Acks = tokio::sync::mpsc::UnboundedSender<String>;

/// [`one_write`], and its id on `acks_opt` once acknowledged. A closed
/// channel is ignored: the id is still in [`Writes::acked`].
async fn one_write_passed(
    c: Client,
    tag: String,
    n: usize,
    acks_opt: Option<Acks>,
) -> (Instant, f64, Result<String, tonic::Code>) {
    let r = one_write(c, tag, n).await;
    if let (Some(acks), (_, _, Ok(id))) = (&acks_opt, &r) {
        let _ = acks.send(id.clone());
    }
    r
}

/// Open-loop writes, `per_second`, until `stop`; with `acks_opt`, each
/// acknowledged id is also passed on as it arrives. The channel closes
/// when this returns, once every write has been answered.
pub async fn writes(
    client: Client,
    per_second: f64,
    tag: String,
    stop: Arc<AtomicBool>,
    acks_opt: Option<Acks>,
) -> Writes {
    let mut tick = ticker(per_second);
    let mut set = JoinSet::new();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let acks = acks_opt.clone();
        set.spawn(one_write_passed(client.clone(), tag.clone(), n, acks));
        n += 1;
    }
    drop(acks_opt);
    let mut out = Writes::default();
    for (at, ms, r) in set.join_all().await {
        out.ms.push(ms);
        out.log.push(Sample {
            at,
            ms,
            outcome: r.as_ref().map(|_| Vec::new()).map_err(|c| *c),
            message_opt: None,
        });
        match r {
            Ok(id) => out.acked.push(id),
            Err(code) => *out.failed.entry(code_name(code)).or_default() += 1,
        }
    }
    out
}

/// The acknowledged ids a read-back through the gateway does not return.
pub async fn missing(client: &mut Client, ids: &[String]) -> anyhow::Result<Vec<String>> {
    let mut gone = Vec::new();
    for chunk in ids.chunks(100) {
        let got = client
            .memories
            .get(GetRequest {
                ids: chunk.to_vec(),
                include_embedding: false,
                omit_entities: false,
                vectors_only: false,
                ..Default::default()
            })
            .await?
            .into_inner();
        let have: std::collections::HashSet<&str> =
            got.memories.iter().map(|m| m.id.as_str()).collect();
        gone.extend(
            chunk
                .iter()
                .filter(|id| !have.contains(id.as_str()))
                .cloned(),
        );
    }
    Ok(gone)
}

/// Removes what the writer added, so repeated runs do not grow the tenant.
pub async fn remove(client: &mut Client, ids: &[String]) -> anyhow::Result<()> {
    for chunk in ids.chunks(100) {
        client
            .memories
            .delete(DeleteRequest {
                ids: chunk.to_vec(),
            })
            .await?;
    }
    Ok(())
}

/// What the soak's recycler did with the acknowledged ids passed to it.
#[derive(Debug, Default)]
pub struct Recycled {
    /// Read back and deleted while the load ran.
    pub recycled: usize,
    /// Of those, the ones the read-back did not return (lost writes).
    pub missing: Vec<String>,
    /// Read back but not yet deleted (a delete failed): remove, do not
    /// read again, or ids already partly deleted would count as lost.
    pub checked: Vec<String>,
    /// Not read back yet: the caller reads them back and removes them.
    pub pending: Vec<String>,
    /// The most ids held at once (seen each second, before recycling).
    pub max_held: usize,
}

/// Keeps the acknowledged writes passed on `acks` at `bound`: every second
/// the oldest beyond it are read back (those not returned count as lost)
/// and deleted, so the tenant's corpus stays the same size however long
/// the soak runs. Returns once the writer has finished and the channel is
/// closed; what is left is in [`Recycled::pending`] and `checked`.
pub async fn recycle(
    mut client: Client,
    bound: usize,
    mut acks: tokio::sync::mpsc::UnboundedReceiver<String>,
) -> Recycled {
    let mut held = VecDeque::new();
    let mut out = Recycled::default();
    let mut tick = ticker(1.0);
    loop {
        tick.tick().await;
        let open = drain(&mut acks, &mut held);
        out.max_held = out.max_held.max(held.len());
        if !open {
            break;
        }
        recycle_step(&mut client, bound, &mut held, &mut out).await;
    }
    out.pending = held.into();
    out
}

/// Moves what `acks` holds now into `held`; false once the writer is done.
fn drain(
    acks: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    held: &mut VecDeque<String>,
) -> bool {
    loop {
        match acks.try_recv() {
            Ok(id) => held.push_back(id),
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => return true,
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => return false,
        }
    }
}

/// The oldest ids beyond `bound`, taken out of `held`.
fn oldest_beyond(held: &mut VecDeque<String>, bound: usize) -> Vec<String> {
    let over = held.len().saturating_sub(bound);
    held.drain(..over).collect()
}

/// One second's recycling. A failed read-back puts the batch back to be
/// tried next second; a failed delete keeps it in `checked` to delete
/// again, so a transient error neither loses an id nor counts one twice.
async fn recycle_step(
    client: &mut Client,
    bound: usize,
    held: &mut VecDeque<String>,
    out: &mut Recycled,
) {
    if out.checked.is_empty() {
        let batch = oldest_beyond(held, bound);
        match missing(client, &batch).await {
            Ok(gone) => {
                out.missing.extend(gone);
                out.checked = batch;
            }
            Err(e) => {
                tracing::warn!(error = %e, n = batch.len(), "soak recycler read-back failed; retrying");
                batch.into_iter().rev().for_each(|id| held.push_front(id));
            }
        }
    }
    if out.checked.is_empty() {
        return;
    }
    match remove(client, &out.checked).await {
        Ok(()) => out.recycled += std::mem::take(&mut out.checked).len(),
        Err(e) => {
            tracing::warn!(error = %e, n = out.checked.len(), "soak recycler delete failed; retrying")
        }
    }
}

/// An ordinary question, for a flood of well-behaved requests.
pub const PLAIN: &str = "plain";

/// Tenant A's attacks, in the order each flood worker cycles through them.
pub const ATTACKS: [&str; 7] = [
    "limit_100_big_budget",
    "nul_bytes",
    "deadline_1ms",
    "oversized_field",
    "oversized_message",
    "agentic_fanout",
    "over_rate",
];

/// The three attacks that turned another tenant's answers degraded
/// (issue 47, High 1-3), each a scenario of `high` with the attacks its
/// flood cycles through.
pub const HIGH: [(&str, &[&str]); 3] = [
    // 300-memory upserts as fast as they are answered.
    ("write_flood", &["write_flood"]),
    // ~300-byte requests whose metadata filter is nested 40 deep.
    ("deep_filters", &["deep_filters"]),
    // The most a read may ask for over 60 KiB memories, and long queries.
    ("expensive_reads", &["limit_100_big_budget", "long_query"]),
];

/// Memories per `write_flood` upsert.
const FLOOD_BATCH: usize = 300;
/// How deep `deep_filters` nests its metadata filter.
const FILTER_DEPTH: usize = 40;

/// A metadata filter `{"k": {"k": … 1 …}}` nested `depth` deep.
fn nested_filter(depth: usize) -> Option<prost_types::Struct> {
    let mut v = serde_json::json!(1);
    for _ in 0..depth {
        v = serde_json::json!({ "k": v });
    }
    Some(engram_common::convert::json_to_struct(&v))
}

fn attack_request(kind: &str, i: usize) -> RetrieveRequest {
    let mut r = RetrieveRequest {
        text: format!("what is kept in the archive, item {i}?"),
        no_cache: true,
        ..Default::default()
    };
    match kind {
        // The most a request may ask for, so it is served, at full cost.
        "limit_100_big_budget" => {
            r.limit = Some(100);
            r.token_budget = 100_000;
            r.mode = RetrievalMode::Exploratory as i32;
        }
        "nul_bytes" => r.text = format!("where\0is\0the\0ledger {i}\0"),
        // The longest query the boundary takes (4,096 characters).
        "long_query" => {
            let words = format!("ledger archive router badge item {i} ");
            r.text = words.repeat(4096 / words.len() + 1)[..4096].to_string();
        }
        "deep_filters" => r.metadata_filter = nested_filter(FILTER_DEPTH),
        // Past the field limit but under the transport's message limit.
        "oversized_field" => r.text = "ledger ".repeat(50_000),
        // Past the transport's 4 MiB message limit.
        "oversized_message" => r.text = "x".repeat(5 << 20),
        "over_rate" => {
            r.limit = Some(1);
            r.mode = RetrievalMode::Keyword as i32;
        }
        _ => {}
    }
    r
}

/// Concurrent requests of one `over_rate` burst: twice the default
/// per-tenant concurrency, so the burst is refused in part at any rate.
const BURST: usize = 64;

async fn one_retrieve(mut c: Client, kind: &str, i: usize) -> tonic::Code {
    let mut req = tonic::Request::new(attack_request(kind, i));
    req.set_timeout(if kind == "deadline_1ms" {
        Duration::from_millis(1)
    } else {
        CLIENT_DEADLINE
    });
    match c.retrieval.retrieve(req).await {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}

/// One hostile call (a burst for `over_rate`); the gRPC codes it ended
/// with ("Ok" when served).
async fn one_attack(mut c: Client, tenant: &str, kind: &str, i: usize) -> Vec<tonic::Code> {
    match kind {
        "agentic_fanout" => {
            let req = AgenticRetrieveRequest {
                query: format!("compare the ledger and the router of project {i}, then the badge"),
                tenant_id: tenant.into(),
                max_steps: Some(20),
                reasoning_effort: "high".into(),
                top_k_per_step: Some(50),
                token_budget: Some(100_000),
                ..Default::default()
            };
            vec![match c.foundry.retrieve_agentic(req).await {
                Ok(_) => tonic::Code::Ok,
                Err(s) => s.code(),
            }]
        }
        "over_rate" => {
            let calls = (0..BURST).map(|j| one_retrieve(c.clone(), kind, i * BURST + j));
            futures::future::join_all(calls).await
        }
        "write_flood" => {
            let memories = (0..FLOOD_BATCH)
                .map(|j| Memory {
                    id: uuid::Uuid::new_v4().to_string(),
                    content: format!("flood note {i}-{j}: the archive ledger moved to shelf {j}."),
                    ..Default::default()
                })
                .collect();
            let mut req = tonic::Request::new(UpsertRequest { memories });
            req.set_timeout(CLIENT_DEADLINE);
            vec![match c.memories.upsert(req).await {
                Ok(_) => tonic::Code::Ok,
                Err(s) => s.code(),
            }]
        }
        _ => vec![one_retrieve(c, kind, i).await],
    }
}

/// [`flood`] on a runtime and a connection of its own, on its own OS
/// threads: a real attacker is not in B's client process, so its work must
/// not queue on the tokio workers that time B's requests. Nor is it on the
/// server's host: those threads run at `nice` (19 by default), so the
/// attacker's own client work (encoding 5 MiB messages, thousands of
/// refused calls a second) takes the cores only when the services leave
/// them idle; what A's requests cost the *server* is what is measured.
pub fn flood_apart(
    uri: String,
    (key, tenant): (String, String),
    (attacks, workers): (Vec<String>, usize),
    nice: i32,
    stop: Arc<AtomicBool>,
) -> tokio::sync::oneshot::Receiver<anyhow::Result<BTreeMap<(String, String), usize>>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        lower_priority(nice);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("soak-flood")
            .on_thread_start(move || lower_priority(nice))
            .enable_all()
            .build();
        let r = match rt {
            Ok(rt) => rt.block_on(async move {
                let client = Client::connect(&uri, &key).await?;
                Ok(flood(client, tenant, attacks, workers, stop).await)
            }),
            Err(e) => Err(e.into()),
        };
        let _ = tx.send(r);
    });
    rx
}

/// Adds `nice` to this thread's nice value (Linux: per thread); a failure
/// only makes the flood harsher.
fn lower_priority(nice: i32) {
    if nice == 0 {
        return;
    }
    if let Err(e) = rustix::process::nice(nice) {
        tracing::warn!(error = %e, "cannot lower the flood thread's priority");
    }
}

/// Tenant A's flood: `workers` closed loops, each as fast as answers come
/// back, cycling through `attacks` (e.g. [`ATTACKS`]). Returns counts by
/// attack and code.
pub async fn flood(
    client: Client,
    tenant: String,
    attacks: Vec<String>,
    workers: usize,
    stop: Arc<AtomicBool>,
) -> BTreeMap<(String, String), usize> {
    let mut set = JoinSet::new();
    let attacks = Arc::new(if attacks.is_empty() {
        vec![PLAIN.to_string()]
    } else {
        attacks
    });
    for w in 0..workers.max(1) {
        let (c, stop, tenant) = (client.clone(), stop.clone(), tenant.clone());
        let attacks = attacks.clone();
        set.spawn(async move {
            let mut counts: BTreeMap<(String, String), usize> = BTreeMap::new();
            let mut i = w;
            while !stop.load(Ordering::Relaxed) {
                let kind = &attacks[i % attacks.len()];
                for code in one_attack(c.clone(), &tenant, kind, i).await {
                    *counts.entry((kind.clone(), code_name(code))).or_default() += 1;
                }
                i += 1;
            }
            counts
        });
    }
    let mut all = BTreeMap::new();
    for counts in set.join_all().await {
        for (k, n) in counts {
            *all.entry(k).or_default() += n;
        }
    }
    all
}

/// Percentiles, counts and failures of a set of samples.
pub fn summary(samples: &[&Sample]) -> serde_json::Value {
    let mut ms: Vec<f64> = samples.iter().map(|s| s.ms).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    let mut degraded: BTreeMap<String, usize> = BTreeMap::new();
    for s in samples {
        match &s.outcome {
            Ok(stages) => stages
                .iter()
                .for_each(|d| *degraded.entry(d.clone()).or_default() += 1),
            Err(code) => *errors.entry(code_name(*code)).or_default() += 1,
        }
    }
    let mut messages: Vec<&str> = samples
        .iter()
        .filter_map(|s| s.message_opt.as_deref())
        .collect();
    messages.sort_unstable();
    messages.dedup();
    messages.truncate(5);
    let p = |q: f64| round1(crate::eval::percentile(&ms, q));
    serde_json::json!({
        "requests": samples.len(),
        "errors": errors.values().sum::<usize>(),
        "errors_by_code": errors,
        "error_messages": messages,
        "degraded_answers": samples.iter().filter(|s| matches!(&s.outcome, Ok(d) if !d.is_empty())).count(),
        "degraded_by_stage": degraded,
        "p50_ms": p(50.0), "p95_ms": p(95.0), "p99_ms": p(99.0),
        "p100_ms": round1(ms.last().copied().unwrap_or(0.0)),
    })
}

pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(n: usize) -> VecDeque<String> {
        (0..n).map(|i| i.to_string()).collect()
    }

    #[test]
    fn the_oldest_beyond_the_bound_are_taken_first() {
        let mut h = held(7);
        assert_eq!(oldest_beyond(&mut h, 4), ["0", "1", "2"]);
        assert_eq!(h, held(7).split_off(3));
    }

    #[test]
    fn nothing_is_taken_at_or_under_the_bound() {
        let mut h = held(4);
        assert!(oldest_beyond(&mut h, 4).is_empty());
        assert!(oldest_beyond(&mut h, 10).is_empty());
        assert_eq!(h.len(), 4);
    }

    #[tokio::test]
    async fn drain_moves_every_id_and_sees_the_writer_finish() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut h = VecDeque::new();
        for id in ["a", "b"] {
            tx.send(id.to_string()).expect("receiver open");
        }
        assert!(drain(&mut rx, &mut h));
        tx.send("c".into()).expect("receiver open");
        drop(tx);
        assert!(!drain(&mut rx, &mut h));
        assert_eq!(h, ["a", "b", "c"]);
    }
}
