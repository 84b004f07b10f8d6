//! Hostile input at scale, part two (issue 23; tests/hostile_input.rs is
//! part one: typed Retrieve / Upsert / Feedback / Basic requests and the
//! HTTP JSON bodies). cargo-fuzz needs nightly and a separate crate per
//! target; these are long proptest runs instead, over protobuf *wire*
//! messages: random (field number, wire type, value) records, nested to
//! three levels, decoded by prost into each request type, and, half the
//! time, a valid request of that type with such records appended (a later
//! record overrides a scalar field and merges into a message field, so
//! this mutates a request that would pass into one that may not). Every
//! field of every message is reachable that way, including ones a typed
//! generator would have to list by hand; a decode that fails is skipped.
//!
//! * search-svc's validation (`TryFrom` of each internal request) in
//!   process: never panics, and is deterministic;
//! * route classification (query parsing) on arbitrary text;
//! * every public gRPC request through the real gateway (including
//!   RetrieveAgentic's decomposition, Get / Delete / AddEdges /
//!   ListMemories and working memory): never INTERNAL, UNKNOWN or a
//!   breaker-opening UNAVAILABLE, and a rejection names its field;
//! * the credential parser: arbitrary and mutated bearer tokens, JWTs
//!   with arbitrary claims signed with the right key, and API keys: only
//!   OK or UNAUTHENTICATED, and never OK for a token that is expired,
//!   without a tenant, or re-signed.
//!
//! How long: `ENGRAM_FUZZ_CASES` (default 2,000, what CI runs) is the count
//! per in-process target; the gateway runs a tenth of it per RPC, the
//! credential parser half. `ENGRAM_FUZZ_SECONDS=N` makes a long run
//! instead: each target repeats such batches, each from a fresh seed (the
//! batch number), until N seconds have passed (a batch in progress
//! finishes); the gateway and credential targets start their stack once.
//! Each target prints its executions; a crash fails the test and proptest
//! saves the in-process case's seed to
//! `tests/fuzz_validation.proptest-regressions`, replayed on every run.
//!
//! The corpus: `tests/fuzz_corpus/<target>/` (`validation`, `route`,
//! `gateway`, `credentials`) holds one input per file: wire bytes named
//! `<request type or RPC>-<16 hex of their sha256>.bin`, route text as
//! `.txt`, a credential as JSON (header, value, expect_opt). Every run, CI
//! included, first replays every file through the same checks as a
//! generated input and prints how many; a file that fails fails the test
//! and is named. With `ENGRAM_FUZZ_SAVE_CORPUS=1` a run adds an input when
//! its *outcome signature* is new for its target (the request type or RPC,
//! whether it decoded, the verdict or gRPC code, and the error message
//! with quoted values and words holding digits blanked): one example per
//! distinct way the code under test answered, our stand-in for
//! coverage-guided corpus growth, capped so the repository stays small.
//! A save run also keeps every input that fails a check, so the next run
//! (and CI) replays it until it is fixed. The stack's tenant and API key
//! and a genuine (time-limited) token are stored as slots a replay fills.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use engram::stack::Stack;
use engram_proto::knowledge_foundry_service_client::KnowledgeFoundryServiceClient;
use engram_proto::memory_service_client::MemoryServiceClient;
use engram_proto::retrieval_service_client::RetrievalServiceClient;
use engram_proto::working_memory_service_client::WorkingMemoryServiceClient;
use engram_tests::{authed, stack_with_keys};
use futures::StreamExt;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseResult, TestError, TestRng, TestRunner};
use prost::Message;
use sha2::Digest;
use tonic::transport::Channel;

fn cases() -> u32 {
    std::env::var("ENGRAM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

/// When `ENGRAM_FUZZ_SECONDS` is set, the moment a target's long run
/// stops, counted from the target's start.
fn deadline_opt() -> Option<Instant> {
    let secs: u64 = std::env::var("ENGRAM_FUZZ_SECONDS").ok()?.parse().ok()?;
    Some(Instant::now() + Duration::from_secs(secs))
}

/// Whether a target runs another batch: only in a long run, before its
/// deadline. Without one a target runs a single batch, as CI always has.
fn another(deadline_opt: Option<Instant>) -> bool {
    deadline_opt.is_some_and(|d| Instant::now() < d)
}

/// A batch's generator seed: the target's fixed seed for batch 0, so the
/// default run is the one CI has always made, and a fresh one for each
/// later batch, so a long run does not repeat itself.
fn seed(base: u8, batch: u64) -> [u8; 32] {
    let mut s = [base; 32];
    if batch > 0 {
        s[..8].copy_from_slice(&batch.to_le_bytes());
    }
    s
}

/// Where proptest keeps the failing cases it replays first on every run.
/// A path, not proptest's default `SourceParallel`: that one looks for the
/// crate's lib.rs or main.rs beside `file!()`, which an integration test
/// crate has not, and then saves nothing.
const REGRESSIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fuzz_validation.proptest-regressions"
);

/// A proptest config of `n` cases whose failures are persisted to
/// [`REGRESSIONS`].
fn config(n: u32) -> Config {
    Config {
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(REGRESSIONS),
        )),
        ..Config::with_cases(n)
    }
}

/// At most this many files per target in a save run...
const MAX_FILES: usize = 60;
/// ...none over this size (a 300,000-byte text says nothing new)...
const MAX_INPUT: usize = 8 << 10;
/// ...and at most this many bytes per target, so four targets stay well
/// under a megabyte of repository.
const MAX_TARGET_BYTES: usize = 128 << 10;

/// One target's committed corpus, `tests/fuzz_corpus/<target>/`: the
/// outcome signatures its files showed on replay and, in a save run
/// (`ENGRAM_FUZZ_SAVE_CORPUS=1`), the room left under the caps.
struct Corpus {
    dir: PathBuf,
    save: bool,
    seen: BTreeSet<String>,
    files: usize,
    bytes: usize,
    saved: usize,
}

impl Corpus {
    fn new(target: &str) -> Self {
        Self {
            dir: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("fuzz_corpus")
                .join(target),
            save: std::env::var("ENGRAM_FUZZ_SAVE_CORPUS").is_ok_and(|v| v == "1"),
            seen: BTreeSet::new(),
            files: 0,
            bytes: 0,
            saved: 0,
        }
    }

    /// Every file's name and contents, sorted by name; none when the
    /// directory does not exist (a target without a corpus yet).
    fn inputs(&mut self) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            r => r.with_context(|| format!("reading {}", self.dir.display()))?,
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                let name = entry.file_name().to_string_lossy().into_owned();
                out.push((name, std::fs::read(entry.path())?));
            }
        }
        out.sort();
        self.files = out.len();
        self.bytes = out.iter().map(|(_, b)| b.len()).sum();
        Ok(out)
    }

    /// How a failure in file `name` is reported.
    fn origin(&self, name: &str) -> String {
        format!("corpus file {}", self.dir.join(name).display())
    }

    /// Records a replayed file's outcome, so a save run adds only new ones.
    fn known(&mut self, signature: String) {
        self.seen.insert(signature);
    }

    /// In a save run, writes `bytes` as `<prefix><hash>.<ext>` when its
    /// outcome `signature` is new and the caps leave room.
    fn offer(
        &mut self,
        signature: String,
        prefix: &str,
        ext: &str,
        bytes: &[u8],
    ) -> anyhow::Result<()> {
        let full = self.files >= MAX_FILES || self.bytes + bytes.len() > MAX_TARGET_BYTES;
        if !self.save || full || bytes.len() > MAX_INPUT || self.seen.contains(&signature) {
            return Ok(());
        }
        self.write(prefix, ext, bytes)?;
        self.seen.insert(signature);
        Ok(())
    }

    /// In a save run, writes an input that failed a check, whatever the
    /// caps, so every later run replays it until it is fixed.
    fn keep_failure(&mut self, prefix: &str, ext: &str, bytes: &[u8]) -> anyhow::Result<()> {
        if self.save {
            let path = self.write(prefix, ext, bytes)?;
            eprintln!("fuzz: kept the failing input as {}", path.display());
        }
        Ok(())
    }

    fn write(&mut self, prefix: &str, ext: &str, bytes: &[u8]) -> anyhow::Result<PathBuf> {
        let hash: String = sha2::Sha256::digest(bytes)[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        std::fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(format!("{prefix}{hash}.{ext}"));
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        self.files += 1;
        self.bytes += bytes.len();
        self.saved += 1;
        Ok(path)
    }

    /// The replay / save summary a target prints.
    fn report(&self, replayed: usize) -> String {
        let saved = if self.save {
            format!(
                " (saved {} new; {} files, {} bytes)",
                self.saved, self.files, self.bytes
            )
        } else {
            String::new()
        };
        format!("replayed {replayed} corpus inputs{saved}")
    }
}

/// The part of a corpus file's name before the first `-`: the request
/// type, RPC or header it belongs to.
fn prefix(name: &str) -> &str {
    name.split_once('-').map_or("", |(p, _)| p)
}

/// `message` with what differs between equal answers blanked: a quoted
/// value becomes `"…"`, a word holding a digit (a number, index, UUID or
/// id) becomes `#`; at most 160 characters.
fn normalise(message: &str) -> String {
    let mut out = String::new();
    let mut word = String::new();
    let mut quote_opt: Option<char> = None;
    for ch in message.chars() {
        if let Some(q) = quote_opt {
            if ch == q {
                quote_opt = None;
                out.push_str("…\"");
            }
            continue;
        }
        if ch.is_alphanumeric() || ch == '_' || ch == '-' {
            word.push(ch);
            continue;
        }
        // An apostrophe inside a word ("can't") does not open a quote.
        let opens = matches!(ch, '"' | '`') || (ch == '\'' && word.is_empty());
        flush_word(&mut out, &mut word);
        if opens {
            quote_opt = Some(ch);
            out.push('"');
        } else {
            out.push(ch);
        }
    }
    flush_word(&mut out, &mut word);
    out.chars().take(160).collect()
}

fn flush_word(out: &mut String, word: &mut String) {
    if word.chars().any(|c| c.is_ascii_digit()) {
        out.push('#');
    } else {
        out.push_str(word);
    }
    word.clear();
}

/// `bytes` with every occurrence of `from` replaced by `to`; only when the
/// two are the same length, so every length prefix of the wire message
/// stays right (otherwise unchanged).
fn swap(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    if from.len() != to.len() || from.is_empty() {
        return out;
    }
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            i += from.len();
        } else {
            i += 1;
        }
    }
    out
}

/// Runs `f`, turning a panic or a failed check into an error.
fn caught<T>(f: impl FnOnce() -> Result<T, TestCaseError>) -> anyhow::Result<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => bail!("{e}"),
        Err(p) => {
            let text = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            bail!("panicked: {text}")
        }
    }
}

/// What an in-process target's generated batches found.
struct Found<T> {
    executions: u64,
    batches: u64,
    /// The failure and, when proptest has it, the minimal failing input.
    failure_opt: Option<(String, Option<T>)>,
}

/// Runs `test` on `strategy` in batches of `cases()`: one batch, or, with
/// `ENGRAM_FUZZ_SECONDS`, fresh batches until the time is up. `seed_opt`
/// fixes the generator (`None`: proptest's own, new every run, as the
/// `proptest!` macro does). Stops at the first failure.
fn run_batches<S: Strategy>(
    strategy: &S,
    seed_opt: Option<u8>,
    test: impl Fn(S::Value) -> TestCaseResult,
) -> Found<S::Value> {
    let deadline = deadline_opt();
    let mut found = Found {
        executions: 0,
        batches: 0,
        failure_opt: None,
    };
    loop {
        let mut runner = match seed_opt {
            Some(base) => TestRunner::new_with_rng(
                config(cases()),
                TestRng::from_seed(RngAlgorithm::ChaCha, &seed(base, found.batches)),
            ),
            None => TestRunner::new(config(cases())),
        };
        let result = runner.run(strategy, &test);
        found.batches += 1;
        match result {
            Ok(()) => found.executions += u64::from(cases()),
            Err(TestError::Fail(why, input)) => {
                found.failure_opt = Some((why.to_string(), Some(input)))
            }
            Err(TestError::Abort(why)) => found.failure_opt = Some((why.to_string(), None)),
        }
        if found.failure_opt.is_some() || !another(deadline) {
            return found;
        }
    }
}

/// One protobuf record: field number and a value of one wire type.
#[derive(Debug, Clone)]
enum Field {
    Varint(u32, u64),
    Fixed32(u32, u32),
    Fixed64(u32, u64),
    Bytes(u32, Vec<u8>),
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn encode(fields: &[Field]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in fields {
        let (tag, wire) = match f {
            Field::Varint(t, _) => (*t, 0),
            Field::Fixed64(t, _) => (*t, 1),
            Field::Bytes(t, _) => (*t, 2),
            Field::Fixed32(t, _) => (*t, 5),
        };
        put_varint(&mut out, (u64::from(tag) << 3) | wire);
        match f {
            Field::Varint(_, v) => put_varint(&mut out, *v),
            Field::Fixed64(_, v) => out.extend_from_slice(&v.to_le_bytes()),
            Field::Fixed32(_, v) => out.extend_from_slice(&v.to_le_bytes()),
            Field::Bytes(_, b) => {
                put_varint(&mut out, b.len() as u64);
                out.extend_from_slice(b);
            }
        }
    }
    out
}

/// Text a hostile caller sends: NUL and control characters, combining
/// marks, case-folding traps, UUIDs (so id fields sometimes validate),
/// labels, and sizes past every limit.
fn text() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        3 => "[a-z \u{0}\u{1}\u{7f}\t\n\u{300}-\u{36f}\u{212a}İ?.]{0,40}".prop_map(String::into_bytes),
        2 => any::<String>().prop_map(String::into_bytes),
        2 => Just(()).prop_map(|_| uuid::Uuid::new_v4().to_string().into_bytes()),
        1 => prop_oneof![Just("semantic"), Just("low"), Just("high"), Just("hybrid"), Just("vector"),
                         Just("keyword"), Just("HS256"), Just("default"), Just("related")]
            .prop_map(|s| s.as_bytes().to_vec()),
        1 => (1usize..300_000).prop_map(|n| vec![b'x'; n]),
        1 => proptest::collection::vec(any::<u8>(), 0..64),
    ]
    .boxed()
}

/// Packed floats: an embedding of the right size now and then.
fn floats() -> BoxedStrategy<Vec<u8>> {
    let f = prop_oneof![
        4 => -1.0f32..1.0,
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => any::<f32>(),
    ];
    prop_oneof![
        proptest::collection::vec(f.clone(), 384..=384),
        proptest::collection::vec(f, 0..8),
    ]
    .prop_map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect())
    .boxed()
}

fn varint() -> BoxedStrategy<u64> {
    prop_oneof![
        4 => 0u64..64,
        2 => 0u64..100_000,
        1 => Just(u64::MAX),
        1 => Just(i64::MIN as u64),
        1 => Just(u64::from(u32::MAX)),
        1 => any::<u64>(),
    ]
    .boxed()
}

fn fixed32() -> BoxedStrategy<u32> {
    prop_oneof![
        Just(f32::NAN.to_bits()),
        Just(f32::INFINITY.to_bits()),
        Just((-1.0f32).to_bits()),
        (0.0f32..1.0).prop_map(f32::to_bits),
        any::<u32>(),
    ]
    .boxed()
}

/// A message: up to 10 records, fields 1..=32, nested messages 3 deep.
fn message() -> BoxedStrategy<Vec<Field>> {
    let leaf = prop_oneof![
        (1u32..33, varint()).prop_map(|(t, v)| Field::Varint(t, v)),
        (1u32..33, fixed32()).prop_map(|(t, v)| Field::Fixed32(t, v)),
        (1u32..33, any::<u64>()).prop_map(|(t, v)| Field::Fixed64(t, v)),
        (1u32..33, text()).prop_map(|(t, v)| Field::Bytes(t, v)),
        (1u32..33, floats()).prop_map(|(t, v)| Field::Bytes(t, v)),
    ];
    let records = proptest::collection::vec(leaf.clone(), 0..10);
    records
        .prop_recursive(3, 40, 10, move |inner| {
            proptest::collection::vec(
                prop_oneof![
                    3 => leaf.clone(),
                    2 => (1u32..33, inner).prop_map(|(t, m)| Field::Bytes(t, encode(&m))),
                ],
                0..10,
            )
        })
        .boxed()
}

/// One case: a random message, or mutations appended to a valid request.
#[derive(Debug, Clone)]
struct Case {
    random: Vec<Field>,
    mutations_opt: Option<Vec<Field>>,
}

fn case() -> BoxedStrategy<Case> {
    (
        message(),
        proptest::option::of(message().prop_map(|m| m.into_iter().take(3).collect())),
    )
        .prop_map(|(random, mutations_opt)| Case {
            random,
            mutations_opt,
        })
        .boxed()
}

impl Case {
    /// The bytes sent as a request whose valid form is `base`.
    fn bytes<M: Message>(&self, base: &M) -> Vec<u8> {
        match &self.mutations_opt {
            None => encode(&self.random),
            Some(m) => {
                let mut b = base.encode_to_vec();
                b.extend(encode(m));
                b
            }
        }
    }
}

fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Valid requests of every public RPC (for the caller's `tenant`).
mod base {
    use super::uuid;
    use engram_proto as pb;

    pub fn retrieve() -> pb::RetrieveRequest {
        pb::RetrieveRequest {
            text: "where is the red ledger kept?".into(),
            ..Default::default()
        }
    }
    pub fn memory() -> pb::Memory {
        pb::Memory {
            id: uuid(),
            content: "the red ledger is kept in the archive".into(),
            ..Default::default()
        }
    }
    pub fn upsert() -> pb::UpsertRequest {
        pb::UpsertRequest {
            memories: vec![memory()],
        }
    }
    pub fn ids() -> pb::GetRequest {
        pb::GetRequest {
            ids: vec![uuid()],
            include_embedding: false,
            omit_entities: false,
            vectors_only: false,
            ..Default::default()
        }
    }
    pub fn delete() -> pb::DeleteRequest {
        pb::DeleteRequest { ids: vec![uuid()] }
    }
    pub fn edges() -> pb::AddEdgesRequest {
        pb::AddEdgesRequest {
            edges: vec![pb::Edge {
                src_id: uuid(),
                dst_id: uuid(),
                edge_type: "related".into(),
                weight: 1.0,
            }],
        }
    }
    pub fn delete_edges() -> pb::DeleteEdgesRequest {
        pb::DeleteEdgesRequest {
            edges: vec![pb::EdgeKey {
                src_id: uuid(),
                dst_id: uuid(),
                edge_type: "contradicts".into(),
            }],
        }
    }
    pub fn review_conflict() -> pb::ReviewConflictRequest {
        pb::ReviewConflictRequest {
            new_id: uuid(),
            old_id: uuid(),
            decision: pb::ConflictDecision::Reject as i32,
        }
    }
    pub fn feedback() -> pb::FeedbackRequest {
        pb::FeedbackRequest {
            query_id: uuid(),
            items: vec![pb::FeedbackItem {
                memory_id: uuid(),
                signal: 1,
                value: true,
            }],
        }
    }
    pub fn get_memory() -> pb::GetMemoryRequest {
        pb::GetMemoryRequest {
            query: "the red ledger".into(),
            session_id: "s-1".into(),
            ..Default::default()
        }
    }
    pub fn basic(tenant: &str) -> pb::BasicRetrieveRequest {
        pb::BasicRetrieveRequest {
            kb_id: uuid(),
            query: "the red ledger".into(),
            tenant_id: tenant.into(),
            ..Default::default()
        }
    }
    pub fn agentic(tenant: &str) -> pb::AgenticRetrieveRequest {
        pb::AgenticRetrieveRequest {
            query: "compare the red ledger and the blue router, then the badge".into(),
            tenant_id: tenant.into(),
            ..Default::default()
        }
    }
    pub fn vector() -> pb::VectorSearchRequest {
        pb::VectorSearchRequest {
            embedding: vec![0.05; 384],
            k: 10,
            ..Default::default()
        }
    }
    pub fn keyword() -> pb::KeywordSearchRequest {
        pb::KeywordSearchRequest {
            text: "red ledger".into(),
            k: 10,
            ..Default::default()
        }
    }
    pub fn embed() -> pb::EmbedRequest {
        pb::EmbedRequest {
            texts: vec!["red ledger".into()],
        }
    }
    pub fn store_feedback() -> pb::StoreFeedbackRequest {
        pb::StoreFeedbackRequest {
            items: vec![pb::StoredFeedback {
                query_id: uuid(),
                memory_id: uuid(),
                signal: "used".into(),
                value: true,
            }],
            examples: Vec::new(),
        }
    }
}

/// What a validator said: `None` when the bytes do not decode, else
/// accepted, or rejected with its message.
type Verdict = Option<Result<(), String>>;

/// Decodes `bytes` as `M`, validates it twice: never a panic, the same verdict.
fn validates<M, V>(bytes: &[u8]) -> Result<Verdict, TestCaseError>
where
    M: Message + Default + Clone,
    V: TryFrom<M>,
    V::Error: std::fmt::Display,
{
    let Ok(msg) = M::decode(bytes) else {
        return Ok(None);
    };
    let verdict = |m: M| V::try_from(m).map(drop).map_err(|e| e.to_string());
    let first = verdict(msg.clone());
    let again = verdict(msg);
    prop_assert_eq!(&first, &again, "validation is not deterministic");
    Ok(Some(first))
}

/// A validation outcome signature: request type, decoded, the verdict.
fn verdict_signature(name: &str, v: &Verdict) -> String {
    match v {
        None => format!("{name} undecoded"),
        Some(Ok(())) => format!("{name} accepted"),
        Some(Err(m)) => format!("{name} rejected {}", normalise(m)),
    }
}

/// (decoded, accepted) per request type, printed at the end.
type Tally = BTreeMap<&'static str, (u64, u64)>;

fn note(t: &mut Tally, name: &'static str, v: &Verdict) {
    let e = t.entry(name).or_default();
    if let Some(r) = v {
        e.0 += 1;
        e.1 += u64::from(r.is_ok());
    }
}

/// One internal request type: how a case becomes its wire bytes (against
/// its valid base message), and the check of those bytes.
struct Target {
    name: &'static str,
    wire: fn(&Case) -> Vec<u8>,
    check: fn(&[u8]) -> Result<Verdict, TestCaseError>,
}

/// A `Target` named `$name`: `$pb` bytes mutated from `$base`, validated
/// into `$v`.
macro_rules! target {
    ($name:literal, $pb:ty, $v:ty, $base:expr) => {
        Target {
            name: $name,
            wire: |c| c.bytes(&$base),
            check: validates::<$pb, $v>,
        }
    };
}

/// Every request search-svc validates, by name.
fn search_svc_targets() -> [Target; 12] {
    use engram_proto as pb;
    use search_svc::conflicts::{ConflictQuery, Review};
    use search_svc::list::ListQuery;
    use search_svc::validate as v;
    [
        target!("Upsert", pb::UpsertRequest, v::UpsertBatch, base::upsert()),
        target!("Delete", pb::DeleteRequest, v::DeleteIds, base::delete()),
        target!("Get", pb::GetRequest, v::GetQuery, base::ids()),
        target!("AddEdges", pb::AddEdgesRequest, v::EdgeBatch, base::edges()),
        target!(
            "DeleteEdges",
            pb::DeleteEdgesRequest,
            v::EdgeKeys,
            base::delete_edges()
        ),
        target!(
            "VectorSearch",
            pb::VectorSearchRequest,
            v::VectorQuery,
            base::vector()
        ),
        target!(
            "KeywordSearch",
            pb::KeywordSearchRequest,
            v::KeywordQuery,
            base::keyword()
        ),
        target!("Embed", pb::EmbedRequest, v::EmbedTexts, base::embed()),
        target!(
            "StoreFeedback",
            pb::StoreFeedbackRequest,
            v::FeedbackBatch,
            base::store_feedback()
        ),
        target!(
            "ListMemories",
            pb::ListMemoriesRequest,
            ListQuery,
            pb::ListMemoriesRequest::default()
        ),
        target!(
            "ListConflicts",
            pb::ListConflictsRequest,
            ConflictQuery,
            pb::ListConflictsRequest::default()
        ),
        target!(
            "ReviewConflict",
            pb::ReviewConflictRequest,
            Review,
            base::review_conflict()
        ),
    ]
}

/// Replays every validation corpus file through the check of the request
/// type its name starts with; returns how many, failures by file name.
fn replay_validation(
    targets: &[Target],
    corpus: &mut Corpus,
) -> anyhow::Result<(usize, Vec<String>)> {
    let inputs = corpus.inputs()?;
    let mut bad = Vec::new();
    for (name, bytes) in &inputs {
        let Some(t) = targets.iter().find(|t| t.name == prefix(name)) else {
            bad.push(format!(
                "{}: no request type by that name",
                corpus.origin(name)
            ));
            continue;
        };
        match caught(|| (t.check)(bytes)) {
            Ok(v) => corpus.known(verdict_signature(t.name, &v)),
            Err(e) => bad.push(format!("{}: {e}", corpus.origin(name))),
        }
    }
    Ok((inputs.len(), bad))
}

/// Checks one generated case against every request type: tallies it and,
/// in a save run, keeps the inputs whose outcome is new.
fn check_case(targets: &[Target], c: &Case, state: &Mutex<(Tally, Corpus)>) -> TestCaseResult {
    // A panic while held poisons the lock; the next case still counts.
    let mut guard = state.lock().unwrap_or_else(PoisonError::into_inner);
    let (tally, corpus) = &mut *guard;
    for t in targets {
        let bytes = (t.wire)(c);
        let v = (t.check)(&bytes)?;
        note(tally, t.name, &v);
        corpus
            .offer(
                verdict_signature(t.name, &v),
                &format!("{}-", t.name),
                "bin",
                &bytes,
            )
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    Ok(())
}

/// In a save run, keeps the wire bytes of every request type the failing
/// case `c` breaks.
fn keep_failing_case(targets: &[Target], c: &Case, corpus: &mut Corpus) -> anyhow::Result<()> {
    for t in targets {
        let bytes = (t.wire)(c);
        if caught(|| (t.check)(&bytes)).is_err() {
            corpus.keep_failure(&format!("{}-", t.name), "bin", &bytes)?;
        }
    }
    Ok(())
}

#[test]
fn search_svc_validation_of_every_internal_request_never_panics() -> anyhow::Result<()> {
    let targets = search_svc_targets();
    let mut corpus = Corpus::new("validation");
    let (replayed, bad) = replay_validation(&targets, &mut corpus)?;
    let state = Mutex::new((Tally::new(), corpus));
    let found = run_batches(&case(), Some(23), |c| check_case(&targets, &c, &state));
    let (tally, mut corpus) = state.into_inner().unwrap_or_else(PoisonError::into_inner);
    eprintln!(
        "fuzz search-svc validation: {}; {} executions x {} request types in {} batches; (decoded, accepted) {tally:?}",
        corpus.report(replayed),
        found.executions,
        targets.len(),
        found.batches
    );
    if !bad.is_empty() {
        bail!("{} corpus inputs fail: {bad:#?}", bad.len());
    }
    if let Some((why, input_opt)) = found.failure_opt {
        if let Some(c) = &input_opt {
            keep_failing_case(&targets, c, &mut corpus)?;
        }
        bail!("crash: {why}; minimal input {input_opt:?}");
    }
    Ok(())
}

/// A route outcome signature: the route, and the shape of the text
/// (valid UTF-8, size to a power of two), so the corpus keeps a spread.
fn route_signature(t: &[u8], route: retrieval_svc::lab::Route) -> String {
    let utf8 = std::str::from_utf8(t).is_ok();
    let size = usize::BITS - t.len().leading_zeros();
    format!("{route:?} utf8={utf8} size<2^{size}")
}

/// Classifies `t`; in a save run, keeps it when its outcome is new.
fn classify_text(t: &[u8], corpus: &Mutex<Corpus>) -> TestCaseResult {
    let route = retrieval_svc::lab::classify(&String::from_utf8_lossy(t));
    corpus
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .offer(route_signature(t, route), "", "txt", t)
        .map_err(|e| TestCaseError::fail(e.to_string()))
}

/// Replays every route corpus file; returns how many, failures by name.
fn replay_route(corpus: &mut Corpus) -> anyhow::Result<(usize, Vec<String>)> {
    let inputs = corpus.inputs()?;
    let mut bad = Vec::new();
    for (name, t) in &inputs {
        match caught(|| Ok(retrieval_svc::lab::classify(&String::from_utf8_lossy(t)))) {
            Ok(route) => corpus.known(route_signature(t, route)),
            Err(e) => bad.push(format!("{}: {e}", corpus.origin(name))),
        }
    }
    Ok((inputs.len(), bad))
}

/// Route classification reads every query; any text must classify.
#[test]
fn route_classification_takes_any_text() -> anyhow::Result<()> {
    let mut corpus = Corpus::new("route");
    let (replayed, bad) = replay_route(&mut corpus)?;
    let corpus = Mutex::new(corpus);
    let found = run_batches(&text(), None, |t| classify_text(&t, &corpus));
    let mut corpus = corpus.into_inner().unwrap_or_else(PoisonError::into_inner);
    eprintln!(
        "fuzz route classification: {}; {} executions in {} batches",
        corpus.report(replayed),
        found.executions,
        found.batches
    );
    if !bad.is_empty() {
        bail!("{} corpus inputs fail: {bad:#?}", bad.len());
    }
    if let Some((why, input_opt)) = found.failure_opt {
        if let Some(t) = &input_opt {
            corpus.keep_failure("", "txt", t)?;
        }
        bail!("crash: {why}; minimal input {input_opt:?}");
    }
    Ok(())
}

/// The public requests, as wire messages sent to the real gateway.
#[derive(Debug, Clone, Copy)]
enum Rpc {
    Retrieve,
    Feedback,
    Upsert,
    Delete,
    Get,
    AddEdges,
    DeleteEdges,
    ListMemories,
    ListConflicts,
    ReviewConflict,
    GetMemory,
    GetDemand,
    Basic,
    Agentic,
}

const RPCS: [Rpc; 14] = [
    Rpc::Retrieve,
    Rpc::Feedback,
    Rpc::Upsert,
    Rpc::Delete,
    Rpc::Get,
    Rpc::AddEdges,
    Rpc::DeleteEdges,
    Rpc::ListMemories,
    Rpc::ListConflicts,
    Rpc::ReviewConflict,
    Rpc::GetMemory,
    Rpc::GetDemand,
    Rpc::Basic,
    Rpc::Agentic,
];

#[derive(Clone)]
struct Clients {
    key: String,
    retrieval: RetrievalServiceClient<Channel>,
    memory: MemoryServiceClient<Channel>,
    working: WorkingMemoryServiceClient<Channel>,
    foundry: KnowledgeFoundryServiceClient<Channel>,
}

/// What one wire request got: its decoded form (for the report) and answer.
type Sent = (String, Result<(), tonic::Status>);

/// Decodes `$bytes` as `$ty` (or returns `None`) and calls `$client.$method`.
macro_rules! call {
    ($client:expr, $method:ident, $ty:ty, $bytes:expr, $key:expr) => {{
        let msg = <$ty>::decode($bytes).ok()?;
        let shown: String = format!("{msg:?}").chars().take(600).collect();
        (shown, $client.$method(authed($key, msg)).await.map(drop))
    }};
}

/// Sends `bytes` as `rpc`'s request; `None` when they do not decode.
async fn send(mut c: Clients, rpc: Rpc, bytes: &[u8]) -> Option<Sent> {
    use engram_proto as pb;
    let k = c.key.clone();
    let sent = match rpc {
        Rpc::Retrieve => call!(c.retrieval, retrieve, pb::RetrieveRequest, bytes, &k),
        Rpc::Feedback => call!(c.retrieval, feedback, pb::FeedbackRequest, bytes, &k),
        Rpc::Upsert => call!(c.memory, upsert, pb::UpsertRequest, bytes, &k),
        Rpc::Delete => call!(c.memory, delete, pb::DeleteRequest, bytes, &k),
        Rpc::Get => call!(c.memory, get, pb::GetRequest, bytes, &k),
        Rpc::AddEdges => call!(c.memory, add_edges, pb::AddEdgesRequest, bytes, &k),
        Rpc::DeleteEdges => call!(c.memory, delete_edges, pb::DeleteEdgesRequest, bytes, &k),
        Rpc::ListMemories => call!(c.memory, list_memories, pb::ListMemoriesRequest, bytes, &k),
        Rpc::ListConflicts => call!(
            c.memory,
            list_conflicts,
            pb::ListConflictsRequest,
            bytes,
            &k
        ),
        Rpc::ReviewConflict => call!(
            c.memory,
            review_conflict,
            pb::ReviewConflictRequest,
            bytes,
            &k
        ),
        Rpc::GetMemory => call!(c.working, get_memory, pb::GetMemoryRequest, bytes, &k),
        Rpc::GetDemand => call!(c.working, get_demand, pb::GetDemandRequest, bytes, &k),
        Rpc::Basic => call!(
            c.foundry,
            retrieve_basic,
            pb::BasicRetrieveRequest,
            bytes,
            &k
        ),
        Rpc::Agentic => call!(
            c.foundry,
            retrieve_agentic,
            pb::AgenticRetrieveRequest,
            bytes,
            &k
        ),
    };
    Some(sent)
}

/// What a hostile request may get back: served, or refused with a code
/// that blames the request (a rejection naming its field).
fn acceptable(s: &tonic::Status) -> bool {
    use tonic::Code;
    match s.code() {
        Code::InvalidArgument => s
            .message()
            .split_once(": ")
            .is_some_and(|(f, _)| !f.is_empty()),
        Code::NotFound
        | Code::PermissionDenied
        | Code::ResourceExhausted
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::AlreadyExists => true,
        _ => false,
    }
}

/// The bytes of `c` as `rpc`'s request.
fn wire(c: &Case, rpc: Rpc, tenant: &str) -> Vec<u8> {
    match rpc {
        Rpc::Retrieve => c.bytes(&base::retrieve()),
        Rpc::Feedback => c.bytes(&base::feedback()),
        Rpc::Upsert => c.bytes(&base::upsert()),
        Rpc::Delete => c.bytes(&base::delete()),
        Rpc::Get => c.bytes(&base::ids()),
        Rpc::AddEdges => c.bytes(&base::edges()),
        Rpc::DeleteEdges => c.bytes(&base::delete_edges()),
        Rpc::ListMemories => c.bytes(&engram_proto::ListMemoriesRequest::default()),
        Rpc::ListConflicts => c.bytes(&engram_proto::ListConflictsRequest::default()),
        Rpc::ReviewConflict => c.bytes(&base::review_conflict()),
        Rpc::GetMemory => c.bytes(&base::get_memory()),
        Rpc::GetDemand => c.bytes(&engram_proto::GetDemandRequest::default()),
        Rpc::Basic => c.bytes(&base::basic(tenant)),
        Rpc::Agentic => c.bytes(&base::agentic(tenant)),
    }
}

/// `n` values of `strategy` from a generator seeded with `seed`.
fn sample<S: Strategy>(strategy: &S, n: usize, seed: [u8; 32]) -> anyhow::Result<Vec<S::Value>> {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed),
    );
    (0..n)
        .map(|_| {
            strategy
                .new_tree(&mut runner)
                .map(|t| t.current())
                .map_err(|e| anyhow!("generating an input: {e}"))
        })
        .collect()
}

/// Wire messages for every (rpc, case), generated up front.
fn generate(n: usize, seed: [u8; 32], tenant: &str) -> anyhow::Result<Vec<(Rpc, Vec<u8>)>> {
    let cases = sample(&case(), n * RPCS.len(), seed)?;
    Ok(cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let rpc = RPCS[i % RPCS.len()];
            (rpc, wire(c, rpc, tenant))
        })
        .collect())
}

/// Sends every (rpc, bytes), eight at a time; the answers in order.
async fn send_all(
    clients: &Clients,
    calls: Vec<(Rpc, Vec<u8>)>,
) -> Vec<(Rpc, Vec<u8>, Option<Sent>)> {
    futures::stream::iter(calls)
        .map(|(rpc, b)| {
            let c = clients.clone();
            async move {
                let r = send(c, rpc, &b).await;
                (rpc, b, r)
            }
        })
        .buffered(8)
        .collect()
        .await
}

/// What one answer means: its tally label, its outcome signature (none
/// when nothing was checked), and the failure it shows, if any.
struct Judgement {
    label: String,
    signature_opt: Option<String>,
    failure_opt: Option<String>,
}

/// A gateway or credential run's outcomes, failures and executions.
#[derive(Default)]
struct Judged {
    tally: BTreeMap<String, usize>,
    bad: Vec<String>,
    executions: usize,
}

impl Judged {
    /// Tallies `j`; its failure is reported as one of `origin`.
    fn add(&mut self, j: &Judgement, origin: &str) {
        *self.tally.entry(j.label.clone()).or_default() += 1;
        if let Some(f) = &j.failure_opt {
            self.bad.push(format!("{origin}: {f}"));
        }
    }

    /// Fails the test on any failure, showing the first five.
    fn verdict(&self) -> anyhow::Result<()> {
        if !self.bad.is_empty() {
            bail!(
                "{} unacceptable answers; first: {:#?}",
                self.bad.len(),
                &self.bad[..self.bad.len().min(5)]
            );
        }
        Ok(())
    }
}

/// The gateway's answer to one wire request. Bytes that do not decode
/// never reach it: nothing is checked, no signature.
fn judge_wire(rpc: Rpc, r: &Option<Sent>) -> Judgement {
    let (label, signature_opt, failure_opt) = match r {
        None => ("undecodable".to_string(), None, None),
        Some((_, Ok(()))) => ("Ok".to_string(), Some(format!("{rpc:?} Ok")), None),
        Some((shown, Err(s))) => (
            format!("{:?}", s.code()),
            Some(format!("{rpc:?} {:?} {}", s.code(), normalise(s.message()))),
            (!acceptable(s))
                .then(|| format!("{rpc:?}: {:?} {} for {shown}", s.code(), s.message())),
        ),
    };
    Judgement {
        label: format!("{rpc:?} {label}"),
        signature_opt,
        failure_opt,
    }
}

/// Basic and Agentic requests carry the caller's tenant, new for every
/// stack (`t-fuzz-` and 32 hex digits): the corpus stores this stand-in of
/// the same length instead, and a replay swaps the live tenant back in.
const TENANT_SLOT: &str = "t-fuzz-00000000000000000000000000000000";

/// Replays every gateway corpus file (its RPC is the name's prefix) with
/// the live tenant in; returns how many.
async fn replay_gateway(
    clients: &Clients,
    tenant: &str,
    corpus: &mut Corpus,
    judged: &mut Judged,
) -> anyhow::Result<usize> {
    let mut calls = Vec::new();
    let mut names = Vec::new();
    let inputs = corpus.inputs()?;
    for (name, bytes) in &inputs {
        match RPCS.into_iter().find(|r| format!("{r:?}") == prefix(name)) {
            Some(rpc) => {
                calls.push((rpc, swap(bytes, TENANT_SLOT.as_bytes(), tenant.as_bytes())));
                names.push(name);
            }
            None => judged
                .bad
                .push(format!("{}: no RPC by that name", corpus.origin(name))),
        }
    }
    for (name, (rpc, _, r)) in names.into_iter().zip(send_all(clients, calls).await) {
        let j = judge_wire(rpc, &r);
        judged.add(&j, &corpus.origin(name));
        if let Some(s) = j.signature_opt {
            corpus.known(s);
        }
    }
    Ok(inputs.len())
}

/// Sends one generated batch and judges it; in a save run keeps inputs
/// with a new outcome (tenant as its stand-in) and every failing one.
async fn gateway_batch(
    clients: &Clients,
    calls: Vec<(Rpc, Vec<u8>)>,
    tenant: &str,
    corpus: &mut Corpus,
    judged: &mut Judged,
) -> anyhow::Result<()> {
    for (rpc, bytes, r) in send_all(clients, calls).await {
        judged.executions += 1;
        let j = judge_wire(rpc, &r);
        judged.add(&j, "generated");
        let stored = swap(&bytes, tenant.as_bytes(), TENANT_SLOT.as_bytes());
        let name = format!("{rpc:?}-");
        if j.failure_opt.is_some() {
            corpus.keep_failure(&name, "bin", &stored)?;
        } else if let Some(s) = j.signature_opt {
            corpus.offer(s, &name, "bin", &stored)?;
        }
    }
    Ok(())
}

/// The whole stack with one sensitive key, generous limits, and clients
/// of every public service; returns them and the key's tenant.
async fn gateway_stack() -> anyhow::Result<(Stack, Clients, String)> {
    let mut settings = engram_tests::settings().await?;
    settings.tenant.requests_per_second = 1_000_000;
    settings.tenant.burst = 1_000_000;
    settings.tenant.max_concurrent = 64;
    // Validation is the subject, not load: on a busy machine a 300 ms
    // stage timeout can fail a one-strategy request (a Basic search is
    // dense only) with UNAVAILABLE, which is not what this test looks for.
    settings.pipeline.vector_timeout_ms = 2_000;
    settings.pipeline.keyword_timeout_ms = 2_000;
    settings.pipeline.graph_timeout_ms = 2_000;
    let (stack, uri, keys) = stack_with_keys(settings, &[("fuzz", "sensitive")]).await?;
    let channel = tonic::transport::Endpoint::from_shared(uri)?
        .connect()
        .await?;
    let clients = Clients {
        key: keys[0].clone(),
        retrieval: RetrievalServiceClient::new(channel.clone()).max_encoding_message_size(64 << 20),
        memory: MemoryServiceClient::new(channel.clone()).max_encoding_message_size(64 << 20),
        working: WorkingMemoryServiceClient::new(channel.clone())
            .max_encoding_message_size(64 << 20),
        foundry: KnowledgeFoundryServiceClient::new(channel).max_encoding_message_size(64 << 20),
    };
    let tenant = stack
        .settings
        .auth
        .api_keys
        .iter()
        .find(|k| k.sha256 == engram::stack::sha256_hex(&keys[0]))
        .map(|k| k.tenant.clone())
        .unwrap_or_default();
    Ok((stack, clients, tenant))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_public_request_on_the_wire_is_served_or_refused_by_field() -> anyhow::Result<()> {
    let n = (cases() / 10).max(20) as usize;
    let (stack, clients, tenant) = gateway_stack().await?;
    let mut corpus = Corpus::new("gateway");
    let mut judged = Judged::default();
    let replayed = replay_gateway(&clients, &tenant, &mut corpus, &mut judged).await?;
    let deadline = deadline_opt();
    let mut batches = 0;
    loop {
        let calls = generate(n, seed(29, batches), &tenant)?;
        gateway_batch(&clients, calls, &tenant, &mut corpus, &mut judged).await?;
        batches += 1;
        if !judged.bad.is_empty() || !another(deadline) {
            break;
        }
    }
    stack.shutdown().await;
    eprintln!(
        "fuzz gateway wire requests: {}; {} executions in {batches} batches; outcomes {:?}",
        corpus.report(replayed),
        judged.executions,
        judged.tally
    );
    judged.verdict()
}

const SECRET: &[u8] = b"fuzz-secret-of-at-least-thirty-two-bytes!";

fn b64(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

fn sign(head: &str, body: &str) -> String {
    use hmac::Mac;
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET) else {
        return String::new();
    };
    mac.update(format!("{head}.{body}").as_bytes());
    b64(&mac.finalize().into_bytes())
}

/// A credential and what the gateway must say to it: `Some(true)` = OK,
/// `Some(false)` = UNAUTHENTICATED, `None` = either.
#[derive(Debug, Clone)]
struct Credential {
    header: &'static str,
    value: String,
    expect_opt: Option<bool>,
}

fn claim_value() -> BoxedStrategy<serde_json::Value> {
    use serde_json::json;
    prop_oneof![
        Just(json!(null)),
        Just(json!("")),
        Just(json!("public")),
        Just(json!("sensitive")),
        Just(json!("t-fuzz")),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        Just(json!(["engram", 1])),
        Just(json!({"tenant": "x"})),
        "[a-z\u{0}]{0,8}".prop_map(|s| json!(s)),
    ]
    .boxed()
}

/// Claims with arbitrary values under the names the parser reads.
fn claims() -> BoxedStrategy<serde_json::Map<String, serde_json::Value>> {
    let names = prop_oneof![
        Just("exp"),
        Just("nbf"),
        Just("tenant"),
        Just("sub"),
        Just("trust"),
        Just("aud"),
        Just("iss"),
        Just("x"),
    ];
    proptest::collection::vec((names, claim_value()), 0..8)
        .prop_map(|kv| kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
        .boxed()
}

/// The claims of a genuine token, valid for an hour from `now`.
fn valid_claims(now: i64) -> serde_json::Value {
    serde_json::json!({"exp": now + 3600, "tenant": "t-fuzz", "sub": "a", "trust": "public",
                       "aud": "engram", "iss": "https://idp.example"})
}

fn jwt_head() -> String {
    b64(br#"{"alg":"HS256","typ":"JWT"}"#)
}

/// A genuine bearer token, valid for the next hour.
fn valid_jwt() -> String {
    let (head, body) = (
        jwt_head(),
        b64(valid_claims(chrono::Utc::now().timestamp())
            .to_string()
            .as_bytes()),
    );
    format!("{head}.{body}.{}", sign(&head, &body))
}

fn credential(key: String) -> BoxedStrategy<Credential> {
    let now = chrono::Utc::now().timestamp();
    let head = jwt_head();
    let (h1, h2) = (head.clone(), head);
    prop_oneof![
        // Arbitrary header values.
        2 => "[ -~]{0,80}".prop_map(|v| Credential { header: "authorization", value: v, expect_opt: None }),
        1 => "[ -~]{0,80}".prop_map(|v| Credential { header: "x-api-key", value: v, expect_opt: Some(false) }),
        // Three base64url parts of random bytes.
        2 => proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 3..=3)
            .prop_map(|p| Credential {
                header: "authorization",
                value: format!("Bearer {}", p.iter().map(|x| b64(x)).collect::<Vec<_>>().join(".")),
                expect_opt: Some(false),
            }),
        // Arbitrary claims, correctly signed: OK or not, never anything else;
        // never OK without a tenant string or with exp in the past.
        4 => claims().prop_map(move |c| {
            let body = b64(serde_json::Value::Object(c.clone()).to_string().as_bytes());
            let no_tenant = c.get("tenant").and_then(|t| t.as_str()).is_none_or(str::is_empty);
            let expired = c.get("exp").and_then(|e| e.as_i64()).is_some_and(|e| e <= now);
            Credential {
                header: "authorization",
                value: format!("Bearer {h1}.{body}.{}", sign(&h1, &body)),
                expect_opt: (no_tenant || expired).then_some(false),
            }
        }),
        // A valid token with one byte of its signature or body changed.
        2 => (any::<usize>(), any::<u8>(), any::<bool>()).prop_map(move |(at, byte, in_sig)| {
            let body = b64(valid_claims(now).to_string().as_bytes());
            let mut sig = sign(&h2, &body).into_bytes();
            let mut bod = body.clone().into_bytes();
            let target = if in_sig { &mut sig } else { &mut bod };
            let i = at % target.len().max(1);
            let old = target[i];
            target[i] = if byte == old || !byte.is_ascii_graphic() { if old == b'A' { b'B' } else { b'A' } } else { byte };
            Credential {
                header: "authorization",
                value: format!("Bearer {h2}.{}.{}", String::from_utf8_lossy(&bod), String::from_utf8_lossy(&sig)),
                expect_opt: Some(false),
            }
        }),
        // The genuine articles.
        1 => Just(()).prop_map(|_| Credential {
            header: "authorization",
            value: format!("Bearer {}", valid_jwt()),
            expect_opt: Some(true),
        }),
        1 => Just(()).prop_map(move |_| Credential { header: "x-api-key", value: key.clone(), expect_opt: Some(true) }),
    ]
    .boxed()
}

/// Stand-ins a credential corpus file holds for what a replay must make
/// afresh: the stack's API key (new for every stack) and a genuine token
/// (valid for an hour only).
const API_KEY_SLOT: &str = "$API_KEY";
const VALID_JWT_SLOT: &str = "$VALID_JWT";

/// A credential as a corpus file: its fields as JSON, with the stand-ins.
fn credential_json(c: &Credential, key: &str) -> anyhow::Result<Vec<u8>> {
    let value = if c.header == "authorization" && c.expect_opt == Some(true) {
        format!("Bearer {VALID_JWT_SLOT}")
    } else {
        c.value.replace(key, API_KEY_SLOT)
    };
    let json = serde_json::json!({"header": c.header, "value": value, "expect_opt": c.expect_opt});
    Ok(serde_json::to_vec_pretty(&json)?)
}

/// A credential corpus file read back, its stand-ins filled in.
fn credential_from_json(bytes: &[u8], key: &str) -> anyhow::Result<Credential> {
    let json: serde_json::Value = serde_json::from_slice(bytes)?;
    let header = match json["header"].as_str() {
        Some("authorization") => "authorization",
        Some("x-api-key") => "x-api-key",
        other => bail!("unknown header {other:?}"),
    };
    let value = json["value"]
        .as_str()
        .ok_or_else(|| anyhow!("no value"))?
        .replace(API_KEY_SLOT, key)
        .replace(VALID_JWT_SLOT, &valid_jwt());
    let expect_opt = match &json["expect_opt"] {
        serde_json::Value::Null => None,
        serde_json::Value::Bool(b) => Some(*b),
        other => bail!("expect_opt is {other}, not null or a boolean"),
    };
    Ok(Credential {
        header,
        value,
        expect_opt,
    })
}

/// Presents every credential on a Get, eight at a time; answers in order.
async fn present_all(
    memory: &MemoryServiceClient<Channel>,
    creds: Vec<Credential>,
) -> Vec<(Credential, Result<(), tonic::Status>)> {
    futures::stream::iter(creds)
        .map(|cred| {
            let mut m = memory.clone();
            async move {
                let mut req = tonic::Request::new(engram_proto::GetRequest {
                    ids: vec![uuid::Uuid::new_v4().to_string()],
                    include_embedding: false,
                    omit_entities: false,
                    vectors_only: false,
                    ..Default::default()
                });
                match cred.value.parse() {
                    Ok(v) => {
                        req.metadata_mut().insert(cred.header, v);
                    }
                    // Not a legal header value: the client cannot send it.
                    Err(_) => return (cred, Err(tonic::Status::unauthenticated("unsendable"))),
                }
                let r = m.get(req).await.map(drop);
                (cred, r)
            }
        })
        .buffered(8)
        .collect()
        .await
}

/// The gateway's answer to one credential: only OK or UNAUTHENTICATED,
/// and the one expected when there is an expectation. UNAVAILABLE and
/// DEADLINE_EXCEEDED come from past authentication (the Get's call to
/// search-svc timed out on a loaded machine: one in 87,000 during a
/// 10-minute run beside another), so they count as accepted: the
/// credential got in, which is what this target judges.
fn judge_credential(cred: &Credential, r: &Result<(), tonic::Status>) -> Judgement {
    use tonic::Code;
    let ok = match r {
        Ok(()) => true,
        Err(s) if s.code() == Code::Unauthenticated => false,
        Err(s) if matches!(s.code(), Code::Unavailable | Code::DeadlineExceeded) => true,
        Err(s) => {
            return Judgement {
                label: format!("{} {:?}", cred.header, s.code()),
                signature_opt: None,
                failure_opt: Some(format!("{:?} {} for {cred:?}", s.code(), s.message())),
            };
        }
    };
    let message = r
        .as_ref()
        .err()
        .map(|s| normalise(s.message()))
        .unwrap_or_default();
    Judgement {
        label: format!("{} ok={ok}", cred.header),
        signature_opt: Some(format!(
            "{} expect={:?} ok={ok} {message}",
            cred.header, cred.expect_opt
        )),
        failure_opt: cred
            .expect_opt
            .is_some_and(|want| want != ok)
            .then(|| format!("ok={ok} for {cred:?}")),
    }
}

/// Replays every credential corpus file; returns how many.
async fn replay_credentials(
    memory: &MemoryServiceClient<Channel>,
    key: &str,
    corpus: &mut Corpus,
    judged: &mut Judged,
) -> anyhow::Result<usize> {
    let mut creds = Vec::new();
    let mut names = Vec::new();
    let inputs = corpus.inputs()?;
    for (name, bytes) in &inputs {
        match credential_from_json(bytes, key) {
            Ok(c) => {
                creds.push(c);
                names.push(name);
            }
            Err(e) => judged.bad.push(format!("{}: {e}", corpus.origin(name))),
        }
    }
    for (name, (cred, r)) in names.into_iter().zip(present_all(memory, creds).await) {
        let j = judge_credential(&cred, &r);
        judged.add(&j, &corpus.origin(name));
        if let Some(s) = j.signature_opt {
            corpus.known(s);
        }
    }
    Ok(inputs.len())
}

/// Presents one generated batch and judges it; in a save run keeps
/// credentials with a new outcome and every failing one.
async fn credential_batch(
    memory: &MemoryServiceClient<Channel>,
    creds: Vec<Credential>,
    key: &str,
    corpus: &mut Corpus,
    judged: &mut Judged,
) -> anyhow::Result<()> {
    for (cred, r) in present_all(memory, creds).await {
        judged.executions += 1;
        let j = judge_credential(&cred, &r);
        judged.add(&j, "generated");
        let stored = credential_json(&cred, key)?;
        let name = format!("{}-", cred.header);
        if j.failure_opt.is_some() {
            corpus.keep_failure(&name, "json", &stored)?;
        } else if let Some(s) = j.signature_opt {
            corpus.offer(s, &name, "json", &stored)?;
        }
    }
    Ok(())
}

/// The whole stack taking HS256 tokens signed with `SECRET` and one API
/// key; returns it, a Memory client and the key.
async fn credential_stack() -> anyhow::Result<(Stack, MemoryServiceClient<Channel>, String)> {
    let mut settings = engram_tests::settings().await?;
    settings.auth.jwt_hs256_secret_opt = Some(String::from_utf8(SECRET.to_vec())?);
    settings.auth.jwt_audience_opt = Some("engram".into());
    settings.auth.jwt_issuer_opt = Some("https://idp.example".into());
    settings.tenant.requests_per_second = 1_000_000;
    settings.tenant.burst = 1_000_000;
    let (stack, uri, keys) = stack_with_keys(settings, &[("fuzz", "public")]).await?;
    let channel = tonic::transport::Endpoint::from_shared(uri)?
        .connect()
        .await?;
    Ok((stack, MemoryServiceClient::new(channel), keys[0].clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn credentials_are_accepted_only_when_valid() -> anyhow::Result<()> {
    let n = (cases() / 2).max(50) as usize;
    let (stack, memory, key) = credential_stack().await?;
    let mut corpus = Corpus::new("credentials");
    let mut judged = Judged::default();
    let replayed = replay_credentials(&memory, &key, &mut corpus, &mut judged).await?;
    let deadline = deadline_opt();
    let mut batches = 0;
    loop {
        let creds = sample(&credential(key.clone()), n, seed(31, batches))?;
        credential_batch(&memory, creds, &key, &mut corpus, &mut judged).await?;
        batches += 1;
        if !judged.bad.is_empty() || !another(deadline) {
            break;
        }
    }
    stack.shutdown().await;
    eprintln!(
        "fuzz credentials: {}; {} executions in {batches} batches; outcomes {:?}",
        corpus.report(replayed),
        judged.executions,
        judged.tally
    );
    judged.verdict()
}
