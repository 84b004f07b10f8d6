//! search-svc: the Postgres side of engram. Memory writes (idempotent
//! upserts, version chains, entities, edges, feedback), embeddings, dense
//! search (pgvector HNSW) and keyword search (full-text, OR semantics).
//! Internal: every call must carry the internal token and the caller's
//! identity, and every read predicate carries tenant and trust level.
//! Each query kind has its own statement_timeout and the requests in flight
//! are capped (`bounds.rs`); the decay job keeps `decay_score` (`decay.rs`).
//! Beside it, `ListingService` pages through a tenant's memories (`list.rs`)
//! and `ConflictService` reviews the updates detected at write time
//! (`conflicts.rs`); `GatewayStateService` keeps what gateway replicas share
//! (`gateway_state.rs`).

pub mod bounds;
pub mod changes;
pub mod conflicts;
pub mod decay;
pub mod dense;
pub mod detection;
pub mod embed;
pub mod error;
pub mod facts;
pub mod filters;
pub mod gateway_state;
pub mod get;
pub mod keyword;
pub mod keyword_index;
pub mod list;
pub mod rows;
pub mod speakers;
pub mod turns;
pub mod updates;
pub mod validate;
pub mod values;
pub mod writes;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use engram_common::identity::read_write_id;
use engram_common::server::{ServingStatus, health};
use engram_common::{Identity, Settings};
use engram_proto as pb;
use engram_proto::conflict_service_server::ConflictServiceServer;
use engram_proto::gateway_state_service_server::GatewayStateServiceServer;
use engram_proto::listing_service_server::ListingServiceServer;
use engram_proto::search_service_server::{SearchService, SearchServiceServer};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

pub use bounds::{Admission, Timeouts};
pub use embed::Embeddings;
pub use error::Error;
pub use keyword::Scoring;

use validate::{
    DeleteIds, EdgeBatch, EdgeKeys, EmbedTexts, FeedbackBatch, GetQuery, KeywordQuery,
    SearchFilters, UpsertBatch, VectorQuery,
};

pub const SERVICE_NAME: &str = "engram.v1.SearchService";

/// The gRPC service; cheap to clone.
#[derive(Clone, Debug)]
pub struct SearchSvc {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    /// The query path's reads, bounded without a transaction (bounds.rs).
    readers: bounds::Readers,
    embeddings: Embeddings,
    internal_token_opt: Option<String>,
    scoring: Scoring,
    keyword_candidates: u32,
    decay_floor: f32,
    fact_index: bool,
    dense_speakers_first_person: bool,
    timeouts: Timeouts,
    admission: Admission,
    serve_opts: engram_common::server::ServeOptions,
    feed: changes::Feed,
    keyword_index: keyword_index::KeywordIndex,
    detector: detection::Detector,
    /// The database watcher's last verdict (serve_svc); writes consult it
    /// so they fail fast while Postgres is gone.
    db_up: Arc<AtomicBool>,
}

/// How long a write waits to learn that a database the watcher saw down is
/// back, before it is refused: without this check a write waits the pool's
/// whole acquire timeout (10 s) during an outage, holding its caller and
/// the gateway's write slots.
const WRITE_DB_PROBE: Duration = Duration::from_millis(750);

impl SearchSvc {
    pub fn new(settings: &Settings, pool: PgPool, embeddings: Embeddings) -> anyhow::Result<Self> {
        let scoring = Scoring::parse(&settings.search.keyword_scoring).ok_or_else(|| {
            anyhow::anyhow!(
                "search.keyword_scoring must be ts_rank_cd or bm25, got {:?}",
                settings.search.keyword_scoring
            )
        })?;
        let detector = detection::Detector::new(
            pool.clone(),
            updates::Policy {
                enabled: settings.search.update_detection,
                threshold: settings.search.update_threshold,
                types: settings.search.update_types.clone(),
                auto_supersede: settings.search.update_auto_supersede,
                timeout_ms: settings.search.statement_timeout_write_ms,
            },
            settings.search.update_detection_queue,
        );
        Ok(Self {
            inner: Arc::new(Inner {
                feed: changes::Feed::new(pool.clone()),
                keyword_index: keyword_index::KeywordIndex::new(&settings.search, pool.clone()),
                db_up: Arc::new(AtomicBool::new(true)),
                readers: bounds::Readers::new(&pool, settings.search.statement_timeout_dense_ms),
                pool,
                embeddings,
                internal_token_opt: settings.auth.internal_token_opt.clone(),
                scoring,
                keyword_candidates: settings.search.keyword_candidates,
                decay_floor: settings.search.decay_floor,
                fact_index: settings.search.fact_index,
                dense_speakers_first_person: settings.search.dense_speakers_first_person,
                timeouts: Timeouts::from_settings(&settings.search),
                admission: Admission::new(settings.search.max_concurrent_requests),
                serve_opts: engram_common::server::ServeOptions::internal(settings)?,
                detector,
            }),
        })
    }

    /// The vector a dense query searches with, and the one to hand back to
    /// the gateway for its semantic cache: none when speaker names were
    /// rewritten, since "…Caroline…" and "…Melanie…" then embed alike and
    /// must not share a cached answer.
    async fn query_embedding(
        &self,
        identity: &Identity,
        filters: &SearchFilters,
        text: String,
    ) -> Result<(Vec<f32>, Vec<f32>), Status> {
        let rewritten_opt = match self.inner.dense_speakers_first_person {
            true => speakers::dense_text(
                &self.inner.readers,
                identity,
                filters,
                &text,
                self.inner.decay_floor,
                self.inner.timeouts.dense_ms,
            )
            .await
            .map_err(Status::from)?,
            false => None,
        };
        let rewritten = rewritten_opt.is_some();
        let e = (self.inner.embeddings)
            .embed_query(&identity.tenant, rewritten_opt.unwrap_or(text))
            .await?;
        match rewritten {
            true => Ok((e, Vec::new())),
            false => Ok((e.clone(), e)),
        }
    }

    pub fn keyword_index(&self) -> &keyword_index::KeywordIndex {
        &self.inner.keyword_index
    }

    pub fn embeddings(&self) -> &Embeddings {
        &self.inner.embeddings
    }

    fn identity<T>(&self, req: &Request<T>) -> Result<Identity, Status> {
        Ok(Identity::read_internal(
            req.metadata(),
            self.inner.internal_token_opt.as_deref(),
        )?)
    }

    /// Every handler's opening: a request slot (refused at once when all
    /// are taken), the caller from the internal metadata, then the message
    /// validated by its `TryFrom` at the boundary. The handler keeps the
    /// slot until it returns.
    fn open<T, U>(&self, req: Request<T>) -> Result<(bounds::Slot, Identity, U), Status>
    where
        U: TryFrom<T, Error = Error>,
    {
        let slot = self.inner.admission.admit()?;
        let identity = self.identity(&req)?;
        let msg = U::try_from(req.into_inner())?;
        Ok((slot, identity, msg))
    }

    /// A write's error, noted: a write that could not reach Postgres marks
    /// it down at once, so the writes after it are refused by
    /// [`Self::writable`]'s short probe instead of each waiting for a
    /// connection until the watcher's next check.
    fn noted(&self, e: Error) -> Error {
        if matches!(
            e,
            Error::Unavailable(_) | Error::Database(sqlx::Error::PoolTimedOut | sqlx::Error::Io(_))
        ) {
            self.inner.db_up.store(false, Ordering::Relaxed);
        }
        e
    }

    /// A write's opening after [`Self::open`]: refused at once with
    /// UNAVAILABLE (never acknowledged, so nothing is lost; the caller
    /// retries) while the database watcher sees Postgres unreachable and a
    /// short probe agrees. A probe that succeeds marks it back up, so a
    /// recovery is noticed by the first write, not the next watcher tick.
    async fn writable(&self) -> Result<(), Status> {
        if self.inner.db_up.load(Ordering::Relaxed) {
            return Ok(());
        }
        let probe = sqlx::query("SELECT 1").execute(&self.inner.pool);
        match tokio::time::timeout(WRITE_DB_PROBE, probe).await {
            Ok(Ok(_)) => {
                self.inner.db_up.store(true, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(Status::unavailable(
                "database unreachable: the write was not applied; retry it",
            )),
        }
    }

    /// Keyword search with an explicit scoring (the eval compares both).
    pub async fn keyword_search_with(
        &self,
        identity: &Identity,
        q: KeywordQuery,
        scoring: Scoring,
    ) -> Result<pb::SearchResponse, Error> {
        let found = keyword::search(
            &self.inner.readers,
            &self.inner.keyword_index,
            identity,
            &q.text,
            &q.filters,
            q.k,
            keyword::Ranking {
                scoring,
                candidates: self.inner.keyword_candidates,
                default_decay_floor: self.inner.decay_floor,
                timeout_ms: self.inner.timeouts.keyword_ms,
            },
        )
        .await?;
        Ok(pb::SearchResponse {
            hits: rows::hits(found.rows),
            from_keyword_index: found.from_index,
            ..Default::default()
        })
    }
}

fn fact_hit(f: facts::Fact) -> pb::FactHit {
    pb::FactHit {
        memory_id: f.memory_id.to_string(),
        text: f.text,
        score: f.score,
    }
}

#[tonic::async_trait]
impl SearchService for SearchSvc {
    type WatchChangesStream = changes::ChangeStream;

    /// Internal token only: the feed carries tenant ids, never content, and
    /// serves every gateway replica alike.
    async fn watch_changes(
        &self,
        req: Request<pb::WatchChangesRequest>,
    ) -> Result<Response<Self::WatchChangesStream>, Status> {
        Identity::check_internal_token(req.metadata(), self.inner.internal_token_opt.as_deref())?;
        Ok(Response::new(self.inner.feed.stream()))
    }

    async fn upsert(
        &self,
        req: Request<pb::UpsertRequest>,
    ) -> Result<Response<pb::UpsertResponse>, Status> {
        let write_id = read_write_id(req.metadata());
        let (_slot, identity, batch) = self.open::<_, UpsertBatch>(req)?;
        self.writable().await?;
        let (pool, timeout_ms) = (&self.inner.pool, self.inner.timeouts.write_ms);
        // Only short facts of the judged types can update another memory:
        // passages and turns cost detection nothing, not even its query.
        let detector = &self.inner.detector;
        let judged: std::collections::HashSet<uuid::Uuid> = (batch.0.iter())
            .filter(|m| (detector.policy()).judges(&m.memory_type, &m.title, &m.content))
            .map(|m| m.id)
            .collect();
        let results = writes::upsert(
            pool,
            &self.inner.embeddings,
            (&identity, &write_id),
            batch,
            timeout_ms,
            self.inner.fact_index,
        )
        .await
        .map_err(|e| self.noted(e))
        // Whether a failed write committed is unknown: the keyword index
        // then takes the whole tenant as changed.
        .inspect_err(|_| self.inner.keyword_index.changed(&identity.tenant, None))?;
        let written: Vec<uuid::Uuid> = results.iter().filter_map(|r| r.id.parse().ok()).collect();
        (self.inner.keyword_index).changed(&identity.tenant, Some(&written));
        // After the commit: the write is acknowledged whatever detection does
        // (queued, or run here when the queue is full: detection.rs).
        // New memories and rewrites (their embedding was recomputed: the
        // content changed) are judged; a rewrite may now update another.
        let created: Vec<uuid::Uuid> = (results.iter())
            .filter(|r| r.created || r.embedded)
            .filter_map(|r| r.id.parse().ok())
            .filter(|id| judged.contains(id))
            .collect();
        detector.submit(&identity, created).await;
        Ok(Response::new(pb::UpsertResponse { results }))
    }

    async fn delete(
        &self,
        req: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let write_id = read_write_id(req.metadata());
        let (_slot, identity, ids) = self.open::<_, DeleteIds>(req)?;
        self.writable().await?;
        let timeout_ms = self.inner.timeouts.write_ms;
        let asked = ids.0.clone();
        let deleted = writes::delete(&self.inner.pool, (&identity, &write_id), ids, timeout_ms)
            .await
            .map_err(|e| self.noted(e))
            .inspect_err(|_| self.inner.keyword_index.changed(&identity.tenant, None))?;
        if deleted > 0 {
            (self.inner.keyword_index).changed(&identity.tenant, Some(&asked));
        }
        Ok(Response::new(pb::DeleteResponse { deleted }))
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        let (_slot, identity, q) = self.open::<_, GetQuery>(req)?;
        let timeout_ms = self.inner.timeouts.get_ms;
        let memories = get::get(&self.inner.readers, &identity, q, timeout_ms).await?;
        Ok(Response::new(pb::GetResponse { memories }))
    }

    async fn add_edges(
        &self,
        req: Request<pb::AddEdgesRequest>,
    ) -> Result<Response<pb::AddEdgesResponse>, Status> {
        let write_id = read_write_id(req.metadata());
        let (_slot, identity, batch) = self.open::<_, EdgeBatch>(req)?;
        self.writable().await?;
        let timeout_ms = self.inner.timeouts.write_ms;
        let added = writes::add_edges(&self.inner.pool, (&identity, &write_id), batch, timeout_ms)
            .await
            .map_err(|e| self.noted(e))?;
        Ok(Response::new(pb::AddEdgesResponse { added }))
    }

    async fn delete_edges(
        &self,
        req: Request<pb::DeleteEdgesRequest>,
    ) -> Result<Response<pb::DeleteEdgesResponse>, Status> {
        let write_id = read_write_id(req.metadata());
        let (_slot, identity, keys) = self.open::<_, EdgeKeys>(req)?;
        self.writable().await?;
        let timeout_ms = self.inner.timeouts.write_ms;
        let deleted =
            writes::delete_edges(&self.inner.pool, (&identity, &write_id), keys, timeout_ms)
                .await
                .map_err(|e| self.noted(e))?;
        Ok(Response::new(pb::DeleteEdgesResponse { deleted }))
    }

    async fn vector_search(
        &self,
        req: Request<pb::VectorSearchRequest>,
    ) -> Result<Response<pb::SearchResponse>, Status> {
        let (_slot, identity, q) = self.open::<_, VectorQuery>(req)?;
        let (embedding, query_embedding) = match q.embedding_opt {
            Some(v) => (v, Vec::new()),
            None => self.query_embedding(&identity, &q.filters, q.text).await?,
        };
        let rows = dense::search(
            &self.inner.readers,
            &identity,
            &embedding,
            &q.filters,
            q.k,
            self.inner.decay_floor,
            self.inner.timeouts.dense_ms,
        )
        .await
        .map_err(Status::from)?;
        let facts = match q.fact_k {
            0 => Vec::new(),
            k => facts::search(
                &self.inner.pool,
                &identity,
                &embedding,
                &q.filters,
                k,
                self.inner.decay_floor,
                self.inner.timeouts.dense_ms,
            )
            .await
            .map_err(Status::from)?,
        };
        Ok(Response::new(pb::SearchResponse {
            hits: rows::hits(rows),
            query_embedding,
            facts: facts.into_iter().map(fact_hit).collect(),
            from_keyword_index: false,
        }))
    }

    async fn keyword_search(
        &self,
        req: Request<pb::KeywordSearchRequest>,
    ) -> Result<Response<pb::SearchResponse>, Status> {
        let (_slot, identity, q) = self.open::<_, KeywordQuery>(req)?;
        let response = self
            .keyword_search_with(&identity, q, self.inner.scoring)
            .await?;
        Ok(Response::new(response))
    }

    async fn embed(
        &self,
        req: Request<pb::EmbedRequest>,
    ) -> Result<Response<pb::EmbedResponse>, Status> {
        let (_slot, identity, texts) = self.open::<_, EmbedTexts>(req)?;
        let embeddings = &self.inner.embeddings;
        // One text is a query (the gateway's semantic cache, working
        // memory's recall); more are a write's batch.
        let vecs = match <[String; 1]>::try_from(texts.0) {
            Ok([one]) => vec![embeddings.embed_query(&identity.tenant, one).await?],
            Err(many) => embeddings.embed_batch(&identity.tenant, many).await?,
        };
        Ok(Response::new(pb::EmbedResponse {
            embeddings: vecs
                .into_iter()
                .map(|values| pb::Embedding { values })
                .collect(),
        }))
    }

    async fn store_feedback(
        &self,
        req: Request<pb::StoreFeedbackRequest>,
    ) -> Result<Response<pb::StoreFeedbackResponse>, Status> {
        let (_slot, identity, batch) = self.open::<_, FeedbackBatch>(req)?;
        self.writable().await?;
        let timeout_ms = self.inner.timeouts.write_ms;
        let stored = writes::store_feedback(&self.inner.pool, &identity, batch, timeout_ms)
            .await
            .map_err(|e| self.noted(e))?;
        Ok(Response::new(pb::StoreFeedbackResponse { stored }))
    }
}

/// Serves `svc` (plus health and reflection) on `listener` until `shutdown`.
/// Health reports NOT_SERVING for the service while the model is missing.
pub async fn serve_svc(
    listener: TcpListener,
    svc: SearchSvc,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (reporter, health_svc) = health();
    let model_ready = svc.embeddings().is_ready();
    let status = |ok: bool| match ok {
        true => ServingStatus::Serving,
        false => ServingStatus::NotServing,
    };
    reporter
        .set_service_status(SERVICE_NAME, status(model_ready))
        .await;
    // Listing and review need no model, only Postgres, which the watcher
    // follows.
    for name in [
        list::SERVICE_NAME,
        conflicts::SERVICE_NAME,
        gateway_state::SERVICE_NAME,
    ] {
        reporter
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    // SERVING needs both the model and Postgres; the watcher follows the
    // database for as long as the server runs.
    let db_up = svc.inner.db_up.clone();
    let watcher = tokio::spawn(engram_common::server::watch_database(
        svc.inner.pool.clone(),
        move |db_ok| {
            db_up.store(db_ok, Ordering::Relaxed);
            let reporter = reporter.clone();
            let serving = status(db_ok && model_ready);
            tokio::spawn(async move {
                reporter.set_service_status(SERVICE_NAME, serving).await;
                for name in [
                    list::SERVICE_NAME,
                    conflicts::SERVICE_NAME,
                    gateway_state::SERVICE_NAME,
                ] {
                    reporter.set_service_status(name, status(db_ok)).await;
                }
            });
        },
    ));
    let opts = svc.inner.serve_opts.clone();
    // The keyword index hears of every write, this process's or not, from
    // the same feed the gateways follow.
    let index = svc.inner.keyword_index.clone();
    let follower_opt = index
        .is_enabled()
        .then(|| tokio::spawn(index.follow(svc.inner.feed.stream())));
    let feed_stop = svc.inner.feed.stop_token();
    let shutdown = async move {
        shutdown.await;
        feed_stop.cancel();
    };
    let routes = Routes::new(SearchServiceServer::new(svc.clone()))
        .add_service(ListingServiceServer::new(svc.clone()))
        .add_service(ConflictServiceServer::new(svc.clone()))
        .add_service(GatewayStateServiceServer::new(svc));
    let result =
        engram_common::server::serve_with(listener, routes, health_svc, opts, shutdown).await;
    watcher.abort();
    if let Some(follower) = follower_opt {
        follower.abort();
    }
    result?;
    Ok(())
}

/// Loads the embedding model (a failure leaves the service up but
/// NOT_SERVING) and serves search-svc until `shutdown`, with the decay job
/// (`decay.rs`) running beside it and stopped before this returns, so the
/// caller may close the pool.
pub async fn run(
    listener: TcpListener,
    settings: Settings,
    pool: PgPool,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let s = settings.clone();
    let embeddings = tokio::task::spawn_blocking(move || Embeddings::load_blocking(&s)).await?;
    let job_opt = decay::Job::spawn(pool.clone(), &settings.search);
    let svc = SearchSvc::new(&settings, pool, embeddings)?;
    let readers = svc.inner.readers.clone();
    tracing::info!(addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "search-svc listening");
    let result = serve_svc(listener, svc, shutdown).await;
    if let Some(job) = job_opt {
        job.stop().await;
    }
    // The readers' pool is this service's own (the caller's pool is not).
    readers.close().await;
    result
}
