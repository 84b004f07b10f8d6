//! `engram eval`: recall and latency measured through the public gRPC API.
//!
//! Recall follows HippoRAG: for each question, |top-k ∩ gold| / |gold|,
//! averaged over questions, in percent. Every strategy setting runs through
//! `RetrievalService.Retrieve` with a mode override (vector, keyword, graph,
//! hybrid) and once with the route-chosen pipeline (cross-encoder included).
//! Each corpus lives in its own tenant named after the data set and a hash
//! of the corpus, so a second run finds it loaded and does not re-embed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use engram_proto::{
    AgenticRetrieveRequest, GetRequest, Memory, RetrievalMode, RetrieveRequest, Triple,
    UpsertRequest,
};
use engram_stack::client::Client;
use futures::StreamExt;
use serde::Deserialize;
use sha2::{Digest, Sha256};

pub const KS: [usize; 4] = [1, 2, 5, 10];
pub const SETTINGS: [(&str, RetrievalMode); 5] = [
    ("vector", RetrievalMode::Vector),
    ("keyword", RetrievalMode::Keyword),
    ("graph", RetrievalMode::Graph),
    ("hybrid", RetrievalMode::Hybrid),
    ("pipeline", RetrievalMode::Auto),
];

/// One corpus passage / turn to ingest.
#[derive(Debug, Clone, Default)]
pub struct Doc {
    pub title: String,
    pub text: String,
    pub event_time_opt: Option<chrono::DateTime<chrono::Utc>>,
    pub metadata_opt: Option<serde_json::Value>,
    pub entities: Vec<String>,
    pub triples: Vec<[String; 3]>,
    /// A conversation turn's session, place, speaker and caption.
    pub turn_opt: Option<engram_proto::Turn>,
}

/// A question with the corpus indices of its gold documents.
#[derive(Debug, Clone)]
pub struct Question {
    pub text: String,
    pub gold: Vec<usize>,
    /// LoCoMo's question category (1–4), so the report can say which kind
    /// of question a change helps; None for the other data sets.
    pub category: Option<u8>,
    /// When the question is asked (LongMemEval's `question_date`): sent as
    /// the request's `as_of_event`, from which "last week" counts.
    pub asked_at_opt: Option<chrono::DateTime<chrono::Utc>>,
}

/// A data set split into tenants (LoCoMo: one per conversation).
#[derive(Debug, Clone)]
pub struct Part {
    pub tenant: String,
    pub docs: Vec<Doc>,
    pub questions: Vec<Question>,
}

/// HippoRAG's recall: |top-k ∩ gold| / |gold| (0 when gold is empty).
pub fn recall_at(ranked: &[usize], gold: &[usize], k: usize) -> f64 {
    if gold.is_empty() {
        return 0.0;
    }
    let gold: HashSet<usize> = gold.iter().copied().collect();
    let top: HashSet<usize> = ranked.iter().take(k).copied().collect();
    gold.intersection(&top).count() as f64 / gold.len() as f64
}

/// 1 when at least one gold document is in the top k, else 0: beside
/// recall because an agent often needs only one of the evidence turns.
pub fn any_hit_at(ranked: &[usize], gold: &[usize], k: usize) -> f64 {
    let hit = ranked.iter().take(k).any(|r| gold.contains(r));
    if hit { 1.0 } else { 0.0 }
}

pub fn percentile(sorted_ms: &[f64], p: f64) -> f64 {
    if sorted_ms.is_empty() {
        return 0.0;
    }
    let idx = ((p / 100.0) * (sorted_ms.len() - 1) as f64).round() as usize;
    sorted_ms[idx.min(sorted_ms.len() - 1)]
}

pub(crate) fn hash_files(paths: &[&Path]) -> anyhow::Result<String> {
    let mut h = Sha256::new();
    for p in paths {
        h.update(std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?);
    }
    Ok(hex::encode(h.finalize())[..12].to_string())
}

// ---------- loaders ----------

#[derive(Deserialize)]
struct WikiPassage {
    title: String,
    text: String,
}

#[derive(Deserialize)]
struct WikiQuestion {
    question: String,
    gold_passage_idx: Vec<usize>,
}

/// 2WikiMultihopQA (HippoRAG's corpus + questions jsonl).
pub fn load_2wiki(
    corpus: &Path,
    questions: &Path,
    limit_opt: Option<usize>,
) -> anyhow::Result<Part> {
    let text = std::fs::read_to_string(corpus)
        .with_context(|| format!("cannot read {}", corpus.display()))?;
    let passages: Vec<WikiPassage> = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}:{}: {e}", corpus.display(), e.line()))?;
    let qtext = std::fs::read_to_string(questions)
        .with_context(|| format!("cannot read {}", questions.display()))?;
    let mut qs = Vec::new();
    for (i, line) in qtext.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let q: WikiQuestion = serde_json::from_str(line)
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", questions.display(), i + 1))?;
        if let Some(bad) = q.gold_passage_idx.iter().find(|&&g| g >= passages.len()) {
            bail!(
                "{}:{}: gold_passage_idx {bad} is outside the corpus ({} passages)",
                questions.display(),
                i + 1,
                passages.len()
            );
        }
        qs.push(Question {
            text: q.question,
            gold: q.gold_passage_idx,
            category: None,
            asked_at_opt: None,
        });
    }
    if let Some(n) = limit_opt {
        qs.truncate(n);
    }
    Ok(Part {
        tenant: format!("eval-2wiki-{}", hash_files(&[corpus])?),
        docs: passages
            .into_iter()
            .map(|p| Doc {
                title: p.title,
                text: p.text,
                ..Default::default()
            })
            .collect(),
        questions: qs,
    })
}

#[derive(Deserialize)]
struct MusiqueParagraph {
    title: String,
    paragraph_text: String,
    #[serde(default)]
    is_supporting: bool,
}

#[derive(Deserialize)]
struct MusiqueQuestion {
    question: String,
    paragraphs: Vec<MusiqueParagraph>,
}

#[derive(Deserialize)]
struct OpenIeFile {
    docs: Vec<OpenIeDoc>,
}

#[derive(Deserialize)]
struct OpenIeDoc {
    title: String,
    text: String,
    #[serde(default)]
    extracted_entities: Vec<serde_json::Value>,
    #[serde(default)]
    extracted_triples: Vec<Vec<serde_json::Value>>,
}

/// MuSiQue: corpus = union of the questions' paragraphs; gold = is_supporting.
/// With `openie`, its entities and triples are supplied at ingest.
pub fn load_musique(
    questions: &Path,
    openie_opt: Option<&Path>,
    limit_opt: Option<usize>,
) -> anyhow::Result<Part> {
    let text = std::fs::read_to_string(questions)
        .with_context(|| format!("cannot read {}", questions.display()))?;
    let raw: Vec<MusiqueQuestion> = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}:{}: {e}", questions.display(), e.line()))?;
    let mut docs: Vec<Doc> = Vec::new();
    let mut index: HashMap<(String, String), usize> = HashMap::new();
    let mut qs = Vec::new();
    for q in raw {
        let mut gold = Vec::new();
        for p in q.paragraphs {
            let key = (p.title.clone(), p.paragraph_text.clone());
            let idx = *index.entry(key).or_insert_with(|| {
                docs.push(Doc {
                    title: p.title.clone(),
                    text: p.paragraph_text.clone(),
                    ..Default::default()
                });
                docs.len() - 1
            });
            if p.is_supporting {
                gold.push(idx);
            }
        }
        qs.push(Question {
            text: q.question,
            gold,
            category: None,
            asked_at_opt: None,
        });
    }
    let mut hashed: Vec<&Path> = vec![questions];
    if let Some(path) = openie_opt {
        hashed.push(path);
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        // HippoRAG wrote this file with Python's json, which emits bare NaN.
        let text = text.replace(": NaN", ": null");
        let ie: OpenIeFile = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), e.line()))?;
        let as_str = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        for d in ie.docs {
            if let Some(&idx) = index.get(&(d.title.clone(), d.text.clone())) {
                let doc = &mut docs[idx];
                doc.entities = d
                    .extracted_entities
                    .iter()
                    .map(as_str)
                    .filter(|s| !s.is_empty())
                    .collect();
                doc.triples = d
                    .extracted_triples
                    .iter()
                    .filter(|t| t.len() == 3)
                    .map(|t| [as_str(&t[0]), as_str(&t[1]), as_str(&t[2])])
                    .collect();
            }
        }
    }
    if let Some(n) = limit_opt {
        qs.truncate(n);
    }
    let tag = if openie_opt.is_some() {
        "musique-openie"
    } else {
        "musique"
    };
    Ok(Part {
        tenant: format!("eval-{tag}-{}", hash_files(&hashed)?),
        docs,
        questions: qs,
    })
}

#[derive(Deserialize)]
struct HotpotQuestion {
    question: String,
    /// [title, sentence index] pairs.
    supporting_facts: Vec<(String, serde_json::Value)>,
}

/// HotpotQA in HippoRAG's layout: a corpus object title → sentences and
/// questions whose gold passages are the titles of their supporting facts.
pub fn load_hotpotqa(
    corpus: &Path,
    questions: &Path,
    limit_opt: Option<usize>,
) -> anyhow::Result<Part> {
    let text = std::fs::read_to_string(corpus)
        .with_context(|| format!("cannot read {}", corpus.display()))?;
    let raw: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}:{}: {e}", corpus.display(), e.line()))?;
    let mut docs = Vec::with_capacity(raw.len());
    let mut index: HashMap<String, usize> = HashMap::new();
    for (title, sentences) in raw {
        let sentences = sentences.as_array().with_context(|| {
            format!(
                "{}: passage {title:?} is not a list of sentences",
                corpus.display()
            )
        })?;
        let body: String = sentences.iter().filter_map(|s| s.as_str()).collect();
        index.insert(title.clone(), docs.len());
        docs.push(Doc {
            title,
            text: body.trim().to_string(),
            ..Default::default()
        });
    }
    let text = std::fs::read_to_string(questions)
        .with_context(|| format!("cannot read {}", questions.display()))?;
    let raw: Vec<HotpotQuestion> = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}:{}: {e}", questions.display(), e.line()))?;
    let mut qs = Vec::new();
    for (n, q) in raw.into_iter().enumerate() {
        let mut gold: Vec<usize> = Vec::new();
        for (title, _) in &q.supporting_facts {
            let idx = *index.get(title).with_context(|| {
                format!(
                    "{}: question {n} cites {title:?}, which is not in {}",
                    questions.display(),
                    corpus.display()
                )
            })?;
            if !gold.contains(&idx) {
                gold.push(idx);
            }
        }
        qs.push(Question {
            text: q.question,
            gold,
            category: None,
            asked_at_opt: None,
        });
    }
    if let Some(n) = limit_opt {
        qs.truncate(n);
    }
    Ok(Part {
        tenant: format!("eval-hotpotqa-{}", hash_files(&[corpus, questions])?),
        docs,
        questions: qs,
    })
}

/// LoCoMo: one tenant per conversation, one memory per turn ("speaker: text",
/// session date as event_time, dia_id in metadata); categories 1–4.
pub fn load_locomo(
    data: &Path,
    lo: usize,
    hi: usize,
    limit_opt: Option<usize>,
) -> anyhow::Result<Vec<Part>> {
    let text =
        std::fs::read_to_string(data).with_context(|| format!("cannot read {}", data.display()))?;
    let convs: Vec<serde_json::Value> = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}:{}: {e}", data.display(), e.line()))?;
    if hi >= convs.len() || lo > hi {
        bail!(
            "--conversations {lo}-{hi}: {} has conversations 0-{}",
            data.display(),
            convs.len().saturating_sub(1)
        );
    }
    let hash = hash_files(&[data])?;
    let mut parts = Vec::new();
    for (ci, conv) in convs.iter().enumerate().take(hi + 1).skip(lo) {
        let c = conv
            .get("conversation")
            .and_then(|c| c.as_object())
            .with_context(|| {
                format!(
                    "{}: conversation {ci} has no \"conversation\" object",
                    data.display()
                )
            })?;
        let mut sessions: Vec<(usize, &Vec<serde_json::Value>)> = c
            .iter()
            .filter_map(|(k, v)| {
                let n: usize = k.strip_prefix("session_")?.parse().ok()?;
                Some((n, v.as_array()?))
            })
            .collect();
        sessions.sort_by_key(|(n, _)| *n);
        let mut docs = Vec::new();
        let mut by_dia: HashMap<String, usize> = HashMap::new();
        for (n, turns) in sessions {
            let date_opt = c
                .get(&format!("session_{n}_date_time"))
                .and_then(|d| d.as_str())
                .and_then(parse_locomo_date);
            for (ti, t) in turns.iter().enumerate() {
                let speaker = t.get("speaker").and_then(|s| s.as_str()).unwrap_or("");
                let said = t.get("text").and_then(|s| s.as_str()).unwrap_or("");
                let dia = t
                    .get("dia_id")
                    .and_then(|s| s.as_str())
                    .unwrap_or("")
                    .trim()
                    .to_string();
                let caption = t.get("blip_caption").and_then(|s| s.as_str()).unwrap_or("");
                // Turns in one session share a date; keep their order.
                let et = date_opt.map(|d| d + chrono::Duration::seconds(ti as i64));
                by_dia.insert(dia.clone(), docs.len());
                docs.push(Doc {
                    title: String::new(),
                    text: said.to_string(),
                    event_time_opt: et,
                    metadata_opt: Some(serde_json::json!({"dia_id": dia})),
                    turn_opt: Some(engram_proto::Turn {
                        session_id: format!("session_{n}"),
                        turn_index: ti as u32,
                        speaker: speaker.to_string(),
                        caption: caption.to_string(),
                    }),
                    ..Default::default()
                });
            }
        }
        let mut qs = Vec::new();
        for qa in conv
            .get("qa")
            .and_then(|q| q.as_array())
            .into_iter()
            .flatten()
        {
            let cat = qa.get("category").and_then(|c| c.as_i64()).unwrap_or(0);
            if !(1..=4).contains(&cat) {
                continue;
            }
            let gold: Vec<usize> = qa
                .get("evidence")
                .and_then(|e| e.as_array())
                .into_iter()
                .flatten()
                .filter_map(|e| e.as_str())
                .filter_map(|e| by_dia.get(e.trim()).copied())
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            if gold.is_empty() {
                continue;
            }
            let text = qa
                .get("question")
                .and_then(|q| q.as_str())
                .unwrap_or("")
                .to_string();
            qs.push(Question {
                text,
                gold,
                category: u8::try_from(cat).ok(),
                asked_at_opt: None,
            });
        }
        if let Some(n) = limit_opt {
            qs.truncate(n);
        }
        parts.push(Part {
            // "turns": each memory is a conversation turn (session, index,
            // speaker, caption), not "speaker: text" in the content.
            tenant: format!("eval-locomo-turns-{hash}-{ci}"),
            docs,
            questions: qs,
        });
    }
    Ok(parts)
}

/// "1:56 pm on 8 May, 2023" → UTC timestamp.
pub fn parse_locomo_date(s: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let naive = chrono::NaiveDateTime::parse_from_str(s.trim(), "%I:%M %p on %d %B, %Y").ok()?;
    Some(naive.and_utc())
}

// ---------- running ----------

pub fn doc_id(tenant: &str, idx: usize) -> String {
    uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("{tenant}:{idx}").as_bytes(),
    )
    .to_string()
}

/// Ingests the part's docs unless its last doc is already there.
pub async fn ensure_ingested(
    client: &mut Client,
    part: &Part,
    progress: bool,
) -> anyhow::Result<(bool, f64)> {
    let Some(last) = part.docs.len().checked_sub(1) else {
        return Ok((false, 0.0));
    };
    let have = client
        .memories
        .get(GetRequest {
            ids: vec![doc_id(&part.tenant, last)],
            include_embedding: false,
            omit_entities: false,
            vectors_only: false,
            ..Default::default()
        })
        .await?
        .into_inner();
    if !have.memories.is_empty() {
        return Ok((false, 0.0));
    }
    let started = Instant::now();
    let memories: Vec<Memory> = part
        .docs
        .iter()
        .enumerate()
        .map(|(i, d)| Memory {
            id: doc_id(&part.tenant, i),
            title: d.title.clone(),
            content: d.text.clone(),
            memory_type: "document".into(),
            event_time: d.event_time_opt.map(engram_common::convert::chrono_to_ts),
            metadata: d
                .metadata_opt
                .as_ref()
                .map(engram_common::convert::json_to_struct),
            entities: d.entities.clone(),
            triples: d
                .triples
                .iter()
                .map(|[s, r, o]| Triple {
                    subject: s.clone(),
                    relation: r.clone(),
                    object: o.clone(),
                })
                .collect(),
            turn: d.turn_opt.clone(),
            ..Default::default()
        })
        .collect();
    let mut done = 0;
    // In order, so the last doc landing means the whole corpus did.
    for chunk in memories.chunks(64) {
        client
            .memories
            .upsert(UpsertRequest {
                memories: chunk.to_vec(),
            })
            .await?;
        done += chunk.len();
        if progress {
            eprint!("\r  ingesting {}: {done}/{}", part.tenant, memories.len());
        }
    }
    if progress {
        eprintln!();
    }
    Ok((true, started.elapsed().as_secs_f64()))
}

/// Sums at each of [`KS`], per setting.
type SumsAtK = BTreeMap<&'static str, [f64; KS.len()]>;

/// Per-setting recall sums and pipeline latencies over all parts.
#[derive(Debug, Default)]
pub struct Tally {
    pub sums: SumsAtK,
    pub questions: usize,
    pub pipeline_ms: Vec<f64>,
    pub degraded: BTreeMap<String, usize>,
    pub errors: usize,
    /// Per question category (LoCoMo 1–4); empty for uncategorised sets,
    /// whose report then stays as it was.
    pub by_category: BTreeMap<u8, CategoryTally>,
}

/// One question category's recall and any-hit sums per setting.
#[derive(Debug, Default)]
pub struct CategoryTally {
    pub questions: usize,
    pub recall: SumsAtK,
    pub any_hit: SumsAtK,
}

impl Tally {
    /// Adds one answered question's recall (and, when it has a category,
    /// its category's recall and any-hit) at every k.
    fn score(&mut self, name: &'static str, q: &Question, ranked: &[usize]) {
        let sums = self.sums.entry(name).or_insert([0.0; KS.len()]);
        for (i, k) in KS.iter().enumerate() {
            sums[i] += recall_at(ranked, &q.gold, *k);
        }
        let Some(cat) = q.category else {
            return;
        };
        let c = self.by_category.entry(cat).or_default();
        let recall = c.recall.entry(name).or_insert([0.0; KS.len()]);
        let any = c.any_hit.entry(name).or_insert([0.0; KS.len()]);
        for (i, k) in KS.iter().enumerate() {
            recall[i] += recall_at(ranked, &q.gold, *k);
            any[i] += any_hit_at(ranked, &q.gold, *k);
        }
    }

    /// Counts the part's questions, overall and per category, once
    /// whatever the number of settings.
    fn count(&mut self, part: &Part) {
        self.questions += part.questions.len();
        for cat in part.questions.iter().filter_map(|q| q.category) {
            self.by_category.entry(cat).or_default().questions += 1;
        }
    }
}

/// Ranked corpus indices, latency in ms, degraded stages, and (for
/// `--dump`) the route and each record's score.
type Answer = (Vec<usize>, f64, Vec<String>, Dumped);

/// What `--dump` writes of one answer beside the question and its gold.
#[derive(Debug, Default)]
struct Dumped {
    route: i32,
    scores: Vec<f32>,
}

/// The optional setting: `RetrieveAgentic` with rule-based decomposition
/// (reasoning_effort medium, 10 results per step), ranked by its score.
pub const AGENTIC: &str = "agentic";

/// How one setting asks a question.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ask {
    Mode(RetrievalMode),
    Agentic,
}

/// One Retrieve, waiting out the gateway's per-tenant request rate
/// (`tenant.requests_per_second`): the single-strategy settings run several
/// queries at once, and fast ones (graph alone, keyword from the in-memory
/// index) outrun 200 per second, which the eval must not count as misses.
async fn retrieve_within_rate(
    c: &mut Client,
    req: RetrieveRequest,
) -> anyhow::Result<engram_proto::RetrieveResponse> {
    for _ in 0..200 {
        match c.retrieval.retrieve(req.clone()).await {
            Err(s)
                if s.code() == tonic::Code::ResourceExhausted
                    && s.message().contains("request rate") =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            r => return Ok(r?.into_inner()),
        }
    }
    Ok(c.retrieval.retrieve(req).await?.into_inner())
}

async fn ask(
    mut c: Client,
    tenant: &str,
    q: &Question,
    how: Ask,
    ids: &HashMap<String, usize>,
    agentic_mode: &str,
) -> anyhow::Result<Answer> {
    let text = q.text.as_str();
    let t = Instant::now();
    let mut dumped = Dumped::default();
    let (found, degraded): (Vec<String>, Vec<String>) = match how {
        Ask::Mode(mode) => {
            let req = RetrieveRequest {
                text: text.to_string(),
                limit: Some(10),
                mode: mode as i32,
                no_cache: true,
                as_of_event: q.asked_at_opt.map(engram_common::convert::chrono_to_ts),
                ..Default::default()
            };
            let r = retrieve_within_rate(&mut c, req).await?;
            dumped.route = r.route;
            dumped.scores = r.records.iter().map(|x| x.score).collect();
            let found = r
                .records
                .into_iter()
                .filter_map(|x| x.memory)
                .map(|m| m.id)
                .collect();
            (found, r.degraded_stages)
        }
        Ask::Agentic => {
            let req = AgenticRetrieveRequest {
                query: text.to_string(),
                tenant_id: tenant.to_string(),
                reasoning_effort: "medium".into(),
                top_k_per_step: Some(10),
                mode: agentic_mode.to_string(),
                ..Default::default()
            };
            let mut r = c.foundry.retrieve_agentic(req).await?.into_inner().results;
            r.sort_by(|a, b| b.score.total_cmp(&a.score));
            (r.into_iter().map(|x| x.chunk_id).collect(), Vec::new())
        }
    };
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let ranked = found.iter().filter_map(|id| ids.get(id).copied()).collect();
    Ok((ranked, ms, degraded, dumped))
}

/// One JSON line per question for `--dump`: the ranked corpus indices with
/// their scores and text, the gold, the route; what a prototype of a
/// ranking change needs (docs/benchmarks.md, "Complementary slots").
fn dump_line(part: &Part, setting: &str, q: &Question, ranked: &[usize], d: &Dumped) -> String {
    let records: Vec<serde_json::Value> = (ranked.iter().zip(&d.scores))
        .map(|(&i, score)| {
            let doc = &part.docs[i];
            serde_json::json!({"doc": i, "score": score, "title": doc.title, "text": doc.text})
        })
        .collect();
    serde_json::json!({
        "tenant": part.tenant, "setting": setting, "question": q.text,
        "gold": q.gold, "route": d.route, "records": records,
    })
    .to_string()
}

pub async fn run_part(
    clients: &HashMap<String, Client>,
    part: &Part,
    tally: &mut Tally,
    concurrency: usize,
    agentic_opt: Option<&str>,
    mut dump_opt: Option<&mut dyn std::io::Write>,
    progress: bool,
) -> anyhow::Result<()> {
    let client = clients
        .get(&part.tenant)
        .context("no client for tenant")?
        .clone();
    let ids: HashMap<String, usize> = (0..part.docs.len())
        .map(|i| (doc_id(&part.tenant, i), i))
        .collect();
    let mut settings: Vec<(&'static str, Ask)> =
        SETTINGS.iter().map(|&(n, m)| (n, Ask::Mode(m))).collect();
    if agentic_opt.is_some() {
        settings.push((AGENTIC, Ask::Agentic));
    }
    let agentic_mode = agentic_opt.unwrap_or_default();
    for (name, how) in settings {
        let pipeline = how == Ask::Mode(RetrievalMode::Auto);
        let conc = if pipeline { 1 } else { concurrency };
        let results: Vec<anyhow::Result<Answer>> = futures::stream::iter(part.questions.iter())
            .map(|q| ask(client.clone(), &part.tenant, q, how, &ids, agentic_mode))
            .buffered(conc)
            .collect()
            .await;
        // A setting whose every query failed is still reported (as 0).
        tally.sums.entry(name).or_insert([0.0; KS.len()]);
        for (q, res) in part.questions.iter().zip(results) {
            match res {
                Ok((ranked, ms, degraded, dumped)) => {
                    if let (Some(out), Ask::Mode(_)) = (dump_opt.as_mut(), how) {
                        writeln!(out, "{}", dump_line(part, name, q, &ranked, &dumped))?;
                    }
                    tally.score(name, q, &ranked);
                    if pipeline {
                        tally.pipeline_ms.push(ms);
                        for d in degraded {
                            *tally.degraded.entry(d).or_default() += 1;
                        }
                    }
                }
                Err(e) => {
                    tally.errors += 1;
                    tracing::warn!(setting = name, error = %e, "eval query failed");
                }
            }
        }
        if progress {
            eprintln!(
                "  {}: {name} done ({} questions)",
                part.tenant,
                part.questions.len()
            );
        }
    }
    tally.count(part);
    Ok(())
}

/// Replays every question of `part` (AUTO, limit 10, as the pipeline
/// setting asks it) and sends feedback on each answer through the real
/// Feedback RPC: every returned gold memory helpful, every other one not.
/// The gateway turns each into training examples (ranker_examples).
pub async fn send_gold_feedback(client: &Client, part: &Part) -> anyhow::Result<()> {
    use engram_proto::{FeedbackItem, FeedbackRequest, FeedbackSignal};
    let gold_ids = |q: &Question| -> std::collections::HashSet<String> {
        q.gold.iter().map(|&i| doc_id(&part.tenant, i)).collect()
    };
    for q in &part.questions {
        let mut c = client.clone();
        let req = RetrieveRequest {
            text: q.text.clone(),
            limit: Some(10),
            no_cache: true,
            ..Default::default()
        };
        let r = c.retrieval.retrieve(req).await?.into_inner();
        let gold = gold_ids(q);
        let items: Vec<FeedbackItem> = (r.records.iter())
            .filter_map(|s| s.memory.as_ref())
            .map(|m| FeedbackItem {
                memory_id: m.id.clone(),
                signal: FeedbackSignal::Helpful as i32,
                value: gold.contains(&m.id),
            })
            .collect();
        if items.is_empty() {
            continue;
        }
        let fb = FeedbackRequest {
            query_id: r.query_id,
            items,
        };
        c.retrieval.feedback(fb).await?;
    }
    // The gateway stores feedback in the background: let it drain.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    Ok(())
}

/// The settings a report shows: every strategy, then agentic when run.
fn reported(tally: &Tally) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = SETTINGS.iter().map(|&(n, _)| n).collect();
    if tally.sums.contains_key(AGENTIC) {
        names.push(AGENTIC);
    }
    names
}

/// {"k": {setting: mean in percent, one decimal}} over `questions`.
fn at_k(sums: &SumsAtK, names: &[&'static str], questions: usize) -> serde_json::Value {
    let n = questions.max(1) as f64;
    let mut out = serde_json::Map::new();
    for (i, k) in KS.iter().enumerate() {
        let mut per = serde_json::Map::new();
        for &name in names {
            let v = sums.get(name).map(|s| s[i]).unwrap_or(0.0) / n * 100.0;
            per.insert(name.into(), serde_json::json!((v * 10.0).round() / 10.0));
        }
        out.insert(k.to_string(), serde_json::Value::Object(per));
    }
    serde_json::Value::Object(out)
}

/// {"1": {"questions", "recall_at", "any_hit_at"}, ...}: per category.
fn by_category_json(tally: &Tally) -> serde_json::Value {
    let names = reported(tally);
    let per = tally.by_category.iter().map(|(cat, c)| {
        let v = serde_json::json!({
            "questions": c.questions,
            "recall_at": at_k(&c.recall, &names, c.questions),
            "any_hit_at": at_k(&c.any_hit, &names, c.questions),
        });
        (cat.to_string(), v)
    });
    serde_json::Value::Object(per.collect())
}

/// The contract JSON of design.md (plus `by_category` for LoCoMo).
pub fn report_json(dataset: &str, tally: &Tally) -> serde_json::Value {
    let recall = at_k(&tally.sums, &reported(tally), tally.questions);
    let mut ms = tally.pipeline_ms.clone();
    ms.sort_by(|a, b| a.total_cmp(b));
    let r1 = |v: f64| (v * 10.0).round() / 10.0;
    let mut j = serde_json::json!({
        "dataset": dataset,
        "questions": tally.questions,
        "recall_at": recall,
        "latency_ms": {"p50": r1(percentile(&ms, 50.0)), "p95": r1(percentile(&ms, 95.0))},
    });
    if !tally.by_category.is_empty() {
        j["by_category"] = by_category_json(tally);
    }
    j
}

/// The pipeline setting's recall and any-hit per category, for the table.
fn category_table(j: &serde_json::Value) -> String {
    let Some(cats) = j["by_category"].as_object() else {
        return String::new();
    };
    let mut out = format!("{:<16}", "pipeline by cat");
    for label in ["R", "hit"] {
        for k in KS {
            out.push_str(&format!("{:>8}", format!("{label}@{k}")));
        }
    }
    out.push('\n');
    for (cat, c) in cats {
        out.push_str(&format!(
            "{:<16}",
            format!("cat {cat} ({})", c["questions"])
        ));
        for key in ["recall_at", "any_hit_at"] {
            for k in KS {
                let v = c[key][k.to_string()]["pipeline"].as_f64().unwrap_or(0.0);
                out.push_str(&format!("{v:>8.1}"));
            }
        }
        out.push('\n');
    }
    out
}

pub fn report_table(dataset: &str, tally: &Tally) -> String {
    let j = report_json(dataset, tally);
    let mut out = format!(
        "{dataset}: {} questions\n{:<10}",
        tally.questions, "setting"
    );
    for k in KS {
        out.push_str(&format!("{:>8}", format!("R@{k}")));
    }
    out.push('\n');
    for name in reported(tally) {
        out.push_str(&format!("{name:<10}"));
        for k in KS {
            let v = j["recall_at"][k.to_string()][name].as_f64().unwrap_or(0.0);
            out.push_str(&format!("{v:>8.1}"));
        }
        out.push('\n');
    }
    out.push_str(&category_table(&j));
    out.push_str(&format!(
        "pipeline latency p50 {} ms, p95 {} ms\n",
        j["latency_ms"]["p50"], j["latency_ms"]["p95"]
    ));
    if !tally.degraded.is_empty() {
        out.push_str(&format!("degraded stages: {:?}\n", tally.degraded));
    }
    if tally.errors > 0 {
        out.push_str(&format!("failed queries: {}\n", tally.errors));
    }
    out
}

/// Parses "0-4" or "3".
pub fn parse_range(s: &str) -> anyhow::Result<(usize, usize)> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let lo = a
        .trim()
        .parse()
        .with_context(|| format!("--conversations {s:?}: expected N or N-M"))?;
    let hi = b
        .trim()
        .parse()
        .with_context(|| format!("--conversations {s:?}: expected N or N-M"))?;
    if lo > hi {
        bail!("--conversations {s:?}: start after end");
    }
    Ok((lo, hi))
}

/// Default data folder: `<shared>/data`.
pub fn data_path(rel: &str) -> PathBuf {
    engram_common::bootstrap::shared_dir()
        .map(|d| d.join("data").join(rel))
        .unwrap_or_else(|| PathBuf::from("../shared/data").join(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_follows_hipporag() {
        assert_eq!(recall_at(&[1, 2, 3], &[2, 9], 2), 0.5);
        assert_eq!(recall_at(&[1, 2, 3], &[2, 3], 2), 0.5);
        assert_eq!(recall_at(&[1, 2, 3], &[2, 3], 5), 1.0);
        assert_eq!(recall_at(&[], &[1], 5), 0.0);
        assert_eq!(recall_at(&[1], &[], 5), 0.0);
        // Duplicates in the ranking do not count twice.
        assert_eq!(recall_at(&[4, 4, 5], &[4, 5], 2), 0.5);
    }

    #[test]
    fn any_hit_needs_one_gold_in_the_top_k() {
        assert_eq!(any_hit_at(&[1, 2, 3], &[3, 9], 2), 0.0);
        assert_eq!(any_hit_at(&[1, 2, 3], &[3, 9], 3), 1.0);
        assert_eq!(any_hit_at(&[], &[1], 5), 0.0);
        assert_eq!(any_hit_at(&[1], &[], 5), 0.0);
    }

    #[test]
    fn a_dump_line_names_the_ranked_documents_with_scores_and_text() {
        let doc = |title: &str| Doc {
            title: title.into(),
            text: format!("about {title}"),
            event_time_opt: None,
            metadata_opt: None,
            entities: Vec::new(),
            triples: Vec::new(),
            turn_opt: None,
        };
        let part = Part {
            tenant: "t".into(),
            docs: vec![doc("a"), doc("b")],
            questions: Vec::new(),
        };
        let d = Dumped {
            route: 2,
            scores: vec![0.9, 0.4],
        };
        let line = dump_line(&part, "pipeline", &question(vec![1], None), &[1, 0], &d);
        let j: serde_json::Value = serde_json::from_str(&line).expect("json");
        assert_eq!(j["setting"], "pipeline");
        assert_eq!(j["route"], 2);
        assert_eq!(j["gold"], serde_json::json!([1]));
        assert_eq!(j["records"][0]["doc"], 1);
        assert_eq!(j["records"][0]["title"], "b");
        assert_eq!(j["records"][1]["text"], "about a");
        assert!((j["records"][0]["score"].as_f64().expect("score") - 0.9).abs() < 1e-6);
    }

    fn question(gold: Vec<usize>, category: Option<u8>) -> Question {
        Question {
            text: String::new(),
            gold,
            category,
            asked_at_opt: None,
        }
    }

    #[test]
    fn categories_are_reported_only_when_questions_have_them() {
        let part = Part {
            tenant: "t".into(),
            docs: Vec::new(),
            questions: vec![question(vec![1, 2], Some(2)), question(vec![7], Some(2))],
        };
        let mut tally = Tally::default();
        tally.score("pipeline", &part.questions[0], &[1, 5]);
        tally.score("pipeline", &part.questions[1], &[5, 7]);
        tally.count(&part);
        let j = report_json("locomo", &tally);
        let c = &j["by_category"]["2"];
        assert_eq!(c["questions"], 2);
        // k=1: recall (1/2 + 0) / 2, any-hit (1 + 0) / 2.
        assert_eq!(c["recall_at"]["1"]["pipeline"], 25.0);
        assert_eq!(c["any_hit_at"]["1"]["pipeline"], 50.0);
        assert_eq!(c["any_hit_at"]["2"]["pipeline"], 100.0);
        assert_eq!(j["recall_at"]["2"]["pipeline"], 75.0);
        assert!(report_table("locomo", &tally).contains("cat 2 (2)"));
        let mut plain = Tally::default();
        plain.score("pipeline", &question(vec![1], None), &[1]);
        let j = report_json("2wiki", &plain);
        assert!(j.get("by_category").is_none());
        assert!(!report_table("2wiki", &plain).contains("by cat"));
    }

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 51.0);
        assert_eq!(percentile(&v, 95.0), 95.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn locomo_dates_parse() {
        let d = parse_locomo_date("1:56 pm on 8 May, 2023").expect("date");
        assert_eq!(d.to_rfc3339(), "2023-05-08T13:56:00+00:00");
    }

    #[test]
    fn ranges_parse() {
        assert_eq!(parse_range("0-4").expect("range"), (0, 4));
        assert_eq!(parse_range("3").expect("range"), (3, 3));
        assert!(parse_range("4-0").is_err());
        assert!(parse_range("x").is_err());
    }

    /// The dev data sets, in `shared/data` beside the checkout; a clone
    /// without that folder skips the tests that read them.
    fn shared(rel: &str) -> PathBuf {
        data_path(rel)
    }

    #[test]
    fn loaders_read_small_slices_of_the_real_files() {
        if !engram_common::bootstrap::present_or_skip(&shared(""), "the dev data sets") {
            return;
        }
        let p = load_2wiki(
            &shared("hipporag/2wikimultihopqa_corpus.json"),
            &shared("hipporag/2wiki_dev.jsonl"),
            Some(5),
        )
        .expect("2wiki");
        assert_eq!(p.docs.len(), 6119);
        assert_eq!(p.questions.len(), 5);
        assert_eq!(p.questions[0].gold, vec![4, 5]);
        let m = load_musique(
            &shared("hipporag/musique_train.json"),
            Some(&shared(
                "hipporag/openie_musique_train_results_ner_gpt-3.5-turbo-1106_1890.json",
            )),
            Some(3),
        )
        .expect("musique");
        assert!(m.docs.len() > 1000);
        assert!(m.questions.iter().all(|q| !q.gold.is_empty()));
        assert!(
            m.docs.iter().filter(|d| !d.triples.is_empty()).count() > 1000,
            "openie triples attached"
        );
        let l = load_locomo(&shared("locomo/locomo10.json"), 0, 1, Some(4)).expect("locomo");
        assert_eq!(l.len(), 2);
        assert!(l[0].docs.len() > 100);
        assert_eq!(l[0].questions.len(), 4);
        assert!(
            l[0].questions
                .iter()
                .all(|q| q.category.is_some_and(|c| (1..=4).contains(&c)))
        );
        assert!(l[0].docs[0].event_time_opt.is_some());
        let h = load_hotpotqa(
            &shared("hipporag/hotpotqa_train_corpus.json"),
            &shared("hipporag/hotpotqa_train.json"),
            Some(3),
        )
        .expect("hotpotqa");
        assert_eq!(h.docs.len(), 994);
        assert_eq!(h.questions.len(), 3);
        assert!(h.questions.iter().all(|q| q.gold.len() >= 2));
        let first = &h.docs[h.questions[0].gold[0]];
        assert!(!first.text.is_empty() && !first.title.is_empty());
    }

    #[test]
    fn malformed_files_name_file_and_line() {
        let dir =
            std::env::temp_dir().join(format!("engram-eval-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("dir");
        let corpus = dir.join("c.json");
        let qs = dir.join("q.jsonl");
        std::fs::write(&corpus, "[{\"title\":\"a\",\"text\":\"b\"}]").expect("write");
        std::fs::write(
            &qs,
            "{\"question\":\"x\",\"gold_passage_idx\":[0]}\n{\"question\":\"y\"}\n",
        )
        .expect("write");
        let err = load_2wiki(&corpus, &qs, None).expect_err("bad line 2");
        assert!(format!("{err:#}").contains("q.jsonl:2"), "{err:#}");
        std::fs::write(&qs, "{\"question\":\"x\",\"gold_passage_idx\":[7]}\n").expect("write");
        let err = load_2wiki(&corpus, &qs, None).expect_err("bad gold");
        assert!(format!("{err:#}").contains("outside the corpus"), "{err:#}");
        std::fs::write(&corpus, "[{\"title\":\"a\"}").expect("write");
        let err = load_2wiki(&corpus, &qs, None).expect_err("bad corpus");
        assert!(format!("{err:#}").contains("c.json:1"), "{err:#}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
