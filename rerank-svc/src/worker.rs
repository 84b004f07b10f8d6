//! The cross-encoder's own thread, at a lower CPU priority than everything
//! else in the process.
//!
//! Why: at 8 queries in flight with the cross-encoder on, its ONNX work took
//! the cores that search needed, and dense search timed out in 307 of 2,000
//! answers (issue 22): one stage's load broke another. Scoring on tokio's
//! blocking pool ran at the same priority as search-svc's embedding and the
//! gateway. Here the model is loaded *and* run on one dedicated thread that
//! first lowers its own priority (`nice` [`NICE`]); ONNX Runtime's intra-op
//! threads are created by that thread when the session is built, so they
//! inherit it. The kernel then gives the cores to search first, and when the
//! cross-encoder cannot finish within the gateway's rerank budget the answer
//! is degraded (rerank) instead of search timing out. How many requests may
//! wait is the bulkhead's (service.rs); whether one can still finish before
//! its deadline, and how much of it is scored (a head under load), is the
//! backlog's (backlog.rs), checked when it is queued and, for the
//! deadline, again when its turn comes.
//!
//! One thread is enough: the session runs one request at a time.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

use engram_models::CrossEncoder;
use tokio::sync::oneshot;

use crate::backlog::{Admitted, Backlog};
use crate::error::{Error, Result};

/// Added to the thread's nice value: 10 gives it about a tenth of the CPU
/// weight of a default thread when both want the same core.
pub const NICE: i32 = 10;

/// One scoring request and where its answer goes.
struct Job {
    query: String,
    candidates: Vec<String>,
    max_length: usize,
    /// When the caller stops waiting (its `grpc-timeout`), if it said;
    /// None also for a request that was first in line (backlog.rs).
    deadline_opt: Option<Instant>,
    /// Dropped after the model is done, so the bulkhead counts real work.
    permit: tokio::sync::OwnedSemaphorePermit,
    reply: oneshot::Sender<Result<Vec<f32>>>,
}

/// Handle to the model thread; cheap to clone.
#[derive(Clone)]
pub struct ModelThread {
    tx: mpsc::Sender<Job>,
    backlog: Arc<Backlog>,
}

impl ModelThread {
    /// Starts the thread, runs `load` on it (after lowering its priority)
    /// and returns once the model is loaded or failed to. `backlog` is its
    /// admission (with the queue target from the settings).
    pub async fn start<F>(load: F, backlog: Backlog) -> std::result::Result<Self, Error>
    where
        F: FnOnce() -> std::result::Result<CrossEncoder, Error> + Send + 'static,
    {
        Self::start_with(move || load().map(Arc::new), backlog).await
    }

    /// Like [`ModelThread::start`] for a model loaded elsewhere (tests):
    /// only the scoring runs at the lower priority then.
    pub async fn start_with<F>(load: F, backlog: Backlog) -> std::result::Result<Self, Error>
    where
        F: FnOnce() -> std::result::Result<Arc<CrossEncoder>, Error> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = oneshot::channel();
        let backlog = Arc::new(backlog);
        let thread_backlog = backlog.clone();
        std::thread::Builder::new()
            .name("rerank-model".into())
            .spawn(move || {
                lower_priority();
                match load() {
                    Ok(model) => {
                        let _ = ready_tx.send(Ok(()));
                        serve(&model, &rx, &thread_backlog);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| Error::Internal(format!("cannot start the model thread: {e}")))?;
        match ready_rx.await {
            Ok(Ok(())) => Ok(Self { tx, backlog }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Internal(
                "the model thread stopped while loading".into(),
            )),
        }
    }

    /// Scores on the model thread; `permit` is held until it is done. The
    /// scores are those of the candidates' head the backlog admitted (all
    /// of them unless under load). TooLate at once when not even a head
    /// would finish before `deadline_opt` behind the queue.
    pub async fn score(
        &self,
        (query, mut candidates, max_length): (String, Vec<String>, usize),
        deadline_opt: Option<Instant>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<Vec<f32>> {
        let Admitted {
            pairs,
            first: first_in_line,
        } = (self.backlog)
            .admit(candidates.len(), Instant::now(), deadline_opt)
            .map_err(Error::too_late)?;
        candidates.truncate(pairs);
        let (reply, answer) = oneshot::channel();
        let job = Job {
            query,
            candidates,
            max_length,
            deadline_opt: deadline_opt.filter(|_| !first_in_line),
            permit,
            reply,
        };
        if self.tx.send(job).is_err() {
            self.backlog.done(pairs, None);
            return Err(Error::Internal("the model thread is gone".into()));
        }
        answer
            .await
            .map_err(|_| Error::Internal("the model thread dropped a request".into()))?
    }
}

impl std::fmt::Debug for ModelThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelThread").finish_non_exhaustive()
    }
}

/// Runs jobs until every handle is dropped.
fn serve(model: &CrossEncoder, rx: &mpsc::Receiver<Job>, backlog: &Backlog) {
    while let Ok(job) = rx.recv() {
        let Job {
            query,
            mut candidates,
            max_length,
            deadline_opt,
            permit,
            reply,
        } = job;
        let pairs = candidates.len();
        // A caller that went away (its deadline passed) needs no answer,
        // and one whose deadline its own pairs would outlast gets none in
        // time: skipped before they take the CPU.
        if reply.is_closed() {
            backlog.done(pairs, None);
            continue;
        }
        let head = match backlog.still_in_time(pairs, Instant::now(), deadline_opt) {
            Ok(head) => head,
            Err(late) => {
                backlog.done(pairs, None);
                drop(permit);
                let _ = reply.send(Err(Error::too_late(late)));
                continue;
            }
        };
        if head < pairs {
            // Only the head still fits: the rest leaves the queue unscored.
            backlog.done(pairs - head, None);
            candidates.truncate(head);
        }
        let refs: Vec<&str> = candidates.iter().map(String::as_str).collect();
        let started = Instant::now();
        let r = model.score(&query, &refs, max_length).map_err(Error::from);
        backlog.done(head, r.is_ok().then(|| started.elapsed()));
        drop(permit);
        let _ = reply.send(r);
    }
}

/// Lowers this thread's priority; a failure only costs the isolation.
fn lower_priority() {
    match rustix::process::nice(NICE) {
        Ok(now) => tracing::debug!(nice = now, "cross-encoder thread runs at lower priority"),
        Err(e) => tracing::warn!(error = %e, "cannot lower the cross-encoder thread's priority"),
    }
}
