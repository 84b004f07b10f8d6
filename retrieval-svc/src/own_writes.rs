//! The writes this gateway made and saw acknowledged, so that their change
//! events, coming back over search-svc's feed, are not taken for somebody
//! else's write.
//!
//! Each write call carries a fresh id (`x-engram-write-id`), and search-svc
//! puts it in the write's change event. The gateway drops the tenant's
//! cached answers itself as soon as the call returns; an event that comes
//! back after that says nothing new. Taken as news, it bumped the tenant's
//! generation a second time, and an answer being computed right then was
//! kept to this replica instead of shared with the others
//! (tests/replicas.rs, a turn answered on one replica).
//!
//! An event that arrives before the acknowledgement, or for a call that
//! failed (its write may have committed later), is not found here and
//! drops the tenant's answers like any other. Ids are unique, so an id
//! left behind by such an event never matches another write; old ones are
//! pruned by age.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long an acknowledged id waits for its event. Events arrive within
/// milliseconds; one that never comes (its event arrived first) is dropped
/// after this.
const KEEP: Duration = Duration::from_secs(60);
/// At most this many ids are kept; past it the oldest go first.
const MAX_KEPT: usize = 4096;

#[derive(Default)]
pub struct OwnWrites {
    acked: Mutex<HashMap<String, Instant>>,
}

impl OwnWrites {
    /// A fresh id for one write call.
    pub fn new_id() -> String {
        uuid::Uuid::new_v4().simple().to_string()
    }

    /// The call with `id` was acknowledged, and this replica has dropped
    /// (or is about to drop) the tenant's answers itself.
    pub fn acknowledged(&self, id: String) {
        self.acknowledged_at(id, Instant::now());
    }

    fn acknowledged_at(&self, id: String, now: Instant) {
        let mut acked = self.acked.lock();
        if acked.len() >= MAX_KEPT {
            acked.retain(|_, at| now.duration_since(*at) < KEEP);
        }
        if acked.len() >= MAX_KEPT {
            // Forgetting an id costs one more drop of cached answers, never
            // a stale one.
            if let Some(oldest) = (acked.iter())
                .min_by_key(|(_, at)| **at)
                .map(|(k, _)| k.clone())
            {
                acked.remove(&oldest);
            }
        }
        acked.insert(id, now);
    }

    /// Whether a change event with `write_id` is this replica's own
    /// acknowledged write (then it is forgotten: it comes back once).
    pub fn take(&self, write_id: &str) -> bool {
        !write_id.is_empty() && self.acked.lock().remove(write_id).is_some()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.acked.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acknowledged_write_is_known_once_and_others_never() {
        let own = OwnWrites::default();
        let id = OwnWrites::new_id();
        assert!(!own.take(&id), "not acknowledged yet: the event is news");
        own.acknowledged(id.clone());
        assert!(!own.take(""), "search-svc's own work is always news");
        assert!(!own.take(&OwnWrites::new_id()));
        assert!(own.take(&id));
        assert!(!own.take(&id), "a second event with the id is news");
    }

    #[test]
    fn ids_are_kept_within_bounds() {
        let own = OwnWrites::default();
        let start = Instant::now();
        for i in 0..MAX_KEPT {
            own.acknowledged_at(format!("old-{i}"), start);
        }
        let later = start + KEEP + Duration::from_secs(1);
        own.acknowledged_at("new".into(), later);
        assert_eq!(own.len(), 1, "ids past KEEP are pruned");
        for i in 0..MAX_KEPT + 10 {
            own.acknowledged_at(format!("n-{i}"), later + Duration::from_millis(i as u64));
        }
        assert_eq!(own.len(), MAX_KEPT);
        assert!(own.take(&format!("n-{}", MAX_KEPT + 9)), "the newest stay");
    }
}
