//! `engram eval current`: is what the agent sees first what is true now?
//! Each set (lab/data/current/*.jsonl: ordered fact streams and
//! assistants' notes about one user) is written in order into a tenant of
//! its own through the public API, then every question is asked with the
//! default settings, and the report says per set and per kind of question:
//!
//! - current: the current fact at #1, an overridden one at #1, the current
//!   one in the top 5, and how often an outdated memory ranks above it;
//! - past: the earlier version in the top 3;
//! - many: every value in the top 5 (all stay current);
//! - chain: the final fact at #1 and in the top 5;
//! - plain: the answer at #1 and in the top 3;
//! - absent (an attribute no memory states): flagged `nothing_relevant`,
//!   against answerable questions flagged;
//! - answerable (every question with an answer, of any kind): an answer at
//!   #1 and in the top 3, the assistant sets' acceptance figures (issue 46).
//!
//! Nothing here is fitted: the rules it measures are structural
//! (pipeline/slots.rs), so every figure is out of sample; report each set
//! on its own (docs/benchmarks.md).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use engram_common::Settings;
use engram_proto::{GetRequest, Memory, RetrieveRequest, UpsertRequest};
use engram_stack::client::Client;
use engram_stack::stack::{self, Stack, StackOptions};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Line {
    Memory(MemoryLine),
    Question(QuestionLine),
}

#[derive(Debug, Deserialize)]
struct MemoryLine {
    id: String,
    content: String,
    event_time: chrono::DateTime<chrono::Utc>,
    #[serde(default)]
    memory_type: String,
    #[serde(default)]
    supersedes: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct QuestionLine {
    text: String,
    kind: String,
    #[serde(default)]
    gold: Vec<String>,
    #[serde(default)]
    stale: Vec<String>,
}

/// One set: its memories in write order and its questions.
struct Set {
    name: String,
    memories: Vec<MemoryLine>,
    questions: Vec<QuestionLine>,
}

fn load(path: &Path) -> anyhow::Result<Set> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let name = (path.file_stem()).map_or("set".into(), |s| s.to_string_lossy().into_owned());
    let mut set = Set {
        name,
        memories: Vec::new(),
        questions: Vec::new(),
    };
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        match serde_json::from_str(line).with_context(|| format!("{}:{}", path.display(), n + 1))? {
            Line::Memory(m) => set.memories.push(m),
            Line::Question(q) => set.questions.push(q),
        }
    }
    Ok(set)
}

/// The sets under `dir` (default lab/data/current), by name.
fn sets(paths: &[PathBuf]) -> anyhow::Result<Vec<Set>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            for e in std::fs::read_dir(p)? {
                let f = e?.path();
                if f.extension().is_some_and(|x| x == "jsonl") {
                    files.push(f);
                }
            }
        } else {
            files.push(p.clone());
        }
    }
    files.sort();
    files.iter().map(|f| load(f)).collect()
}

fn tenant(set: &Set) -> String {
    let clean: String = (set.name.chars())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("current-{clean}")
}

fn uid(tenant: &str, id: &str) -> String {
    uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("{tenant}:{id}").as_bytes(),
    )
    .to_string()
}

/// Writes the set in order, 64 a call, unless its last memory is there.
async fn ingest(client: &mut Client, tenant: &str, set: &Set) -> anyhow::Result<()> {
    let Some(last) = set.memories.last() else {
        return Ok(());
    };
    let have = (client.memories)
        .get(GetRequest {
            ids: vec![uid(tenant, &last.id)],
            ..Default::default()
        })
        .await?
        .into_inner();
    if !have.memories.is_empty() {
        return Ok(());
    }
    let memories: Vec<Memory> = (set.memories.iter())
        .map(|m| Memory {
            id: uid(tenant, &m.id),
            content: m.content.clone(),
            memory_type: m.memory_type.clone(),
            event_time: Some(engram_common::convert::chrono_to_ts(m.event_time)),
            supersedes: (m.supersedes.as_deref()).map_or(String::new(), |s| uid(tenant, s)),
            ..Default::default()
        })
        .collect();
    // A memory that supersedes another is written after it (search-svc
    // checks that the older one exists), so a batch ends before one.
    let mut batch: Vec<Memory> = Vec::new();
    let total = memories.len();
    for (i, m) in memories.into_iter().enumerate() {
        if batch.len() == 64 || (!m.supersedes.is_empty() && !batch.is_empty()) {
            let memories = std::mem::take(&mut batch);
            client.memories.upsert(UpsertRequest { memories }).await?;
            eprint!("\r  ingesting {tenant}: {i}/{total}");
        }
        batch.push(m);
    }
    client
        .memories
        .upsert(UpsertRequest { memories: batch })
        .await?;
    eprintln!();
    Ok(())
}

/// Hits and totals per measure.
#[derive(Debug, Default)]
struct Tally(BTreeMap<&'static str, (usize, usize)>);

impl Tally {
    fn add(&mut self, measure: &'static str, hit: bool) {
        let e = self.0.entry(measure).or_default();
        e.0 += usize::from(hit);
        e.1 += 1;
    }
}

/// A `same_slot` pair the answer reported (set ids) and whether it named a
/// winner.
struct Judged<'a> {
    a: &'a str,
    b: &'a str,
    resolved: bool,
}

/// The answer's `same_slot` pairs, by set id.
fn judged<'a>(
    r: &engram_proto::RetrieveResponse,
    back: &BTreeMap<String, &'a str>,
) -> Vec<Judged<'a>> {
    (r.conflicts.iter())
        .filter(|c| c.edge_type == "same_slot")
        .filter_map(|c| {
            Some(Judged {
                a: back.get(&c.memory_a).copied()?,
                b: back.get(&c.memory_b).copied()?,
                resolved: !c.winner_id.is_empty(),
            })
        })
        .collect()
}

/// Detection of versions, judged on the pairs that touch the asked fact:
/// recall (the current version paired with an outdated one it replaced)
/// and precision (a reported pair with one member among the asked fact's
/// versions is right when the other is one too; on a many-valued question,
/// when it also names no winner).
fn score_pairs(t: &mut Tally, q: &QuestionLine, pairs: &[Judged<'_>]) {
    let versions = |id: &str| q.gold.iter().chain(&q.stale).any(|g| g == id);
    let gold = |id: &str| q.gold.iter().any(|g| g == id);
    let stale = |id: &str| q.stale.iter().any(|s| s == id);
    if q.kind == "current" && !q.stale.is_empty() {
        let found = (pairs.iter()).any(|p| (gold(p.a) && stale(p.b)) || (gold(p.b) && stale(p.a)));
        t.add("detect_recall", found);
    }
    if !matches!(q.kind.as_str(), "current" | "past" | "many") {
        return;
    }
    for p in pairs.iter().filter(|p| versions(p.a) || versions(p.b)) {
        let right = versions(p.a) && versions(p.b) && (q.kind != "many" || !p.resolved);
        t.add("detect_precision", right);
    }
}

/// Scores one answer (`ranked`: the set's ids, best first).
fn score(t: &mut Tally, q: &QuestionLine, ranked: &[&str], flagged: bool) {
    let at = |id: &str| ranked.iter().position(|r| *r == id);
    let first_gold = q.gold.iter().filter_map(|g| at(g)).min();
    let first_stale = q.stale.iter().filter_map(|s| at(s)).min();
    let in_top = |k: usize| first_gold.is_some_and(|p| p < k);
    match q.kind.as_str() {
        "current" => {
            t.add("current@1", in_top(1));
            t.add("current@5", in_top(5));
            if !q.stale.is_empty() {
                t.add("stale@1", first_stale == Some(0));
                let above = match (first_stale, first_gold) {
                    (Some(s), Some(g)) => s < g,
                    (Some(_), None) => true,
                    _ => false,
                };
                t.add("stale_above_current", above);
            }
        }
        "past" => {
            t.add("past@1", in_top(1));
            t.add("past@3", in_top(3));
        }
        "many" => {
            let all = q.gold.iter().all(|g| at(g).is_some_and(|p| p < 5));
            t.add("many_all@5", all);
        }
        "chain" => {
            t.add("chain@1", in_top(1));
            t.add("chain@5", in_top(5));
        }
        "plain" => {
            t.add("plain@1", in_top(1));
            t.add("plain@3", in_top(3));
        }
        "absent" => t.add("absent_flagged", flagged),
        _ => {}
    }
    if !q.gold.is_empty() {
        t.add("answerable@1", in_top(1));
        t.add("answerable@3", in_top(3));
        t.add("answerable_flagged", flagged);
    }
}

/// `engram eval current [--data FILE|DIR ...] [--json]`.
pub async fn run(
    settings: Settings,
    data: Vec<PathBuf>,
    json: bool,
    verbose: bool,
    dump_opt: Option<PathBuf>,
) -> anyhow::Result<()> {
    let data = if data.is_empty() {
        vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("data/current")]
    } else {
        data
    };
    let sets = sets(&data)?;
    let keys: Vec<_> = (sets.iter())
        .map(|s| {
            let t = tenant(s);
            (
                stack::random_token(),
                t,
                "eval".to_string(),
                "sensitive".to_string(),
            )
        })
        .collect();
    let opts = StackOptions {
        ephemeral_ports: true,
        dev_api_key: false,
        extra_keys: keys.clone(),
        ..Default::default()
    };
    let mut dump = (dump_opt.as_ref())
        .map(|p| std::fs::File::create(p).with_context(|| format!("--dump {}", p.display())))
        .transpose()?
        .map(std::io::BufWriter::new);
    let stack = Stack::start(settings, opts).await?;
    let result = async {
        let uri = stack.gateway_uri().context("no gateway")?;
        let mut report = BTreeMap::new();
        for (set, (key, tenant, _, _)) in sets.iter().zip(&keys) {
            let mut client = Client::connect(&uri, key).await?;
            ingest(&mut client, tenant, set).await?;
            report.insert(
                set.name.clone(),
                ask(&mut client, tenant, set, verbose, &mut dump).await?,
            );
        }
        anyhow::Ok(report)
    }
    .await;
    stack.shutdown().await;
    engram_stack::out::print(&report_text(&result?, json))?;
    Ok(())
}

/// Asks every question of the set; the graph may still be loading the
/// tenant, so the first question waits for it (at most a minute).
async fn ask(
    client: &mut Client,
    tenant: &str,
    set: &Set,
    verbose: bool,
    dump: &mut Option<std::io::BufWriter<std::fs::File>>,
) -> anyhow::Result<Tally> {
    let back: BTreeMap<String, &str> = (set.memories.iter())
        .map(|m| (uid(tenant, &m.id), m.id.as_str()))
        .collect();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let mut t = Tally::default();
    for q in &set.questions {
        let req = RetrieveRequest {
            text: q.text.clone(),
            limit: Some(10),
            no_cache: true,
            ..Default::default()
        };
        let r = client.retrieval.retrieve(req).await?.into_inner();
        let ranked: Vec<&str> = (r.records.iter())
            .filter_map(|s| s.memory.as_ref())
            .filter_map(|m| back.get(&m.id).copied())
            .collect();
        score(&mut t, q, &ranked, r.nothing_relevant);
        score_pairs(&mut t, q, &judged(&r, &back));
        if let Some(w) = dump.as_mut() {
            let line = dump_line(client, set, q, &r, &back).await?;
            writeln!(w, "{line}")?;
        }
        if verbose
            && ranked
                .first()
                .is_none_or(|f| !q.gold.iter().any(|g| g == f))
        {
            let text = |id: &str| {
                (set.memories.iter().find(|m| m.id == id)).map_or("", |m| m.content.as_str())
            };
            eprintln!("[{}] {} ({})", set.name, q.text, q.kind);
            for g in &q.gold {
                eprintln!("    gold {g}: {}", text(g));
            }
            for (i, id) in ranked.iter().take(3).enumerate() {
                eprintln!("    #{} {id}: {}", i + 1, text(id));
            }
        }
    }
    Ok(t)
}

/// What `engram eval current` prints: one JSON object, or a table per set.
fn report_text(report: &BTreeMap<String, Tally>, json: bool) -> String {
    if json {
        let out: BTreeMap<_, BTreeMap<_, _>> = (report.iter())
            .map(|(set, t)| {
                let m = (t.0.iter())
                    .map(|(k, (h, n))| (*k, serde_json::json!({"hits": h, "of": n})))
                    .collect();
                (set.clone(), m)
            })
            .collect();
        return format!(
            "{}\n",
            serde_json::json!({"dataset": "current", "sets": out})
        );
    }
    let mut text = String::new();
    for (set, t) in report {
        text.push_str(&format!("{set}\n"));
        for (k, (h, n)) in &t.0 {
            let pct = 100.0 * *h as f64 / (*n).max(1) as f64;
            text.push_str(&format!("  {k:<22} {pct:5.1} %  ({h}/{n})\n"));
        }
    }
    text
}

/// One question's answer as a JSON line for study outside the build: each
/// record's set id, event time, fused and final score, query cosine, the
/// strategies that found it with their ranks ("vector#2"), the checks it
/// passed, and its embedding.
async fn dump_line(
    client: &mut Client,
    set: &Set,
    q: &QuestionLine,
    r: &engram_proto::RetrieveResponse,
    back: &BTreeMap<String, &str>,
) -> anyhow::Result<serde_json::Value> {
    let ids: Vec<String> = (r.records.iter())
        .filter_map(|s| s.memory.as_ref().map(|m| m.id.clone()))
        .collect();
    let got = match ids.is_empty() {
        true => Default::default(),
        false => (client.memories)
            .get(GetRequest {
                ids,
                include_embedding: true,
                ..Default::default()
            })
            .await?
            .into_inner(),
    };
    let records: Vec<serde_json::Value> = (r.records.iter())
        .filter_map(|s| {
            let m = s.memory.as_ref()?;
            let p = s.provenance.as_ref();
            let cosine = (p.iter().flat_map(|p| &p.strategies))
                .find(|h| h.strategy == "vector")
                .map(|h| h.score);
            let emb = got
                .memories
                .iter()
                .find(|g| g.id == m.id)
                .map(|g| &g.embedding);
            Some(serde_json::json!({
                "id": back.get(&m.id).copied().unwrap_or(""),
                "when": m.event_time.as_ref().map(|t| t.seconds),
                "rrf": p.map(|p| p.rrf_score),
                "cosine": cosine,
                "score": s.score,
                "hits": (p.iter().flat_map(|p| &p.strategies))
                    .map(|h| format!("{}#{}", h.strategy, h.rank))
                    .collect::<Vec<_>>(),
                "checks": p.map(|p| p.checks_passed.clone()),
                "emb": emb,
            }))
        })
        .collect();
    Ok(serde_json::json!({
        "set": set.name, "text": q.text, "kind": q.kind, "gold": q.gold,
        "stale": q.stale, "records": records,
        "evidence": r.evidence_score, "flagged": r.nothing_relevant,
    }))
}
