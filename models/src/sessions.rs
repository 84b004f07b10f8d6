//! A pool of single-threaded ONNX Runtime sessions of one model, and how a
//! request's texts are spread over them.
//!
//! Both models run one text (or pair) per `Session::run`, never a padded
//! batch: the int8 models quantise activations per batch, so a batch moves
//! each row's output with its neighbours (a cross-encoder logit by up to
//! 0.3), and on this hardware it is slower as well (2Wiki passages, one
//! session of two threads: 14.7 passages/s in batches of 32, 25.4 one at a
//! time; `embed_throughput_on_wiki_passages`). One text is too small for
//! intra-op threads to keep two cores busy, so the pool holds one
//! single-threaded session per core and a request's texts run side by side.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ort::session::Session;

use crate::{BertInputs, ModelError};

/// More sessions than this only add memory (~25 MB each for an int8
/// MiniLM).
pub(crate) const MAX_SESSIONS: usize = 8;

pub(crate) struct Sessions {
    /// `Session::run` takes `&mut self`: one run per session at a time.
    all: Vec<Mutex<Session>>,
    /// Where a single-text request starts looking for a free session, so
    /// concurrent callers spread out instead of all queueing on the first.
    next: AtomicUsize,
    /// Single-text requests (queries) waiting for a session: a many-text
    /// request (a write batch) lets them go first between its items.
    waiting: AtomicUsize,
}

/// Longest a many-text request steps aside for waiting single texts before
/// its next item, so a stream of queries cannot starve a write batch.
const MAX_YIELD: Duration = Duration::from_millis(20);

impl Sessions {
    /// `n` sessions (at least one, at most [`MAX_SESSIONS`]) of
    /// `intra_threads` threads each.
    pub(crate) fn open(model: &Path, n: usize, intra_threads: usize) -> Result<Self, ModelError> {
        let n = n.clamp(1, MAX_SESSIONS);
        let all = (0..n)
            .map(|_| crate::open_session(model, intra_threads).map(Mutex::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            all,
            next: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
        })
    }

    /// The BERT inputs the model declares and the name of its output:
    /// `preferred` when it has one of that name, else its first.
    pub(crate) fn bert_io(&self, preferred: &str) -> Result<(BertInputs, String), ModelError> {
        let first = self.lock(0)?;
        let outputs = first.outputs();
        let output = (outputs.iter())
            .find(|o| o.name() == preferred)
            .or_else(|| outputs.first())
            .map(|o| o.name().to_string())
            .ok_or_else(|| ModelError::Output("model declares no outputs".into()))?;
        Ok((BertInputs::discover(&first)?, output))
    }

    pub(crate) fn len(&self) -> usize {
        self.all.len()
    }

    pub(crate) fn lock(&self, k: usize) -> Result<MutexGuard<'_, Session>, ModelError> {
        self.all[k % self.all.len()]
            .lock()
            .map_err(|_| ModelError::Inference("model lock poisoned by an earlier panic".into()))
    }

    /// A free session if there is one, else the next in turn (waiting,
    /// counted in `waiting` so a write batch lets it go first).
    fn any(&self) -> Result<MutexGuard<'_, Session>, ModelError> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for k in 0..self.all.len() {
            if let Ok(guard) = self.all[(start + k) % self.all.len()].try_lock() {
                return Ok(guard);
            }
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let r = self.lock(start);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        r
    }

    /// Session `k` for one item of a many-text request, after any waiting
    /// single text has had its turn (at most [`MAX_YIELD`]). A share used
    /// to hold its session for all its items: a query arriving during a
    /// write batch waited for a whole share of it, and another tenant's
    /// flood of 300-memory upserts took a reader's p95 to 12-16x solo
    /// (`engram soak --only high`, write_flood).
    fn lock_after_queries(&self, k: usize) -> Result<MutexGuard<'_, Session>, ModelError> {
        let since = Instant::now();
        while self.waiting.load(Ordering::SeqCst) > 0 && since.elapsed() < MAX_YIELD {
            std::thread::sleep(Duration::from_micros(200));
        }
        self.lock(k)
    }

    /// `run(session, i)` for every item `i` of `lengths` (its token count),
    /// in item order. Items are split over the sessions by [`balance`], one
    /// thread per session used; a single item takes any free session.
    pub(crate) fn run_each<T, F>(&self, lengths: &[usize], run: F) -> Result<Vec<T>, ModelError>
    where
        T: Send,
        F: Fn(&mut Session, usize) -> Result<T, ModelError> + Sync,
    {
        if lengths.is_empty() {
            return Ok(Vec::new());
        }
        let n = self.all.len().min(lengths.len());
        if n == 1 {
            let mut session = self.any()?;
            return (0..lengths.len()).map(|i| run(&mut session, i)).collect();
        }
        let run = &run;
        let shares: Vec<Result<Vec<(usize, T)>, ModelError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = balance(lengths, n)
                .into_iter()
                .enumerate()
                .map(|(k, share)| {
                    scope.spawn(move || {
                        share
                            .into_iter()
                            .map(|i| {
                                let mut session = self.lock_after_queries(k)?;
                                Ok((i, run(&mut session, i)?))
                            })
                            .collect()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(ModelError::Inference("model thread panicked".into()))
                    })
                })
                .collect()
        });
        let mut out: Vec<Option<T>> = (0..lengths.len()).map(|_| None).collect();
        for share in shares {
            for (i, value) in share? {
                out[i] = Some(value);
            }
        }
        out.into_iter()
            .map(|v| v.ok_or_else(|| ModelError::Inference("an item was not run".into())))
            .collect()
    }
}

/// Splits item indices over `n` sessions so their token totals are as even
/// as greedy longest-first gets them. The request waits for the slowest
/// session, and lengths vary: round-robin could hand one session most of
/// the long texts.
pub(crate) fn balance(lengths: &[usize], n: usize) -> Vec<Vec<usize>> {
    let n = n.max(1);
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]).then(a.cmp(&b)));
    let mut shares: Vec<(usize, Vec<usize>)> = (0..n).map(|_| (0, Vec::new())).collect();
    for i in order {
        if let Some(least) = shares.iter_mut().min_by_key(|(load, _)| *load) {
            least.0 += lengths[i];
            least.1.push(i);
        }
    }
    shares.into_iter().map(|(_, share)| share).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balance_evens_out_long_items() {
        // Round-robin would give session 0 the three 128-token items.
        let lengths = [128, 20, 128, 20, 128, 20];
        let shares = balance(&lengths, 2);
        let load = |s: &Vec<usize>| s.iter().map(|&i| lengths[i]).sum::<usize>();
        assert_eq!(shares.len(), 2);
        assert!(
            load(&shares[0]).abs_diff(load(&shares[1])) <= 108,
            "{shares:?}"
        );
        let mut all: Vec<usize> = shares.concat();
        all.sort_unstable();
        assert_eq!(all, (0..6).collect::<Vec<_>>());
        assert_eq!(balance(&[5, 6], 1), vec![vec![1, 0]]);
        assert_eq!(balance(&[], 2), vec![Vec::<usize>::new(), Vec::new()]);
    }
}
