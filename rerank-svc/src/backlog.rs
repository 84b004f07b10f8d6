//! Admission by deadline: a request the model cannot finish before its
//! caller's deadline is refused at the door (or skipped when its turn
//! comes) instead of taking CPU for an answer nobody will read.
//!
//! Why: the bulkhead (service.rs) bounds how many requests wait, not how
//! long. At 8 queries in flight on two cores the queue held ~2 s of work
//! while the gateway waits 1.5 s for a rerank, so most queued requests were
//! scored after their caller had given up, and that scoring took the cores
//! search needed (issue 22). Here the model thread keeps a running
//! estimate of its cost per pair (an exponentially weighted mean of what
//! it measured) and the pairs queued ahead; a request whose estimated
//! finish is past its `grpc-timeout` gets RESOURCE_EXHAUSTED at once,
//! which the gateway reports as a skipped rerank (degraded), neutral to
//! its breaker. Until the first request is measured everything is admitted,
//! and so is a request with nothing queued ahead of it: it starts at once,
//! and it is how the estimate learns that load has passed (refused requests
//! teach nothing; without this rule one slow measurement under load would
//! refuse every later request, as it did in `engram bench`).
//!
//! Plain arithmetic on a mutex-guarded pair of numbers: no crate needed.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Weight of the newest measurement in the per-pair mean: about the last
/// ten requests count, so a load change shows within a second.
const ALPHA: f64 = 0.2;

#[derive(Debug, Default)]
pub struct Backlog {
    state: Mutex<State>,
}

#[derive(Debug, Default, Clone, Copy)]
struct State {
    /// Pairs admitted and not yet scored or skipped.
    queued_pairs: usize,
    /// Mean seconds per pair of the last measured requests; None until one
    /// was measured.
    per_pair_opt: Option<f64>,
}

/// Why a request was refused: what it would have needed and had.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Late {
    pub estimate: Duration,
    pub left: Duration,
}

impl Backlog {
    /// Admits `pairs` to the queue when they can be scored, behind what is
    /// queued, before `deadline_opt` (no deadline: always admitted), or
    /// when nothing is queued. Ok(true) for a request first in line: the
    /// model thread then scores it without a second check.
    pub fn admit(
        &self,
        pairs: usize,
        now: Instant,
        deadline_opt: Option<Instant>,
    ) -> Result<bool, Late> {
        let mut st = self.lock();
        let first = st.queued_pairs == 0;
        if let Some(deadline) = deadline_opt.filter(|_| !first) {
            check(estimate(&st, st.queued_pairs + pairs), now, deadline)?;
        }
        st.queued_pairs += pairs;
        Ok(first)
    }

    /// Whether `pairs` at the head of the queue can still finish before
    /// `deadline_opt`: the model thread's last check before scoring.
    pub fn still_in_time(
        &self,
        pairs: usize,
        now: Instant,
        deadline_opt: Option<Instant>,
    ) -> Result<(), Late> {
        let st = self.lock();
        match deadline_opt {
            Some(deadline) => check(estimate(&st, pairs), now, deadline),
            None => Ok(()),
        }
    }

    /// `pairs` left the queue; `elapsed` is what scoring them took, when
    /// they were scored (a skipped request teaches nothing).
    pub fn done(&self, pairs: usize, elapsed_opt: Option<Duration>) {
        let mut st = self.lock();
        st.queued_pairs = st.queued_pairs.saturating_sub(pairs);
        if let Some(elapsed) = elapsed_opt.filter(|_| pairs > 0) {
            let sample = elapsed.as_secs_f64() / pairs as f64;
            st.per_pair_opt = Some(match st.per_pair_opt {
                Some(mean) => mean + ALPHA * (sample - mean),
                None => sample,
            });
        }
    }

    /// Pairs queued now (for tests and logs).
    pub fn queued_pairs(&self) -> usize {
        self.lock().queued_pairs
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is two numbers updated in one statement each: a panic
        // elsewhere cannot leave it half-written, so a poisoned lock is safe.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn estimate(st: &State, pairs: usize) -> Option<Duration> {
    let per_pair = st.per_pair_opt?;
    Duration::try_from_secs_f64(per_pair * pairs as f64).ok()
}

fn check(estimate_opt: Option<Duration>, now: Instant, deadline: Instant) -> Result<(), Late> {
    let left = deadline.saturating_duration_since(now);
    match estimate_opt {
        Some(estimate) if estimate > left => Err(Late { estimate, left }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn everything_is_admitted_until_a_request_was_measured() {
        let b = Backlog::default();
        let now = Instant::now();
        assert!(b.admit(200, now, Some(now + MS)).is_ok());
        assert_eq!(b.queued_pairs(), 200);
    }

    #[test]
    fn a_request_that_would_finish_late_is_refused_and_not_queued() {
        let b = Backlog::default();
        let now = Instant::now();
        b.done(0, None);
        // 10 pairs in 200 ms: 20 ms a pair.
        b.admit(10, now, None).expect("no deadline");
        b.done(10, Some(200 * MS));
        // First in line: admitted whatever the estimate says.
        assert_eq!(b.admit(100, now, Some(now + MS)), Ok(true));
        b.done(100, None);
        assert_eq!(b.admit(30, now, None), Ok(true));
        assert_eq!(
            b.admit(10, now, Some(now + 1000 * MS)),
            Ok(false),
            "800 ms of work in 1 s"
        );
        let late = b
            .admit(20, now, Some(now + 1000 * MS))
            .expect_err("60 pairs = 1.2 s");
        assert_eq!(late.left, 1000 * MS);
        assert!((late.estimate.as_secs_f64() - 1.2).abs() < 1e-6);
        assert_eq!(b.queued_pairs(), 40, "the refused pairs are not counted");
        b.admit(5, now, None).expect("no deadline, no refusal");
    }

    #[test]
    fn the_head_of_the_queue_is_judged_on_its_own_pairs() {
        let b = Backlog::default();
        let now = Instant::now();
        b.admit(10, now, None).expect("admitted");
        b.done(10, Some(100 * MS));
        assert!(b.still_in_time(10, now, Some(now + 150 * MS)).is_ok());
        assert!(b.still_in_time(20, now, Some(now + 150 * MS)).is_err());
        assert!(b.still_in_time(20, now, Some(now)).is_err());
        assert!(b.still_in_time(20, now, None).is_ok());
    }

    #[test]
    fn the_mean_follows_the_load() {
        let b = Backlog::default();
        b.done(10, Some(100 * MS));
        for _ in 0..30 {
            b.done(10, Some(400 * MS));
        }
        let now = Instant::now();
        b.admit(1, now, None).expect("something queued ahead");
        // Close to 40 ms a pair now: 1 + 10 pairs no longer fit 300 ms.
        assert!(b.admit(10, now, Some(now + 300 * MS)).is_err());
        assert_eq!(b.admit(10, now, Some(now + 450 * MS)), Ok(false));
    }

    #[test]
    fn a_slow_estimate_never_locks_the_model_out() {
        let b = Backlog::default();
        // Measured under heavy load: 1 s a pair.
        b.done(10, Some(10_000 * MS));
        let now = Instant::now();
        // Nothing queued: admitted and first in line, so it is measured
        // and the estimate can learn that the load has passed.
        assert_eq!(b.admit(10, now, Some(now + 300 * MS)), Ok(true));
        // Behind it, the slow estimate still refuses.
        assert!(b.admit(10, now, Some(now + 300 * MS)).is_err());
        b.done(20, None);
        // Each request first in line is measured, fast now: the mean comes
        // back down and requests behind others are admitted again.
        for _ in 0..30 {
            assert_eq!(b.admit(10, now, Some(now + 300 * MS)), Ok(true));
            b.done(10, Some(100 * MS));
        }
        b.admit(1, now, None).expect("queued ahead");
        assert_eq!(b.admit(10, now, Some(now + 300 * MS)), Ok(false));
    }

    #[test]
    fn done_never_underflows() {
        let b = Backlog::default();
        b.done(5, None);
        assert_eq!(b.queued_pairs(), 0);
    }
}
