//! All configuration in one place: built-in defaults, then an optional TOML
//! file, then `ENGRAM__SECTION__KEY=value` environment overrides. Unknown keys
//! are an error (a typo must not silently fall back to a default).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid configuration: {0} (see README \"Configuration\" for the keys)")]
    Invalid(String),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Project-local folder for installs (Python wheels, models), the embedded
    /// Postgres data dir and the dev API key.
    pub home: PathBuf,
    pub database: DatabaseSettings,
    pub listen: ListenSettings,
    pub downstream: DownstreamSettings,
    pub auth: AuthSettings,
    pub models: ModelSettings,
    pub search: SearchSettings,
    pub graph: GraphSettings,
    pub rerank: RerankSettings,
    pub pipeline: PipelineSettings,
    pub log: LogSettings,
    pub llm: LlmSettings,
    pub working: WorkingMemorySettings,
    pub tenant: TenantLimitSettings,
    pub tls: TlsSettings,
}

/// TLS between the services (common/src/tls.rs): search-svc, graph-svc and
/// rerank-svc serve TLS with `cert_path_opt` + `key_path_opt`; internal
/// clients verify them against `ca_path_opt` and `server_name`. Unset (the
/// default) = plaintext on a network the NetworkPolicy closes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    pub cert_path_opt: Option<PathBuf>,
    pub key_path_opt: Option<PathBuf>,
    pub ca_path_opt: Option<PathBuf>,
    /// The name the internal certificate is issued for (its SAN).
    pub server_name: String,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            cert_path_opt: None,
            key_path_opt: None,
            ca_path_opt: None,
            server_name: "engram-internal".into(),
        }
    }
}

/// Per-tenant fairness at the gateway: one tenant's burst or flood of slow
/// requests must not take the capacity every other tenant shares.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantLimitSettings {
    /// Sustained requests per second per tenant and key trust level (every
    /// gateway RPC counts; so does `max_concurrent`).
    pub requests_per_second: u32,
    /// Requests a tenant may send at once above the sustained rate.
    pub burst: u32,
    /// Requests of one tenant in flight at once; an agentic request counts
    /// as the pipelines it may run at once.
    pub max_concurrent: u32,
    /// Work slots of the gateway (retrieval pipelines running at once)
    /// that the tenants active in the last `active_window_ms` share: each
    /// may run at most slots / active tenants (at least one); a tenant
    /// alone, `alone_work_slots` (retrieval-svc/src/fair.rs).
    /// 0: one per core (raise it when runs mostly wait on I/O, e.g. a
    /// remote Postgres).
    pub work_slots: u32,
    /// Pipelines a tenant alone may run at once; more wait in line for a
    /// slot (retrieval-svc/src/fair.rs). 0: twice the work slots (four on
    /// two cores). Runs waiting on the cross-encoder hold none.
    pub alone_work_slots: u32,
    /// How long after its last request a tenant still counts as active,
    /// keeping its share of the work slots free for it.
    pub active_window_ms: u64,
    /// The longest a request waits for a work slot before it gets
    /// RESOURCE_EXHAUSTED (it never waits past its own deadline).
    pub slot_wait_ms: u64,
    /// The gateway replicas of one deployment: those with the same group
    /// on one Postgres count each other (heartbeats through search-svc) and
    /// each grants 1/live of `requests_per_second`, `burst` and
    /// `max_concurrent`, so the limits hold for the deployment, however
    /// many replicas the autoscaler runs (issue 48).
    pub replica_group: String,
}

impl Default for TenantLimitSettings {
    fn default() -> Self {
        Self {
            requests_per_second: 200,
            burst: 400,
            max_concurrent: 32,
            work_slots: 0,
            alone_work_slots: 0,
            active_window_ms: 1000,
            slot_wait_ms: 2000,
            replica_group: "gateway".into(),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            home: PathBuf::from(".engram"),
            database: DatabaseSettings::default(),
            listen: ListenSettings::default(),
            downstream: DownstreamSettings::default(),
            auth: AuthSettings::default(),
            models: ModelSettings::default(),
            search: SearchSettings::default(),
            graph: GraphSettings::default(),
            rerank: RerankSettings::default(),
            pipeline: PipelineSettings::default(),
            log: LogSettings::default(),
            llm: LlmSettings::default(),
            working: WorkingMemorySettings::default(),
            tenant: TenantLimitSettings::default(),
            tls: TlsSettings::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSettings {
    /// Any Postgres with pgvector; unset = the embedded one (also read from `DATABASE_URL`).
    pub url_opt: Option<String>,
    /// Connections per pool. search-svc keeps two: its own, and one for the
    /// query path's bounded reads (search-svc/src/bounds.rs, `Readers`), so
    /// it may open up to twice this many.
    pub max_connections: u32,
    /// Embedded Postgres data dir; relative paths are under `home`.
    pub embedded_data_dir: PathBuf,
    /// Embedded Postgres port; 0 = a free one.
    pub embedded_port: u16,
    /// Embedded Postgres `shared_buffers`, in MB. pgvector's HNSW graph is
    /// read page by page at random; a page outside shared buffers is copied
    /// in from the kernel's cache on every visit, which at 100K memories
    /// (a 231 MB index beside a 178 MB table) was most of dense search's
    /// CPU at 256 MB. Size it to hold the busiest tenants' vector index and
    /// rows (Postgres' own guide: up to a quarter of RAM). Read when the
    /// embedded server starts (a running one that is adopted keeps its
    /// size); at least 16.
    pub embedded_shared_buffers_mb: u32,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url_opt: None,
            max_connections: 16,
            embedded_data_dir: PathBuf::from("pgdata"),
            embedded_port: 0,
            embedded_shared_buffers_mb: 1024,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenSettings {
    /// Public gateway (RetrievalService + MemoryService).
    pub retrieval: String,
    pub search: String,
    pub graph: String,
    pub rerank: String,
    /// Admin HTTP: /health, /ready, /metrics.
    pub admin: String,
    /// Gateway HTTP JSON API.
    pub http: String,
    /// After a shutdown signal, how long health stays NOT_SERVING while the
    /// listener still accepts, so load balancers notice before connections
    /// are refused (Kubernetes endpoint propagation takes a few seconds).
    pub drain_delay_ms: u64,
    /// Upper bound on finishing in-flight requests after that; whatever is
    /// still running is then dropped so shutdown never hangs.
    pub drain_grace_ms: u64,
    /// HTTP (the Foundry API, admin): a request's headers must arrive
    /// within this of the connection opening or of the previous response,
    /// which also bounds an idle kept-alive connection. gRPC: a new
    /// connection's first call (TLS and HTTP/2 handshakes included) must
    /// start within this. Else the connection is closed
    /// (common/src/conn.rs).
    pub header_read_timeout_ms: u64,
    /// gRPC: a connection with no call in flight for this long after its
    /// last call ended is closed; a call in flight (a stream included)
    /// holds it open.
    pub idle_timeout_ms: u64,
    /// gRPC: the server pings each connection this often (HTTP/2 PING)...
    pub http2_keepalive_interval_ms: u64,
    /// ...and closes it when a ping is not answered within this.
    pub http2_keepalive_timeout_ms: u64,
}

impl Default for ListenSettings {
    fn default() -> Self {
        Self {
            retrieval: "127.0.0.1:50051".into(),
            search: "127.0.0.1:50052".into(),
            graph: "127.0.0.1:50053".into(),
            rerank: "127.0.0.1:50054".into(),
            admin: "127.0.0.1:9464".into(),
            http: "127.0.0.1:8080".into(),
            drain_delay_ms: 0,
            drain_grace_ms: 10_000,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 300_000,
            http2_keepalive_interval_ms: 30_000,
            http2_keepalive_timeout_ms: 10_000,
        }
    }
}

/// Where the gateway finds its downstreams (gRPC URIs).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DownstreamSettings {
    pub search: String,
    pub graph: String,
    pub rerank: String,
    /// Consecutive failures (errors or timeouts) that open a stack's circuit.
    pub breaker_failures: u32,
    /// How long an open circuit fails fast before one trial call.
    pub breaker_open_ms: u64,
    /// In-flight calls per stack; more are shed at once (not queued).
    pub max_concurrency: usize,
}

impl Default for DownstreamSettings {
    fn default() -> Self {
        Self {
            search: "http://127.0.0.1:50052".into(),
            graph: "http://127.0.0.1:50053".into(),
            rerank: "http://127.0.0.1:50054".into(),
            breaker_failures: 5,
            breaker_open_ms: 5000,
            max_concurrency: 64,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeySettings {
    /// sha256 of the key, hex.
    pub sha256: String,
    pub tenant: String,
    pub agent_id: String,
    /// public | internal | confidential | sensitive
    pub trust: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    pub api_keys: Vec<ApiKeySettings>,
    /// HS256 secret for JWTs (claims: tenant, sub = agent, trust); at
    /// least 32 bytes.
    pub jwt_hs256_secret_opt: Option<String>,
    /// When set, a JWT's `aud` (a string, or a list holding it) must be this.
    pub jwt_audience_opt: Option<String>,
    /// When set, a JWT's `iss` must be this.
    pub jwt_issuer_opt: Option<String>,
    /// Token every internal call must carry; `engram up` generates one per
    /// run. At least 32 bytes, and never a placeholder shipped in deploy/.
    pub internal_token_opt: Option<String>,
    /// Key of the ids `engram ingest` derives from non-UUID ids in a file
    /// (HMAC-SHA256 of tenant and id), so no tenant can predict, and take
    /// first, the ids another tenant's files will get. At least 32 bytes;
    /// unset = `<home>/id-secret`, created once per data directory.
    pub id_secret_opt: Option<String>,
}

/// Internal-token values shipped in deploy/ as placeholders: a deployment
/// that forgot to replace one must not start.
pub const PLACEHOLDER_TOKENS: &[&str] = &["change-me-to-a-long-random-string"];
/// Shortest internal token and JWT secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 32;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSettings {
    /// libonnxruntime.so; unset = the copy installed under `home`.
    pub onnxruntime_path_opt: Option<PathBuf>,
    /// Sentence-embedding ONNX model (all-MiniLM-L6-v2); unset = the
    /// installed one, quantised when `embedding_quantized`.
    pub embedding_model_path_opt: Option<PathBuf>,
    /// Run the installed embedder with its MatMuls quantised dynamically
    /// (derived once under `<home>/models`, common/src/bootstrap.rs): 2-3x
    /// less CPU per query and per written memory, vectors within cosine
    /// ~0.995 of the float model's (docs/benchmarks.md, issue 22). When the
    /// derivation fails the float model runs and the error is logged.
    pub embedding_quantized: bool,
    pub embedding_tokenizer_path_opt: Option<PathBuf>,
    /// Cross-encoder directory (model.onnx + tokenizer.json).
    pub cross_encoder_dir_opt: Option<PathBuf>,
    /// ONNX Runtime threads; 0 = number of cores. Each model runs that many
    /// single-threaded sessions, a request's texts side by side, one text
    /// per run (models/src/sessions.rs: 1.35-1.6x faster than intra-op
    /// threads on 2 cores, and a text's output never depends on its batch).
    pub intra_threads: usize,
}

impl Default for ModelSettings {
    fn default() -> Self {
        Self {
            onnxruntime_path_opt: None,
            embedding_model_path_opt: None,
            embedding_quantized: true,
            embedding_tokenizer_path_opt: None,
            cross_encoder_dir_opt: None,
            intra_threads: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchSettings {
    pub hnsw_ef_search: u32,
    /// "ts_rank_cd" or "bm25"
    pub keyword_scoring: String,
    pub embed_batch_size: usize,
    /// Write-path embedding chunks (`embed_batch_size` texts each) run at
    /// once; one tenant holds at most half of them (rounded up), and
    /// single-text query embeddings never wait for one
    /// (search-svc/src/embed/gate.rs). Each chunk spreads over every model
    /// session, so more than one mostly adds contention: 1 keeps a query's
    /// wait for a session to one chunk's share.
    pub embed_batch_slots: usize,
    /// Added to the nice value of the threads that embed write-path chunks
    /// (Linux; 0 = the service's own priority): a tenant's flood of large
    /// upserts then takes the cores only when queries leave them idle
    /// (`engram soak --only high`, write_flood; search-svc/src/embed.rs).
    pub embed_batch_nice: i32,
    /// MiB of recent query embeddings kept per search-svc, keyed by tenant
    /// and text (search-svc/src/embed/recent.rs): a repeated query, or the
    /// second embedding of one request (the gateway's semantic cache, then
    /// the dense search), skips the model. 0 = off.
    pub query_embedding_cache_mb: u64,
    /// Memories below this decay score are hidden unless include_historical.
    /// 0 (the default): time alone never hides a memory; decay only ranks
    /// (a faded memory's temporal score is at least 0.05). An operator who
    /// wants forgetting sets a floor, e.g. 0.1: about 3.3 half-lives unused.
    pub decay_floor: f32,
    /// Most rows BM25 scores per keyword query: the GIN index is asked only
    /// for the rarest query terms, while their summed document frequency fits
    /// this budget (search-svc/src/keyword.rs explains why recall holds).
    pub keyword_candidates: u32,
    /// Answer BM25 keyword queries from an in-memory tantivy index per
    /// tenant (search-svc keyword_index.rs) instead of SQL: Postgres stays
    /// the source of truth, every hit is re-read through the same access
    /// predicate, and a tenant whose index is not up to date with its
    /// writes is answered by SQL while the index rebuilds in the
    /// background. At 100K memories BM25 in SQL was the largest CPU cost of
    /// a query (docs/benchmarks.md, issue 22).
    pub keyword_index: bool,
    /// Text (titles and contents, bytes) the keyword indexes of all
    /// tenants may hold together (the least recently used tenants are
    /// dropped past it; an index takes roughly a third of its text in
    /// memory); a tenant holding more than half of it is never indexed and
    /// keeps SQL. Bytes rather than memories: one memory may hold 64 KiB.
    pub keyword_index_max_text_bytes: u64,
    /// Least time (ms) between two builds of one tenant's index; a build
    /// also waits out four times the previous one's duration, so a tenant
    /// that writes without pause keeps at most a fifth of a core busy.
    pub keyword_index_rebuild_ms: u64,
    /// Seconds between two passes of search-svc's decay job over every
    /// memory; 0 turns the job off (`engram decay --once` still works).
    pub decay_interval_secs: u64,
    /// Index every sentence of a memory with its own embedding at write
    /// time (search-svc facts.rs), for the graph walk's fact seeds
    /// (pipeline.graph_fact_seeds). Costs one embedding per sentence of a
    /// multi-sentence memory on write (ingest of Wikipedia paragraphs fell
    /// from ~33 to 6–10 memories/s), so it is off until fact seeds earn
    /// their place (docs/benchmarks.md, "Fact seeds"); `engram index-facts`
    /// indexes what was written before it was turned on.
    pub fact_index: bool,
    /// Embed a dense query with the names of the speakers of turns the
    /// caller can read in the first person ("When did Caroline go…" →
    /// "When did I go…", "Caroline's" → "my"): a turn is embedded as
    /// "speaker: text", and the name in the question made every turn of
    /// that speaker look alike (LoCoMo 0–4 dense R@10 50.8 as asked, 62.6
    /// in the first person; search-svc speakers.rs). One indexed lookup per
    /// vector search; memories without a speaker never match.
    pub dense_speakers_first_person: bool,
    /// Detect at write time when a new memory updates an older one and
    /// write a system-detected `contradicts` edge (search-svc updates.rs).
    /// Off by default: on pairs from domains it was never fitted on
    /// (`engram eval updates`, held-out set) the detector's precision is
    /// 0.79 at recall 0.79 (on dev, cross-fitted: 0.91 / 0.81), and a
    /// false pair makes Stage 5 hide a true memory.
    pub update_detection: bool,
    /// The probability (of `search_svc::updates::MODEL`) a pair must reach
    /// to count as an update.
    pub update_threshold: f32,
    /// Memory types judged for updates (not documents, conversation turns
    /// or working memory: see search-svc updates.rs).
    pub update_types: Vec<String>,
    /// Detect only (0, the default), or also close the old memory's
    /// validity when an update says so ("now", "moved", …) and scores at
    /// least this: off / detect-only / auto-supersede.
    pub update_auto_supersede: f32,
    /// Writes whose detection may wait on search-svc's background worker
    /// (after the acknowledgement); when they are all taken a write runs its
    /// own detection before it is acknowledged. 0 = always before the
    /// acknowledgement, so the edge exists when the write returns.
    pub update_detection_queue: usize,
    /// Days the Stage 4 training examples (feedback with the features of
    /// the answer it judged) are kept; the decay pass deletes older ones.
    pub ranker_examples_days: u32,
    /// Rows per decay UPDATE: each batch is its own short statement, so the
    /// job never holds many row locks or one long transaction.
    pub decay_batch_size: u32,
    /// Half-life in days of `decay_score` per memory type (0 = never
    /// decays). Entries given in config are laid over these defaults, so
    /// `ENGRAM__SEARCH__DECAY_HALF_LIFE_DAYS__EPISODIC=7` changes episodic
    /// only (search-svc/src/decay.rs).
    pub decay_half_life_days: std::collections::BTreeMap<String, f32>,
    /// Half-life in days of every type not in `decay_half_life_days`
    /// (documents, imported corpora, custom types); 0 = never decays.
    pub decay_default_half_life_days: f32,
    /// statement_timeout (ms) of a dense query; a cancelled statement is
    /// DEADLINE_EXCEEDED. Reads stay well under the gateway's 3 s ceiling
    /// so a slow plan frees its connection soon after the caller gave up.
    /// It is also the bound of search-svc's readers' pool: a read whose
    /// bound equals it runs as one statement, any other one inside
    /// `BEGIN; SET LOCAL` (two round trips more; search-svc/src/bounds.rs).
    pub statement_timeout_dense_ms: u64,
    /// statement_timeout (ms) of a keyword query (set it equal to
    /// `statement_timeout_dense_ms` to keep the one-statement read path).
    pub statement_timeout_keyword_ms: u64,
    /// statement_timeout (ms) of a Get by id (as for keyword).
    pub statement_timeout_get_ms: u64,
    /// statement_timeout (ms) of each statement of a write transaction
    /// (upsert, delete, edges, feedback): longer, writes are not retried.
    pub statement_timeout_write_ms: u64,
    /// statement_timeout (ms) of one decay batch.
    pub statement_timeout_decay_ms: u64,
    /// Requests search-svc handles at once; more are refused at once with
    /// RESOURCE_EXHAUSTED (breaker-neutral at the gateway) instead of
    /// queueing for a pool connection. 0 = no limit.
    pub max_concurrent_requests: u32,
}

impl Default for SearchSettings {
    fn default() -> Self {
        Self {
            hnsw_ef_search: 100,
            // bm25 measured 55.6/67.2 R@2/R@5 on 2Wiki dev vs 24.6/35.5 for
            // ts_rank_cd (which has no idf: frequent terms like "ii" win).
            keyword_scoring: "bm25".into(),
            embed_batch_size: 32,
            embed_batch_slots: 1,
            embed_batch_nice: 10,
            query_embedding_cache_mb: 16,
            decay_floor: 0.0,
            // 1,000 (was 2,000): at 100K memories direct keyword p50 / p95
            // 16 / 30 ms -> 10 / 21 ms; 2Wiki dev at the same share of its
            // corpus: pipeline and hybrid recall unchanged, keyword-only R@5
            // -1 point (docs/decisions.md).
            keyword_candidates: 1000,
            keyword_index: true,
            keyword_index_max_text_bytes: 1 << 30,
            keyword_index_rebuild_ms: 1000,
            decay_interval_secs: 600,
            fact_index: false,
            dense_speakers_first_person: true,
            update_detection: false,
            update_threshold: 0.65,
            update_types: ["semantic", "episodic", "procedural"]
                .map(String::from)
                .to_vec(),
            update_auto_supersede: 0.0,
            update_detection_queue: 256,
            ranker_examples_days: 90,
            decay_batch_size: 1000,
            // Events fade in weeks, facts in months, procedures in a year;
            // with the 0.1 floor a memory is hidden after ~3.3 half-lives
            // without use.
            decay_half_life_days: [
                ("episodic", 30.0),
                ("conversation", 14.0),
                ("semantic", 180.0),
                ("procedural", 365.0),
            ]
            .into_iter()
            .map(|(t, d)| (t.to_string(), d))
            .collect(),
            decay_default_half_life_days: 0.0,
            statement_timeout_dense_ms: 1000,
            statement_timeout_keyword_ms: 1000,
            statement_timeout_get_ms: 1000,
            statement_timeout_write_ms: 10_000,
            statement_timeout_decay_ms: 5000,
            max_concurrent_requests: 256,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GraphSettings {
    pub damping: f32,
    pub max_iter: u32,
    pub tolerance: f32,
    pub max_nodes: u32,
    pub max_hops: u32,
    pub top_k: u32,
    /// Weight of entity seeds relative to memory seeds passed by the caller.
    pub entity_seed_weight: f32,
    /// Entities kept from the caller's fact seeds (the sentences the query
    /// resembles), best first; HippoRAG 2 keeps 5.
    pub fact_entities: u32,
    /// Share of the entity seed mass that goes to the fact entities when
    /// the caller sends facts (the rest stays on the query's own names);
    /// 1 = the facts' entities alone, as in HippoRAG 2 (on MuSiQue that
    /// cost 6 points of pipeline R@2; 0.25 was the best of 0.25 / 0.5 / 1).
    pub fact_seed_share: f32,
    /// Multiplies caller memory seeds (e.g. dense hits); small, because dense
    /// seeds drown entity seeds (notes/graph-probe.md: 0.05 cost 12 points).
    pub memory_seed_weight: f32,
    /// Weight of a memory's edge to its home (title) entity vs a mention.
    pub home_weight: f32,
    /// Quiet time after the last change notification before a tenant rebuild.
    pub debounce_ms: u64,
    /// Upper bound on how long a burst of notifications can defer a rebuild.
    pub max_debounce_ms: u64,
    /// Tenants whose graphs load in the background at start, so their first
    /// query does not pay the load (seconds at 100K memories); `["*"]` =
    /// every tenant with memories in Postgres at start.
    pub preload_tenants: Vec<String>,
    /// Estimated bytes of tenant graphs one graph-svc instance keeps; past
    /// it the least recently used tenants are evicted (and reload on their
    /// next query), so many tenants cannot exhaust the host. 2 GiB holds
    /// about six 100K-memory tenants of `engram bench`'s mixed corpus
    /// (~320–350 MB each with the parts kept for rebuilds in place; ~106 MB
    /// on the older repeated corpus, whose names repeat 50 times); the most
    /// recently used graph always stays, even alone over the budget, so it
    /// never reloads per query.
    pub memory_budget_bytes: u64,
    /// Evict a tenant's graph after this long without a query, returning
    /// memory nobody uses; 0 = never (the budget alone bounds memory, and a
    /// reload costs seconds at 100K memories).
    pub idle_evict_secs: u64,
    /// How long a query waits for its tenant's first load (always also
    /// bounded by its own deadline) before it degrades with
    /// RESOURCE_EXHAUSTED; the load goes on in the background either way.
    pub load_wait_ms: u64,
    /// Least time between the end of one rebuild of a tenant and the start
    /// of the next; notifications in between coalesce into one later
    /// rebuild, so a tenant writing constantly cannot keep a core busy.
    pub min_rebuild_interval_ms: u64,
    /// Rebuilds running at once across tenants (first loads are not
    /// counted: they must not queue behind another tenant's writes).
    pub max_concurrent_rebuilds: usize,
    /// A rebuild whose notifications name at most this many memories reads
    /// only those (and re-matches the memories a new entity name may
    /// mention) instead of the whole tenant: at 100K memories ~1.5 s of
    /// layout instead of ~8 s. 0 = always read the whole tenant.
    pub incremental_max_ids: usize,
    /// After this many rebuilds in place, the next one reads the whole
    /// tenant again (a reconciliation bound; both give the same graph).
    pub full_rebuild_every: u32,
    /// Most memories a rebuild in place re-reads because a new entity
    /// name's word is in their text (with `incremental_max_ids`, at most
    /// two full-load pages of texts in memory); a commoner word makes the
    /// rebuild full.
    pub rematch_limit: usize,
}

impl Default for GraphSettings {
    fn default() -> Self {
        Self {
            damping: 0.5,
            max_iter: 100,
            tolerance: 1e-6,
            max_nodes: 1000,
            max_hops: 4,
            top_k: 50,
            entity_seed_weight: 1.0,
            fact_entities: 5,
            fact_seed_share: 0.25,
            memory_seed_weight: 0.05,
            home_weight: 5.0,
            debounce_ms: 300,
            max_debounce_ms: 3000,
            preload_tenants: Vec::new(),
            memory_budget_bytes: 2 << 30,
            idle_evict_secs: 0,
            load_wait_ms: 300,
            min_rebuild_interval_ms: 3000,
            max_concurrent_rebuilds: 1,
            incremental_max_ids: 2000,
            full_rebuild_every: 100,
            rematch_limit: 2000,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RerankSettings {
    /// Max tokens per (query, passage) pair. 128 keeps the same 2Wiki dev
    /// recall as 256 at ~60 % of the cost (docs/benchmarks.md).
    pub max_length: usize,
    /// Requests allowed to wait for the model before ResourceExhausted.
    pub queue_capacity: usize,
    /// Under load, a request queued behind others is cut to the head of
    /// its pairs (at least 3) that finishes within this many ms, so every
    /// answer gets a short rerank instead of a few a long one
    /// (rerank-svc backlog.rs); 0 turns it off. A request alone is never
    /// cut.
    pub queue_target_ms: u64,
}

impl Default for RerankSettings {
    fn default() -> Self {
        Self {
            max_length: 128,
            queue_capacity: 32,
            queue_target_ms: 150,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PipelineSettings {
    pub ceiling_ms: u64,
    pub vector_timeout_ms: u64,
    pub keyword_timeout_ms: u64,
    pub graph_timeout_ms: u64,
    pub rerank_timeout_ms: u64,
    pub rrf_k: f32,
    /// Cross-encoder floor for Stage 3. Calibrated by `engram tune` on the
    /// dev halves: the seed's 0.3 would drop 7-20 % of gold passages (gold
    /// p10 is 0.11-0.43), and every floor tried (up to 0.1) cost recall, so
    /// the default drops nothing and the score works through the Stage 4
    /// blend; callers who want a hard floor set it here.
    pub relevance_threshold: f32,
    /// Whether Stage 3 asks the cross-encoder at all. Off by default: the
    /// shipped model was trained on every dev set, so no dev measurement
    /// can show it generalizing, and on held-out questions it cost MuSiQue
    /// 11.5 points of R@2 and 2Wiki 1.3 while helping LoCoMo by 6.9; it is
    /// also most of a query's latency (docs/decisions.md). Chat-heavy
    /// deployments may turn it on.
    pub cross_encoder: bool,
    /// Whether the current version of a fact comes first: versions of one
    /// slot among a query's candidates (the same words but for the value)
    /// are ordered newest first (retrieval-svc pipeline/current.rs).
    pub current_first: bool,
    /// Candidates sent to the cross-encoder.
    pub rerank_top_n: usize,
    /// Stage 4 blend: RRF k of fused rank + cross-encoder rank, and the
    /// cross-encoder's weight relative to the fused rank.
    pub rerank_blend_k: f32,
    pub rerank_weight: f32,
    pub max_attempts: u32,
    pub cache_ttl_ms: u64,
    pub cache_similarity: f32,
    /// Bytes held by the result, semantic and turn caches together (each
    /// gets a third), weighed by the encoded size of the answers they keep.
    pub cache_max_bytes: u64,
    /// Largest share of a cache one tenant may fill: past it the tenant's
    /// new answers are not cached, so a flood of distinct queries cannot
    /// evict every other tenant's entries.
    pub cache_tenant_share: f64,
    /// Candidates fetched per strategy (at least the request's limit). 30
    /// since 27 November 2026 (was 50): at RRF k 2 a list's ranks past 30
    /// almost never reach the top 10; the dev sets' pipeline recall moved
    /// by at most 0.2 except MuSiQue R@2 +0.8, and a 100K query cost 10 %
    /// less CPU (docs/benchmarks.md, issue 22).
    pub candidates_per_strategy: u32,
    /// Dense hits passed to graph-svc as extra PPR seeds (weighted 1/rank,
    /// then scaled by graph.memory_seed_weight). 0 = graph runs in parallel
    /// with entity seeds only: on 2Wiki dense seeds cost recall
    /// (shared/notes/graph-probe.md).
    pub graph_dense_seeds: u32,
    /// Sentences nearest the query (search-svc's fact index, which
    /// search.fact_index fills) passed to graph-svc, whose entities seed the
    /// walk (graph.fact_entities, graph.fact_seed_share); the walk then
    /// waits for the vector list. 0 = off (the default: on the dev sets it
    /// lifted MuSiQue R@5 by 1.7 and cost HotpotQA 3 points of R@2,
    /// docs/benchmarks.md), at most 32.
    pub graph_fact_seeds: u32,
    /// Conversation turns (retrieval-svc pipeline/session.rs): a turn's
    /// fused score × (1 + session_lift · its session's score relative to
    /// the best session among the candidates). 0 = off. Memories that are
    /// not turns are never lifted.
    pub session_lift: f32,
    /// × (1 + speaker_lift) for a turn whose speaker the question names.
    /// 3 (was 0.3, the LoCoMo probe's prior): in LoCoMo 95–100 % of the
    /// evidence turns are the named speaker's; chosen on conversations
    /// 0–2 among 0.3, 1, 2, 3, 5, 10 and checked on 3–4
    /// (docs/conversations.md).
    pub speaker_lift: f32,
    /// × (1 + time_lift) for a memory whose event time falls in the time
    /// the question names ("in June", "on 3 May 2023", "last year";
    /// retrieval-svc pipeline/when.rs). 0 = off.
    pub time_lift: f32,
    /// A linked entity anchors a query when some memory is about it (its
    /// title / home entity) and at most this share of the visible memories
    /// mention it: the graph walk then leads (retrieval-svc evidence.rs).
    pub anchor_max_df_ratio: f32,
    pub weights: FusionWeights,
    pub abstain: AbstainSettings,
    pub ranker: RankerSettings,
    pub complement: ComplementSettings,
}

/// Stage 4's second pass on multi-hop questions (retrieval-svc
/// pipeline/complement.rs): the fusion's #1 opens the answer and the next
/// slots hold the memories that, together with it, cover the question best. Chosen leave-one-dataset-
/// out on the dev sets (docs/benchmarks.md, "Complementary slots").
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ComplementSettings {
    /// Candidates (best first after Stage 4) the slots are chosen from;
    /// 0 = off. At most 50.
    pub pool: usize,
    /// Slots filled, the opening #1 included (2 = the #1 and one
    /// complement). In 2..=pool.
    pub slots: usize,
    /// Weight of a candidate's own Stage 4 score (relative to the best)
    /// beside how much the pair's joined vector resembles the question.
    pub score_weight: f32,
    /// Weight of the bridge: the names (capitalised words) a candidate
    /// shares with a slot already chosen and the question does not say,
    /// relative to the best-bridging candidate. Not applied to comparison
    /// questions, which name both ends themselves. 0 = off.
    pub bridge_weight: f32,
    /// On a multi-hop answer, the memory the *simple* route's fusion would
    /// have put first takes the place after the slots when the answer holds
    /// it lower (or not at all): a hedge against a graph-led reading that
    /// lost the question's own page (a name the graph does not link, a page
    /// only the dense and keyword lists find), which the multi-hop weights
    /// (keyword 0) leave out of the top 10. One place, below the slots (one
    /// lower when the next hop's find takes it), so the head the slots
    /// chose stands (docs/benchmarks.md, "The next hop by name").
    pub hedge: bool,
    /// Names of the first memory of an answer the slots reorder (the ones
    /// the question does not say, in the order the memory says them) added
    /// to the question for a second keyword search, the next hop's; 0 = no
    /// second search. At most 32.
    pub hop_names: usize,
    /// How deep that search's list is read for a memory the slots do not
    /// already hold; the first such takes the place after the slots. Its
    /// own #1 is mostly the first memory again (the query holds its names),
    /// so 2 reads one page beyond it. In 1..=10.
    pub hop_depth: usize,
}

impl Default for ComplementSettings {
    fn default() -> Self {
        Self {
            pool: 10,
            slots: 3,
            score_weight: 0.5,
            bridge_weight: 0.2,
            hedge: true,
            hop_names: 4,
            hop_depth: 2,
        }
    }
}

/// The learned Stage 4 ranker (retrieval-svc pipeline/ranker.rs). On by
/// default with the model the repository ships (models/ranker/), which
/// leave-one-dataset-out lifts 2Wiki and HotpotQA R@2 by 5 and 10 points
/// and leaves LoCoMo as it was (docs/benchmarks.md, "Stage 4"). A model
/// file, when given, replaces it and is re-read when it changes, so a new
/// fit (`engram tune --ranker-out`) goes live without a restart; a file
/// that does not load leaves the previous model in place.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RankerSettings {
    pub enabled: bool,
    pub model_path_opt: Option<PathBuf>,
    /// A directory of per-tenant models, `<tenant>.json` each (what
    /// `engram ranker train --tenant T` writes): a tenant with a file is
    /// ranked by its own model, every other by the global one.
    pub tenant_models_dir_opt: Option<PathBuf>,
    /// How often the model file is checked for a change.
    pub reload_ms: u64,
}

impl Default for RankerSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            model_path_opt: None,
            tenant_models_dir_opt: None,
            reload_ms: 5_000,
        }
    }
}

/// Calibrated abstention (retrieval-svc pipeline/abstain.rs): the weights
/// of the evidence score and the threshold below which an answer says
/// `nothing_relevant`. The defaults are an unfitted prior (equal weights,
/// 0.4), so their dev rates are honest: foreign questions flagged 96.0 %
/// (LoCoMo) and 92.0 % (2Wiki), answerable ones 0.3 % and 0.0 %
/// (`engram eval abstain`, docs/benchmarks.md). The fitted calibration
/// cross-fits to similar rates with less margin on answerable questions.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AbstainSettings {
    pub names_weight: f32,
    pub terms_weight: f32,
    pub cosine_weight: f32,
    pub threshold: f32,
}

impl Default for AbstainSettings {
    fn default() -> Self {
        Self {
            names_weight: 1.0,
            terms_weight: 1.0,
            cosine_weight: 1.0,
            threshold: 0.4,
        }
    }
}

impl Default for PipelineSettings {
    fn default() -> Self {
        Self {
            ceiling_ms: 3000,
            vector_timeout_ms: 300,
            keyword_timeout_ms: 200,
            graph_timeout_ms: 500,
            rerank_timeout_ms: 1500,
            rrf_k: 60.0,
            relevance_threshold: 0.0,
            cross_encoder: false,
            current_first: true,
            rerank_top_n: 10,
            rerank_blend_k: 10.0,
            rerank_weight: 2.0,
            max_attempts: 3,
            cache_ttl_ms: 60_000,
            cache_similarity: 0.95,
            cache_max_bytes: 192 * 1024 * 1024,
            cache_tenant_share: 0.25,
            candidates_per_strategy: 30,
            graph_dense_seeds: 0,
            graph_fact_seeds: 0,
            // The LoCoMo probe's values (shared/notes/locomo-probe.md),
            // chosen before this code; docs/benchmarks.md has the check.
            session_lift: 2.0,
            speaker_lift: 3.0,
            // Chosen a priori (a memory said then counts twice), not fitted.
            time_lift: 1.0,
            anchor_max_df_ratio: 0.02,
            weights: FusionWeights::default(),
            abstain: AbstainSettings::default(),
            ranker: RankerSettings::default(),
            complement: ComplementSettings::default(),
        }
    }
}

/// RRF weights per route and strategy.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FusionWeights {
    pub simple: StrategyWeights,
    pub multi_hop: StrategyWeights,
    pub exploratory: StrategyWeights,
}

impl Default for FusionWeights {
    /// Fitted by `engram tune` on the dev halves (docs/benchmarks.md);
    /// exploratory had too few dev questions to fit and stays even.
    fn default() -> Self {
        Self {
            simple: StrategyWeights {
                vector: 0.75,
                keyword: 1.0,
                graph: 0.35,
                rrf_k_opt: Some(2.0),
            },
            multi_hop: StrategyWeights {
                vector: 0.2,
                keyword: 0.0,
                graph: 1.0,
                rrf_k_opt: Some(2.0),
            },
            exploratory: StrategyWeights {
                vector: 1.0,
                keyword: 1.0,
                graph: 1.0,
                rrf_k_opt: None,
            },
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrategyWeights {
    pub vector: f32,
    pub keyword: f32,
    pub graph: f32,
    /// RRF k for this route; unset = `pipeline.rrf_k`. A small k lets the
    /// top ranks of the leading strategy dominate.
    #[serde(default, rename = "rrf_k", skip_serializing_if = "Option::is_none")]
    pub rrf_k_opt: Option<f32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// "pretty" | "json" | "auto" (json unless stderr is a terminal).
    pub format: String,
    /// EnvFilter directive; `RUST_LOG` wins when set.
    pub filter: String,
    /// Log (scrubbed) query text at all. Off by default: questions are
    /// personal ("Is Lena leaving the company?") in ways no scrubber sees.
    pub query_text: bool,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: "auto".into(),
            filter: "info,ort=warn".into(),
            query_text: false,
        }
    }
}

/// An optional OpenAI-compatible chat endpoint for query decomposition,
/// synthesis and HyDE hypotheses. engram never requires one: without an
/// endpoint every path falls back to its rule-based form.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmSettings {
    /// Base URL up to and including `/v1`, e.g. `http://localhost:8000/v1`.
    pub endpoint_opt: Option<String>,
    pub model: String,
    /// Name of the environment variable holding the bearer key (the key
    /// itself never sits in a config file).
    pub api_key_env_opt: Option<String>,
    /// Budget of one decomposition / synthesis call.
    pub timeout_ms: u64,
    /// Budget of HyDE hypothesis generation; on expiry it is skipped.
    pub hyde_timeout_ms: u64,
    /// Hypotheses asked for per conversation-window query (1..=8); each
    /// costs one more vector search in the pipeline.
    pub hyde_hypotheses: usize,
}

impl Default for LlmSettings {
    fn default() -> Self {
        Self {
            endpoint_opt: None,
            model: "gpt-4o-mini".into(),
            api_key_env_opt: None,
            timeout_ms: 10_000,
            hyde_timeout_ms: 2_000,
            hyde_hypotheses: 2,
        }
    }
}

/// Session-scoped working memory kept in the gateway's process.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkingMemorySettings {
    /// Fragments kept per session; the least recently used go first.
    pub max_per_session: usize,
    /// Sessions kept; the least recently used go first.
    pub max_sessions: usize,
    /// Sessions one tenant may hold; past it its own least recently used
    /// session goes, never another tenant's.
    pub max_sessions_per_tenant: usize,
    /// Estimated bytes one tenant may hold; past it its own least recently
    /// used fragments go.
    pub max_bytes_per_tenant: usize,
    /// Estimated bytes the whole store may hold.
    pub max_bytes: usize,
    /// TTL of a fragment written without one.
    pub default_ttl_ms: u64,
    /// Count at which a retrieval shape becomes a concept candidate.
    pub demand_threshold: u64,
    /// Upper bound on a fragment's `metadata.ttl_ms`.
    pub max_ttl_ms: u64,
    /// Embedding cosine at which a fragment matches a query without shared words.
    pub match_similarity: f32,
    /// Distinct shapes counted per tenant; new shapes past it are dropped.
    pub max_demand_shapes: usize,
}

impl Default for WorkingMemorySettings {
    fn default() -> Self {
        Self {
            max_per_session: 256,
            max_sessions: 10_000,
            max_sessions_per_tenant: 1_000,
            max_bytes_per_tenant: 64 * 1024 * 1024,
            max_bytes: 1024 * 1024 * 1024,
            default_ttl_ms: 3_600_000,
            demand_threshold: 5,
            max_ttl_ms: 7 * 24 * 3_600_000,
            match_similarity: 0.5,
            max_demand_shapes: 1024,
        }
    }
}

impl AuthSettings {
    /// The internal boundary is only as strong as its secrets.
    fn validate(&self) -> Result<(), SettingsError> {
        if let Some(t) = self.internal_token_opt.as_deref().filter(|t| !t.is_empty()) {
            if PLACEHOLDER_TOKENS.contains(&t) {
                return Err(SettingsError::Invalid(
                    "auth.internal_token_opt is the placeholder shipped in deploy/: set a random one".into(),
                ));
            }
            if t.len() < MIN_SECRET_BYTES {
                return Err(SettingsError::Invalid(format!(
                    "auth.internal_token_opt must be at least {MIN_SECRET_BYTES} bytes"
                )));
            }
        }
        if self
            .id_secret_opt
            .as_deref()
            .is_some_and(|s| s.len() < MIN_SECRET_BYTES)
        {
            return Err(SettingsError::Invalid(format!(
                "auth.id_secret_opt must be at least {MIN_SECRET_BYTES} bytes"
            )));
        }
        if let Some(s) = self
            .jwt_hs256_secret_opt
            .as_deref()
            .filter(|s| !s.is_empty())
            && s.len() < MIN_SECRET_BYTES
        {
            return Err(SettingsError::Invalid(format!(
                "auth.jwt_hs256_secret_opt must be at least {MIN_SECRET_BYTES} bytes"
            )));
        }
        Ok(())
    }
}

impl Settings {
    /// Defaults, then `path_opt` (or `ENGRAM_CONFIG`, or `engram.toml` when it
    /// exists), then `ENGRAM__*` variables, then `DATABASE_URL`.
    pub fn load(path_opt: Option<&Path>) -> Result<Self, SettingsError> {
        let env: Vec<(String, String)> = std::env::vars().collect();
        let path_opt = path_opt.map(Path::to_path_buf).or_else(|| {
            std::env::var_os("ENGRAM_CONFIG")
                .map(PathBuf::from)
                .or_else(|| Some(PathBuf::from("engram.toml")).filter(|p| p.exists()))
        });
        let file_opt = match path_opt {
            Some(path) => {
                let text =
                    std::fs::read_to_string(&path).map_err(|source| SettingsError::Read {
                        path: path.clone(),
                        source,
                    })?;
                Some((path, text))
            }
            None => None,
        };
        Self::from_sources(
            file_opt.as_ref().map(|(p, t)| (p.as_path(), t.as_str())),
            &env,
        )
    }

    /// Pure form of [`Settings::load`], for tests.
    pub fn from_sources(
        file_opt: Option<(&Path, &str)>,
        env: &[(String, String)],
    ) -> Result<Self, SettingsError> {
        // The defaults as a table underneath, so a file or a variable may
        // set one field of a section whose fields have no serde default
        // (`ENGRAM__PIPELINE__WEIGHTS__SIMPLE__RRF_K=5` alone).
        let mut root = toml::Table::try_from(Settings::default())
            .map_err(|e| SettingsError::Invalid(format!("defaults: {e}")))?;
        if let Some((path, text)) = file_opt {
            let file = text
                .parse::<toml::Table>()
                .map_err(|e| SettingsError::Parse {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?;
            merge(&mut root, file);
        }
        for (key, value) in env {
            let Some(rest) = key.strip_prefix("ENGRAM__") else {
                continue;
            };
            let parts: Vec<String> = rest.split("__").map(|p| p.to_ascii_lowercase()).collect();
            if parts.iter().any(String::is_empty) {
                return Err(SettingsError::Invalid(format!("malformed variable {key}")));
            }
            set_path(&mut root, &parts, parse_env_value(value))
                .map_err(|m| SettingsError::Invalid(format!("{key}: {m}")))?;
        }
        if let Some((_, url)) = env
            .iter()
            .find(|(k, v)| k == "DATABASE_URL" && !v.is_empty())
        {
            let db = root
                .entry("database")
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let toml::Value::Table(t) = db {
                t.entry("url_opt")
                    .or_insert_with(|| toml::Value::String(url.clone()));
            }
        }
        let settings: Settings = toml::Value::Table(root)
            .try_into()
            .map_err(|e: toml::de::Error| SettingsError::Invalid(e.message().to_string()))?;
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> Result<(), SettingsError> {
        let p = &self.pipeline;
        for (name, v) in [
            ("pipeline.session_lift", p.session_lift),
            ("pipeline.speaker_lift", p.speaker_lift),
            ("pipeline.time_lift", p.time_lift),
        ] {
            if !(0.0..=10.0).contains(&v) {
                return Err(SettingsError::Invalid(format!("{name} must be in 0..=10")));
            }
        }
        let c = &p.complement;
        if c.pool > 50 || (c.pool > 0 && !(2..=c.pool).contains(&c.slots)) {
            return Err(SettingsError::Invalid(
                "pipeline.complement: pool must be in 0..=50 and slots in 2..=pool".into(),
            ));
        }
        if c.hop_names > 32 || !(1..=10).contains(&c.hop_depth) {
            return Err(SettingsError::Invalid(
                "pipeline.complement: hop_names must be in 0..=32 and hop_depth in 1..=10".into(),
            ));
        }
        for (name, v) in [
            ("pipeline.complement.score_weight", c.score_weight),
            ("pipeline.complement.bridge_weight", c.bridge_weight),
        ] {
            if !(0.0..=10.0).contains(&v) {
                return Err(SettingsError::Invalid(format!("{name} must be in 0..=10")));
            }
        }
        if p.graph_fact_seeds > 32 {
            return Err(SettingsError::Invalid(
                "pipeline.graph_fact_seeds must be in 0..=32".into(),
            ));
        }
        if p.ceiling_ms == 0 || p.ceiling_ms > 60_000 {
            return Err(SettingsError::Invalid(
                "pipeline.ceiling_ms must be in 1..=60000".into(),
            ));
        }
        if !(0.0..=1.0).contains(&p.relevance_threshold) {
            return Err(SettingsError::Invalid(
                "pipeline.relevance_threshold must be in 0..=1".into(),
            ));
        }
        if !(p.cache_tenant_share > 0.0 && p.cache_tenant_share <= 1.0) {
            return Err(SettingsError::Invalid(
                "pipeline.cache_tenant_share must be in (0, 1]".into(),
            ));
        }
        if !(0.0..=1.0).contains(&self.graph.fact_seed_share) {
            return Err(SettingsError::Invalid(
                "graph.fact_seed_share must be in 0..=1".into(),
            ));
        }
        if !(0.0..1.0).contains(&self.graph.damping) {
            return Err(SettingsError::Invalid(
                "graph.damping must be in 0..1".into(),
            ));
        }
        if self.graph.max_nodes == 0 || self.graph.max_nodes > 1000 {
            return Err(SettingsError::Invalid(
                "graph.max_nodes must be in 1..=1000".into(),
            ));
        }
        if self.graph.incremental_max_ids > 100_000 {
            return Err(SettingsError::Invalid(
                "graph.incremental_max_ids must be in 0..=100000".into(),
            ));
        }
        if self.graph.rematch_limit > 100_000 {
            return Err(SettingsError::Invalid(
                "graph.rematch_limit must be in 0..=100000".into(),
            ));
        }
        if !(1..=100_000).contains(&self.search.keyword_candidates) {
            return Err(SettingsError::Invalid(
                "search.keyword_candidates must be in 1..=100000".into(),
            ));
        }
        if self.search.keyword_index_rebuild_ms > 3_600_000 {
            return Err(SettingsError::Invalid(
                "search.keyword_index_rebuild_ms must be in 0..=3600000".into(),
            ));
        }
        if self.search.keyword_index && self.search.keyword_index_max_text_bytes < 1024 {
            return Err(SettingsError::Invalid(
                "search.keyword_index_max_text_bytes must be at least 1024 when search.keyword_index is on"
                    .into(),
            ));
        }
        if !["ts_rank_cd", "bm25"].contains(&self.search.keyword_scoring.as_str()) {
            return Err(SettingsError::Invalid(
                "search.keyword_scoring must be ts_rank_cd or bm25".into(),
            ));
        }
        self.auth.validate()?;
        let l = &self.listen;
        for (name, v) in [
            ("listen.header_read_timeout_ms", l.header_read_timeout_ms),
            ("listen.idle_timeout_ms", l.idle_timeout_ms),
            (
                "listen.http2_keepalive_interval_ms",
                l.http2_keepalive_interval_ms,
            ),
            (
                "listen.http2_keepalive_timeout_ms",
                l.http2_keepalive_timeout_ms,
            ),
        ] {
            if !(1..=86_400_000).contains(&v) {
                return Err(SettingsError::Invalid(format!(
                    "{name} must be in 1..=86400000"
                )));
            }
        }
        let t = &self.tenant;
        if t.requests_per_second == 0 || t.burst == 0 || t.max_concurrent == 0 {
            return Err(SettingsError::Invalid(
                "tenant.requests_per_second, tenant.burst and tenant.max_concurrent must be at least 1".into(),
            ));
        }
        for key in &self.auth.api_keys {
            if AccessLevelName::parse(&key.trust).is_none() {
                return Err(SettingsError::Invalid(format!(
                    "auth.api_keys: trust {:?} must be public, internal, confidential or sensitive",
                    key.trust
                )));
            }
        }
        Ok(())
    }

    /// `home` joined to a relative path; absolute paths pass through.
    pub fn home_path(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.home.join(p)
        }
    }
}

/// Parsing of trust-level names, shared by config and identity.
pub struct AccessLevelName;

impl AccessLevelName {
    pub fn parse(s: &str) -> Option<i16> {
        match s.to_ascii_lowercase().as_str() {
            "public" | "1" => Some(1),
            "internal" | "2" => Some(2),
            "confidential" | "3" => Some(3),
            "sensitive" | "4" => Some(4),
            _ => None,
        }
    }
}

/// Env values are typed like TOML literals when they parse as such
/// (numbers, booleans, arrays), else taken as strings.
fn parse_env_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match doc.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.into())),
        Err(_) => toml::Value::String(raw.into()),
    }
}

/// Lays `over` onto `base`, section by section: a key `over` sets
/// replaces the same key in `base`, and the rest of `base` stays.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

fn set_path(root: &mut toml::Table, parts: &[String], value: toml::Value) -> Result<(), String> {
    let (last, dirs) = parts.split_last().ok_or("empty key")?;
    let mut cur = root;
    for d in dirs {
        let next = cur
            .entry(d.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = match next {
            toml::Value::Table(t) => t,
            _ => return Err(format!("{d} is not a section")),
        };
    }
    cur.insert(last.clone(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn one_field_of_a_section_without_serde_defaults_can_be_set() {
        let s = Settings::from_sources(
            Some((
                Path::new("x.toml"),
                "[pipeline.weights.multi_hop]\nvector = 0.5\n",
            )),
            &env(&[("ENGRAM__PIPELINE__WEIGHTS__SIMPLE__RRF_K", "5")]),
        )
        .expect("partial route weights");
        let w = &s.pipeline.weights;
        assert_eq!(w.simple.rrf_k_opt, Some(5.0));
        assert_eq!(w.simple.vector, FusionWeights::default().simple.vector);
        assert_eq!(w.multi_hop.vector, 0.5);
        assert_eq!(w.multi_hop.graph, FusionWeights::default().multi_hop.graph);
    }

    #[test]
    fn defaults_work_without_file() {
        let s = Settings::from_sources(None, &[]).expect("defaults");
        assert_eq!(s.listen.retrieval, "127.0.0.1:50051");
        assert_eq!(s.pipeline.ceiling_ms, 3000);
    }

    #[test]
    fn env_overrides_file() {
        let file = "[pipeline]\nrrf_k = 10.0\n[graph]\ndamping = 0.85\n";
        let s = Settings::from_sources(
            Some((Path::new("x.toml"), file)),
            &env(&[
                ("ENGRAM__PIPELINE__RRF_K", "30"),
                ("ENGRAM__LISTEN__ADMIN", "0.0.0.0:1"),
            ]),
        )
        .expect("settings");
        assert_eq!(s.pipeline.rrf_k, 30.0);
        assert_eq!(s.graph.damping, 0.85);
        assert_eq!(s.listen.admin, "0.0.0.0:1");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err =
            Settings::from_sources(Some((Path::new("x.toml"), "[pipeline]\nrrfk = 1\n")), &[])
                .expect_err("unknown key");
        assert!(err.to_string().contains("rrfk"), "{err}");
        let err = Settings::from_sources(None, &env(&[("ENGRAM__NOPE", "1")])).expect_err("env");
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn database_url_env_is_read() {
        let s = Settings::from_sources(None, &env(&[("DATABASE_URL", "postgres://x/y")]))
            .expect("settings");
        assert_eq!(s.database.url_opt.as_deref(), Some("postgres://x/y"));
    }

    #[test]
    fn keyword_candidates_out_of_range_names_the_key() {
        for bad in ["0", "100001"] {
            let err =
                Settings::from_sources(None, &env(&[("ENGRAM__SEARCH__KEYWORD_CANDIDATES", bad)]))
                    .expect_err("out of range");
            assert!(
                err.to_string().contains("search.keyword_candidates"),
                "{err}"
            );
        }
    }

    #[test]
    fn the_second_hop_is_bounded_by_its_settings() {
        for (key, bad) in [
            ("ENGRAM__PIPELINE__COMPLEMENT__HOP_NAMES", "33"),
            ("ENGRAM__PIPELINE__COMPLEMENT__HOP_DEPTH", "0"),
            ("ENGRAM__PIPELINE__COMPLEMENT__HOP_DEPTH", "11"),
        ] {
            let err = Settings::from_sources(None, &env(&[(key, bad)])).expect_err("out of range");
            assert!(err.to_string().contains("hop_depth"), "{key}={bad}: {err}");
        }
        let off = Settings::from_sources(
            None,
            &env(&[("ENGRAM__PIPELINE__COMPLEMENT__HOP_NAMES", "0")]),
        )
        .expect("0 names turns it off");
        assert_eq!(off.pipeline.complement.hop_names, 0);
    }

    #[test]
    fn connection_timeouts_are_bounded_and_named() {
        for key in [
            "HEADER_READ_TIMEOUT_MS",
            "IDLE_TIMEOUT_MS",
            "HTTP2_KEEPALIVE_INTERVAL_MS",
            "HTTP2_KEEPALIVE_TIMEOUT_MS",
        ] {
            let var = format!("ENGRAM__LISTEN__{key}");
            let err = Settings::from_sources(None, &env(&[(&var, "0")])).expect_err("0");
            let name = format!("listen.{}", key.to_ascii_lowercase());
            assert!(err.to_string().contains(&name), "{var}: {err}");
        }
        let s = Settings::from_sources(
            None,
            &env(&[("ENGRAM__LISTEN__HEADER_READ_TIMEOUT_MS", "200")]),
        )
        .expect("200 ms");
        assert_eq!(s.listen.header_read_timeout_ms, 200);
    }

    #[test]
    fn weak_or_placeholder_secrets_are_refused() {
        let load = |k: &str, v: &str| Settings::from_sources(None, &env(&[(k, v)]));
        let token = "ENGRAM__AUTH__INTERNAL_TOKEN_OPT";
        for bad in ["short", "change-me-to-a-long-random-string"] {
            let err = load(token, bad).expect_err(bad);
            assert!(err.to_string().contains("auth.internal_token_opt"), "{err}");
        }
        load(token, &"x".repeat(32)).expect("32 bytes");
        let secret = "ENGRAM__AUTH__JWT_HS256_SECRET_OPT";
        let err = load(secret, "s3cret").expect_err("short jwt secret");
        assert!(
            err.to_string().contains("auth.jwt_hs256_secret_opt"),
            "{err}"
        );
        load(secret, &"y".repeat(40)).expect("40 bytes");
    }
}
