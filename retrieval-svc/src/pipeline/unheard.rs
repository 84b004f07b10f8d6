//! Each tenant's latest write that graph-svc may not have heard of yet.
//!
//! A write drops the tenant's cached answers here at once, but graph-svc
//! learns of it from Postgres's change notification, milliseconds later. A
//! query in that window walked the old graph, and its answer was cached as
//! fresh until the tenant's next write (issue 47, item 20). So every graph
//! walk for a short while after a write names that write
//! (`PprRequest.after_write`), and graph-svc answers `stale` until it has
//! heard of it; a stale answer is not cached (`Pipeline::run`).
//!
//! Only the latest write is named: notifications arrive in commit order,
//! so once it is heard the earlier ones are too. A write is named for
//! [`ASK_FOR`], far longer than a notification takes; after that graph-svc
//! has heard of it or has lost its feed, and then it resyncs every tenant.
//! Writes through other replicas are named from the change feed, which
//! hears them when graph-svc does.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// How long a write is named in graph walks.
pub const ASK_FOR: Duration = Duration::from_secs(10);
/// Past this many tenants, those whose write is older than [`ASK_FOR`] are
/// dropped before another is added.
const PRUNE_ABOVE: usize = 1024;

#[derive(Debug, Default)]
pub struct Unheard {
    latest: HashMap<String, (String, Instant)>,
}

impl Unheard {
    /// `tenant` wrote `write_id` ("" says nothing: no graph-svc can name
    /// it back).
    pub fn wrote(&mut self, tenant: &str, write_id: &str, now: Instant) {
        if write_id.is_empty() {
            return;
        }
        if self.latest.len() >= PRUNE_ABOVE {
            self.latest
                .retain(|_, (_, at)| now.duration_since(*at) < ASK_FOR);
        }
        self.latest
            .insert(tenant.to_string(), (write_id.to_string(), now));
    }

    /// The write a graph walk for `tenant` must reflect, or "".
    pub fn write_for(&self, tenant: &str, now: Instant) -> String {
        match self.latest.get(tenant) {
            Some((id, at)) if now.duration_since(*at) < ASK_FOR => id.clone(),
            _ => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_write_is_named_for_a_while_and_only_for_its_tenant() {
        let mut u = Unheard::default();
        let t0 = Instant::now();
        assert_eq!(u.write_for("t1", t0), "");
        u.wrote("t1", "w1", t0);
        u.wrote("t1", "w2", t0);
        u.wrote("t1", "", t0);
        assert_eq!(u.write_for("t1", t0 + Duration::from_secs(1)), "w2");
        assert_eq!(u.write_for("t2", t0), "", "another tenant's write");
        assert_eq!(u.write_for("t1", t0 + ASK_FOR), "");
    }

    #[test]
    fn old_writes_are_dropped_past_the_bound() {
        let mut u = Unheard::default();
        let t0 = Instant::now();
        for i in 0..PRUNE_ABOVE {
            u.wrote(&format!("t{i}"), "w", t0);
        }
        u.wrote("late", "w", t0 + ASK_FOR);
        assert_eq!(u.latest.len(), 1);
        assert_eq!(u.write_for("late", t0 + ASK_FOR), "w");
    }
}
