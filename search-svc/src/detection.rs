//! When update detection runs: after the write is acknowledged, on one
//! background worker fed by a bounded queue (`search.update_detection_queue`
//! jobs), so a write's latency and a writer's throughput do not pay for the
//! candidate query and the judging. When the queue is full the write runs
//! its own detection before it is acknowledged: a flood of writes slows the
//! writer that sends it instead of growing memory or dropping detection.
//! A queue of 0 always detects before the acknowledgement (the edge exists
//! when the write returns).
//!
//! The queue is shared by tenants: one tenant's flood of facts can delay
//! another's edges by at most the queue's length of jobs (each one bounded
//! candidate query, milliseconds), and makes the other's writes run their
//! own detection while it lasts; it cannot drop them or slow them further.
//!
//! Best effort like detection itself: a job still queued when the process
//! dies is not run (the memories are written; only the edge is missed, and
//! the next write of an update to the same slot is judged again).

use engram_common::Identity;
use sqlx::PgPool;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::updates::{self, Policy};

/// The memories one write created (or rewrote) that detection judges.
#[derive(Debug)]
struct Job {
    identity: Identity,
    created: Vec<Uuid>,
}

/// The handle writes submit to; cheap to clone.
#[derive(Debug, Clone)]
pub struct Detector {
    pool: PgPool,
    policy: Policy,
    queue_opt: Option<mpsc::Sender<Job>>,
}

impl Detector {
    /// Spawns the worker when detection is on and `queue` > 0; must run
    /// inside a tokio runtime then.
    pub fn new(pool: PgPool, policy: Policy, queue: usize) -> Self {
        let queue_opt = (policy.enabled && queue > 0).then(|| {
            let (tx, rx) = mpsc::channel(queue);
            tokio::spawn(work(pool.clone(), policy.clone(), rx));
            tx
        });
        Self {
            pool,
            policy,
            queue_opt,
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Judges `created` (ids of `identity`'s committed write): queued when
    /// there is room, else now.
    pub async fn submit(&self, identity: &Identity, created: Vec<Uuid>) {
        if !self.policy.enabled || created.is_empty() {
            return;
        }
        let job = Job {
            identity: identity.clone(),
            created,
        };
        let job = match &self.queue_opt {
            Some(tx) => match tx.try_send(job) {
                Ok(()) => return,
                Err(
                    mpsc::error::TrySendError::Full(job) | mpsc::error::TrySendError::Closed(job),
                ) => job,
            },
            None => job,
        };
        run(&self.pool, &self.policy, job).await;
    }
}

async fn work(pool: PgPool, policy: Policy, mut rx: mpsc::Receiver<Job>) {
    while let Some(job) = rx.recv().await {
        run(&pool, &policy, job).await;
    }
}

async fn run(pool: &PgPool, policy: &Policy, job: Job) {
    let Job { identity, created } = job;
    if let Err(e) = updates::detect(pool, &identity, &created, policy).await {
        tracing::warn!(tenant = %identity.tenant, error = %e, "update detection skipped");
    }
}
