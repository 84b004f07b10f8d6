//! When each changed tenant's graph may rebuild: after its burst of change
//! notifications is over (debounce), no sooner than `min_rebuild_interval_ms`
//! after its previous rebuild ended, and with at most
//! `max_concurrent_rebuilds` running at once. Notifications arriving in
//! between coalesce into one later rebuild, so a tenant writing constantly
//! costs at most one rebuild per interval. Pure: the caller supplies time.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use engram_common::settings::GraphSettings;
use tokio::time::Instant;

/// A tenant's pending notifications.
#[derive(Debug, Clone, Copy)]
struct Burst {
    first: Instant,
    last: Instant,
}

/// The rebuild schedule; see the module doc.
#[derive(Debug)]
pub struct Pacer {
    quiet: Duration,
    cap: Duration,
    min_interval: Duration,
    max_running: usize,
    pending: HashMap<String, Burst>,
    running: HashSet<String>,
    /// When each tenant's last rebuild ended, kept for `min_interval`.
    ended: HashMap<String, Instant>,
}

impl Pacer {
    pub fn new(s: &GraphSettings) -> Self {
        Self {
            quiet: Duration::from_millis(s.debounce_ms),
            cap: Duration::from_millis(s.max_debounce_ms.max(1)),
            min_interval: Duration::from_millis(s.min_rebuild_interval_ms),
            max_running: s.max_concurrent_rebuilds.max(1),
            pending: HashMap::new(),
            running: HashSet::new(),
            ended: HashMap::new(),
        }
    }

    /// A change notification for `tenant` arrived.
    pub fn note(&mut self, tenant: String, now: Instant) {
        self.pending
            .entry(tenant)
            .and_modify(|b| b.last = now)
            .or_insert(Burst {
                first: now,
                last: now,
            });
    }

    /// When `tenant`'s pending burst may start rebuilding.
    fn due(&self, tenant: &str, b: &Burst) -> Instant {
        let settled = (b.last + self.quiet).min(b.first + self.cap);
        match self.ended.get(tenant) {
            Some(&end) => settled.max(end + self.min_interval),
            None => settled,
        }
    }

    /// The earliest time a rebuild could start, if one can start before a
    /// running rebuild ends (the caller also wakes on every end and note).
    pub fn next_due(&self) -> Option<Instant> {
        if self.running.len() >= self.max_running {
            return None;
        }
        self.pending
            .iter()
            .filter(|(t, _)| !self.running.contains(*t))
            .map(|(t, b)| self.due(t, b))
            .min()
    }

    /// Tenants to rebuild now, earliest due first, marked running.
    pub fn take_ready(&mut self, now: Instant) -> Vec<String> {
        let mut ready: Vec<(Instant, String)> = self
            .pending
            .iter()
            .filter(|(t, _)| !self.running.contains(*t))
            .map(|(t, b)| (self.due(t, b), t.clone()))
            .filter(|(due, _)| *due <= now)
            .collect();
        ready.sort();
        ready.truncate(self.max_running.saturating_sub(self.running.len()));
        ready
            .into_iter()
            .map(|(_, t)| {
                self.pending.remove(&t);
                self.running.insert(t.clone());
                t
            })
            .collect()
    }

    /// A rebuild ended; a failed one is pending again (its graph is stale
    /// until a rebuild succeeds), paced like any other.
    pub fn finished(&mut self, tenant: &str, ok: bool, now: Instant) {
        self.running.remove(tenant);
        let interval = self.min_interval;
        self.ended.retain(|_, end| now < *end + interval);
        self.ended.insert(tenant.to_string(), now);
        if !ok {
            self.note(tenant.to_string(), now);
        }
    }

    /// Rebuilds running now.
    pub fn running(&self) -> usize {
        self.running.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pacer(max_running: usize) -> Pacer {
        Pacer::new(&GraphSettings {
            debounce_ms: 100,
            max_debounce_ms: 1000,
            min_rebuild_interval_ms: 5000,
            max_concurrent_rebuilds: max_running,
            ..GraphSettings::default()
        })
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_rebuilds_once_after_it_is_quiet() {
        let t0 = Instant::now();
        let mut p = pacer(1);
        for i in 0..5 {
            p.note("a".into(), t0 + ms(i * 50));
        }
        assert!(p.take_ready(t0 + ms(299)).is_empty());
        assert_eq!(p.next_due(), Some(t0 + ms(300)));
        assert_eq!(p.take_ready(t0 + ms(300)), vec!["a".to_string()]);
        assert!(p.take_ready(t0 + ms(10_000)).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_constant_writer_rebuilds_once_per_interval() {
        let t0 = Instant::now();
        let mut p = pacer(1);
        p.note("a".into(), t0);
        assert_eq!(p.take_ready(t0 + ms(100)), vec!["a".to_string()]);
        // Writes keep coming during and after the rebuild.
        for i in 0..40 {
            p.note("a".into(), t0 + ms(150 + i * 50));
        }
        p.finished("a", true, t0 + ms(1000));
        // The burst cap (1 s) has long passed; the interval has not.
        assert!(p.take_ready(t0 + ms(3000)).is_empty());
        assert_eq!(p.next_due(), Some(t0 + ms(6000)));
        for i in 0..40 {
            p.note("a".into(), t0 + ms(3000 + i * 50));
        }
        // Every notification since the last rebuild: one rebuild.
        assert_eq!(p.take_ready(t0 + ms(6000)), vec!["a".to_string()]);
        assert!(p.take_ready(t0 + ms(6001)).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_the_cap_run_at_once() {
        let t0 = Instant::now();
        let mut p = pacer(2);
        for t in ["a", "b", "c"] {
            p.note(t.into(), t0);
        }
        let first = p.take_ready(t0 + ms(100));
        assert_eq!(first.len(), 2);
        assert_eq!(p.running(), 2);
        assert_eq!(p.next_due(), None);
        assert!(p.take_ready(t0 + ms(200)).is_empty());
        p.finished(&first[0], true, t0 + ms(300));
        assert_eq!(p.take_ready(t0 + ms(300)), vec!["c".to_string()]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_never_rebuilds_twice_at_once_and_failures_retry() {
        let t0 = Instant::now();
        let mut p = pacer(4);
        p.note("a".into(), t0);
        assert_eq!(p.take_ready(t0 + ms(100)).len(), 1);
        p.note("a".into(), t0 + ms(150));
        assert!(p.take_ready(t0 + ms(5000)).is_empty());
        p.finished("a", false, t0 + ms(6000));
        assert!(p.take_ready(t0 + ms(6000)).is_empty());
        assert_eq!(p.take_ready(t0 + ms(11_000)), vec!["a".to_string()]);
    }
}
