//! Admission by deadline and by queue target: a request the model cannot
//! finish before its caller's deadline is refused at the door (or skipped
//! when its turn comes) instead of taking CPU for an answer nobody will
//! read, and under load a request is cut to the head of its pairs that
//! fits.
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
//! its breaker. Under load a request whose whole list would finish late
//! but whose head of at least [`MIN_HEAD_PAIRS`] would not is admitted
//! with that head only: the gateway sends its candidates best first, an
//! agent reads the first few, and a reranked head is worth more to it than
//! no rerank at all. A request queued behind others is also cut to the
//! head that finishes within the queue target (`rerank.queue_target_ms`,
//! never below [`MIN_HEAD_PAIRS`]) even when its deadline would allow
//! more: under load a short rerank for every answer beats a long one for
//! a few. Deadline admission alone has two stable states (measured at 8
//! in flight, `engram bench`): a rerank the deadline skips frees the CPU
//! for more search, which makes the niced model slower still, so it either
//! skipped almost every answer or reranked all ten pairs of every answer at
//! 24 QPS; the target keeps every answer waiting for a short rerank, which
//! throttles search instead. A request with nothing queued ahead is never
//! cut, so one query at a time keeps its whole rerank.
//!
//! Until the first request is measured everything is admitted, and so is a
//! request with nothing queued ahead of it: it starts at once, and it is
//! how the estimate learns that load has passed (refused requests teach
//! nothing; without this rule one slow measurement under load would refuse
//! every later request, as it did in `engram bench`). Under load the mean
//! is learned mostly from heads of 3, whose fixed cost per run raises the
//! cost per pair, so cuts stay deep until a request finds the queue empty
//! and is measured whole. "Ahead" counts every pair admitted and not yet
//! done, including the request being scored and any whose caller left:
//! a cut can be a little deeper than needed, never shallower.
//!
//! Tenants: the queue is one FIFO for all of them, so one tenant's queued
//! pairs shorten another's head. How much one tenant can queue while
//! others are active is the gateway's rerank-slot share (retrieval-svc
//! pipeline/ctx.rs `Gates`, fair.rs): at the default one slot per core,
//! two active tenants hold one rerank request each, about ten pairs, which
//! cuts the other's head only when a pair costs more than the target over
//! twenty pairs (7.5 ms at 150 ms; 3.7 ms measured at one query at a time).
//!
//! Plain arithmetic on a mutex-guarded pair of numbers: no crate needed.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use engram_common::settings::RerankSettings;

/// Weight of the newest measurement in the per-pair mean: about the last
/// ten requests count, so a load change shows within a second.
const ALPHA: f64 = 0.2;

/// The fewest pairs a request is cut to under load; below it the request
/// is refused. Three (the proto's contract): what an agent reads first
/// (R@2, R@3).
pub const MIN_HEAD_PAIRS: usize = engram_proto::MIN_RERANK_HEAD;

/// The share of the time left a head is planned to take (see [`fitting`]).
const HEAD_SHARE_OF_TIME_LEFT: f64 = 0.9;

#[derive(Debug, Default)]
pub struct Backlog {
    state: Mutex<State>,
    /// How long the queue a request joins may take with it, when set.
    target_opt: Option<Duration>,
}

impl State {
    /// The measured cost per pair, once there is a usable one.
    fn per_pair(&self) -> Option<f64> {
        self.per_pair_opt.filter(|p| *p > 0.0)
    }
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

/// What the backlog let in of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// How many of its pairs, from the first: all, or under load a head.
    pub pairs: usize,
    /// Nothing was queued ahead: the model thread scores it without a
    /// second check.
    pub first: bool,
}

impl Backlog {
    /// A backlog that also cuts queued requests to the head finishing
    /// within `target_opt` (see the module doc).
    pub fn with_target(target_opt: Option<Duration>) -> Self {
        Self {
            state: Mutex::default(),
            target_opt: target_opt.filter(|t| !t.is_zero()),
        }
    }

    /// The backlog `rerank` settings ask for: a queue target of
    /// `queue_target_ms`, none at 0.
    pub fn from_settings(s: &RerankSettings) -> Self {
        Self::with_target(Some(Duration::from_millis(s.queue_target_ms)))
    }

    /// Admits `pairs` to the queue when they can be scored, behind what is
    /// queued, before `deadline_opt` (no deadline: always admitted), or
    /// when nothing is queued; under load, only the head that can (at
    /// least [`MIN_HEAD_PAIRS`]), and behind a queue only the head that
    /// finishes within the target.
    pub fn admit(
        &self,
        pairs: usize,
        now: Instant,
        deadline_opt: Option<Instant>,
    ) -> Result<Admitted, Late> {
        let mut st = self.lock();
        let first = st.queued_pairs == 0;
        let admitted = if first {
            pairs
        } else {
            let in_time = match deadline_opt {
                Some(deadline) => fitting(&st, st.queued_pairs, pairs, now, deadline)?,
                None => pairs,
            };
            within_target(&st, st.queued_pairs, in_time, self.target_opt)
        };
        st.queued_pairs += admitted;
        Ok(Admitted {
            pairs: admitted,
            first,
        })
    }

    /// How many of `pairs` at the head of the queue can still finish
    /// before `deadline_opt` (all, a head of at least [`MIN_HEAD_PAIRS`],
    /// or none): the model thread's last check before scoring.
    pub fn still_in_time(
        &self,
        pairs: usize,
        now: Instant,
        deadline_opt: Option<Instant>,
    ) -> Result<usize, Late> {
        let st = self.lock();
        match deadline_opt {
            Some(deadline) => fitting(&st, 0, pairs, now, deadline),
            None => Ok(pairs),
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

/// How many of `pairs`, behind `ahead` queued pairs, finish before
/// `deadline` at the estimated cost per pair: all of them, else the
/// longest head of at least [`MIN_HEAD_PAIRS`] (a request of fewer pairs
/// is never cut), else Late. Unmeasured: all.
fn fitting(
    st: &State,
    ahead: usize,
    pairs: usize,
    now: Instant,
    deadline: Instant,
) -> Result<usize, Late> {
    let Some(per_pair) = st.per_pair() else {
        return Ok(pairs);
    };
    let left = deadline.saturating_duration_since(now);
    let fits = |secs: f64| pairs_within(secs, per_pair, ahead);
    // A head is cut to finish with a tenth of the time to spare: the
    // estimate is a mean, and one just at the deadline would arrive after
    // the caller stopped waiting.
    let head = fits(left.as_secs_f64() * HEAD_SHARE_OF_TIME_LEFT).min(pairs);
    match fits(left.as_secs_f64()).min(pairs) {
        all if all == pairs => Ok(pairs),
        _ if head >= MIN_HEAD_PAIRS => Ok(head),
        _ => Err(Late {
            estimate: Duration::try_from_secs_f64(per_pair * (ahead + pairs) as f64)
                .unwrap_or(Duration::MAX),
            left,
        }),
    }
}

/// The head of `pairs` (already in time) that, behind `ahead` queued
/// pairs, finishes within `target_opt`, never cut below
/// [`MIN_HEAD_PAIRS`]; all of them without a target or an estimate.
fn within_target(st: &State, ahead: usize, pairs: usize, target_opt: Option<Duration>) -> usize {
    let (Some(target), Some(per_pair)) = (target_opt, st.per_pair()) else {
        return pairs;
    };
    let fits = pairs_within(target.as_secs_f64(), per_pair, ahead);
    pairs.min(fits.max(MIN_HEAD_PAIRS))
}

/// How many pairs finish in `secs` at `per_pair` seconds each behind
/// `ahead` queued ones. Float-to-integer `as` saturates (and maps NaN to
/// 0): a huge budget admits everything, an empty one nothing.
fn pairs_within(secs: f64, per_pair: f64, ahead: usize) -> usize {
    ((secs / per_pair).floor() as usize).saturating_sub(ahead)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn whole(pairs: usize, first: bool) -> Admitted {
        Admitted { pairs, first }
    }

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
        assert_eq!(b.admit(100, now, Some(now + MS)), Ok(whole(100, true)));
        b.done(100, None);
        assert_eq!(b.admit(30, now, None), Ok(whole(30, true)));
        assert_eq!(
            b.admit(10, now, Some(now + 1000 * MS)),
            Ok(whole(10, false)),
            "800 ms of work in 1 s"
        );
        assert_eq!(
            b.admit(20, now, Some(now + 1000 * MS)),
            Ok(whole(5, false)),
            "60 pairs would take 1.2 s: a head of 5 fits in 900 ms"
        );
        let late = b
            .admit(20, now, Some(now + 1000 * MS))
            .expect_err("behind 45 pairs not even a head of 3 fits");
        assert_eq!(late.left, 1000 * MS);
        assert!((late.estimate.as_secs_f64() - 1.3).abs() < 1e-6);
        assert_eq!(b.queued_pairs(), 45, "the refused pairs are not counted");
        b.admit(5, now, None).expect("no deadline, no refusal");
    }

    #[test]
    fn a_short_request_is_never_cut_below_its_whole() {
        let b = Backlog::default();
        let now = Instant::now();
        b.admit(10, now, None).expect("admitted");
        b.done(10, Some(200 * MS));
        b.admit(40, now, None).expect("queued ahead");
        // 45 pairs fit in 900 ms: 5 after the 40 queued.
        assert_eq!(
            b.admit(MIN_HEAD_PAIRS, now, Some(now + 900 * MS)),
            Ok(whole(MIN_HEAD_PAIRS, false))
        );
        // 43 queued now: 2 fit, fewer than a head.
        assert!(b.admit(MIN_HEAD_PAIRS, now, Some(now + 900 * MS)).is_err());
        assert!(b.admit(10, now, Some(now + 900 * MS)).is_err());
        assert_eq!(b.queued_pairs(), 43);
    }

    #[test]
    fn the_head_of_the_queue_is_judged_on_its_own_pairs() {
        let b = Backlog::default();
        let now = Instant::now();
        b.admit(10, now, None).expect("admitted");
        b.done(10, Some(100 * MS));
        assert_eq!(b.still_in_time(10, now, Some(now + 150 * MS)), Ok(10));
        assert_eq!(
            b.still_in_time(20, now, Some(now + 150 * MS)),
            Ok(13),
            "a head of 13 fits in 135 ms, a tenth of 150 to spare"
        );
        assert!(b.still_in_time(20, now, Some(now + 20 * MS)).is_err());
        assert!(b.still_in_time(20, now, Some(now)).is_err());
        assert_eq!(b.still_in_time(20, now, None), Ok(20));
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
        // Close to 40 ms a pair now: 1 + 10 pairs no longer fit 300 ms,
        // a head of 5 does in 270; 1 + 10 fit 450 ms.
        assert_eq!(b.admit(10, now, Some(now + 300 * MS)), Ok(whole(5, false)));
        b.done(5, None);
        assert_eq!(b.admit(10, now, Some(now + 450 * MS)), Ok(whole(10, false)));
    }

    #[test]
    fn a_slow_estimate_never_locks_the_model_out() {
        let b = Backlog::default();
        // Measured under heavy load: 1 s a pair.
        b.done(10, Some(10_000 * MS));
        let now = Instant::now();
        // Nothing queued: admitted and first in line, so it is measured
        // and the estimate can learn that the load has passed.
        assert_eq!(b.admit(10, now, Some(now + 300 * MS)), Ok(whole(10, true)));
        // Behind it, the slow estimate still refuses.
        assert!(b.admit(10, now, Some(now + 300 * MS)).is_err());
        b.done(20, None);
        // Each request first in line is measured, fast now: the mean comes
        // back down and requests behind others are admitted again.
        for _ in 0..30 {
            assert_eq!(b.admit(10, now, Some(now + 300 * MS)), Ok(whole(10, true)));
            b.done(10, Some(100 * MS));
        }
        b.admit(1, now, None).expect("queued ahead");
        assert_eq!(b.admit(10, now, Some(now + 300 * MS)), Ok(whole(10, false)));
    }

    #[test]
    fn behind_a_queue_a_request_gets_the_head_that_fits_the_target() {
        let b = Backlog::with_target(Some(200 * MS));
        let now = Instant::now();
        let far = Some(now + 10_000 * MS);
        // Measured: 10 ms a pair.
        b.admit(10, now, None).expect("admitted");
        b.done(10, Some(100 * MS));
        assert_eq!(
            b.admit(10, now, far),
            Ok(whole(10, true)),
            "nothing queued: the whole request, whatever the target"
        );
        assert_eq!(
            b.admit(10, now, far),
            Ok(whole(10, false)),
            "20 pairs fit 200 ms"
        );
        assert_eq!(
            b.admit(10, now, far),
            Ok(whole(MIN_HEAD_PAIRS, false)),
            "behind 20 pairs nothing fits the target: cut to the fewest"
        );
        assert_eq!(
            b.admit(2, now, far),
            Ok(whole(2, false)),
            "a request shorter than a head is never cut"
        );
        b.done(23, None);
        assert_eq!(
            b.admit(20, now, far),
            Ok(whole(18, false)),
            "behind 2 pairs, 18 fit"
        );
        // Behind 20 pairs: 3 more would take 230 ms. The target alone would
        // admit a head of 3; the deadline (235 ms, a head must fit in 9/10
        // of it) is checked first and refuses.
        assert!(
            b.admit(10, now, Some(now + 235 * MS)).is_err(),
            "the deadline is checked before the target"
        );
        assert_eq!(b.queued_pairs(), 20, "the refused pairs are not counted");
    }

    #[test]
    fn a_zero_target_is_no_target() {
        let b = Backlog::from_settings(&RerankSettings {
            queue_target_ms: 0,
            ..RerankSettings::default()
        });
        let now = Instant::now();
        b.admit(10, now, None).expect("admitted");
        b.done(10, Some(100 * MS));
        b.admit(50, now, None).expect("queued ahead");
        assert_eq!(b.admit(10, now, None), Ok(whole(10, false)));
    }

    #[test]
    fn done_never_underflows() {
        let b = Backlog::default();
        b.done(5, None);
        assert_eq!(b.queued_pairs(), 0);
    }
}
