//! The write ids whose change notifications this instance has noted, so a
//! query can tell whether its graph may be missing a write the caller knows
//! of.
//!
//! A gateway that has just written drops its cached answers at once, but
//! graph-svc hears of the write only when Postgres delivers the
//! notification, milliseconds later. A query in between walks the old
//! graph, and nothing said so: the answer was cached as fresh and served
//! until the tenant's next write. Now the gateway names its latest write
//! (`PprRequest.after_write`) and the answer is `stale` until that write's
//! notification has been noted here, i.e. until the graph is rebuilt from
//! a snapshot that holds it or says it is stale by itself.
//!
//! Ids are kept first in, first out, for every tenant together, at most
//! [`MAX_HEARD`]. At the rate limits' write rates an id stays far longer
//! than the gateway keeps asking for it (a few seconds); a tenant that
//! writes fast enough to push another's id out early costs that tenant
//! uncached answers for those seconds, never a stale answer cached as
//! fresh.

use std::collections::{HashSet, VecDeque};

/// Write ids kept (about 100 bytes each).
pub const MAX_HEARD: usize = 16_384;

/// Longest write id a request may name (the gateway's are 32 hex digits).
pub const MAX_WRITE_ID_CHARS: usize = 64;

#[derive(Debug, Default)]
pub struct Heard {
    order: VecDeque<(String, String)>,
    set: HashSet<(String, String)>,
}

impl Heard {
    /// `write_id` of `tenant` was noted; "" (search-svc's own work) is not
    /// kept, since no caller can name it.
    pub fn note(&mut self, tenant: &str, write_id: &str) {
        if write_id.is_empty() {
            return;
        }
        let key = (tenant.to_string(), write_id.to_string());
        if !self.set.insert(key.clone()) {
            return;
        }
        self.order.push_back(key);
        while self.order.len() > MAX_HEARD {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    /// Whether `write_id` of `tenant` was noted; an empty id asks nothing.
    pub fn has(&self, tenant: &str, write_id: &str) -> bool {
        write_id.is_empty()
            || self
                .set
                .contains(&(tenant.to_string(), write_id.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_counts_once_heard_and_only_for_its_tenant() {
        let mut h = Heard::default();
        assert!(h.has("t1", ""), "no write named: nothing to wait for");
        assert!(!h.has("t1", "w1"));
        h.note("t1", "w1");
        assert!(h.has("t1", "w1"));
        assert!(!h.has("t2", "w1"), "another tenant's write says nothing");
        h.note("t1", "");
        assert_eq!(h.order.len(), 1, "search-svc's own work is not kept");
    }

    #[test]
    fn the_oldest_ids_go_first_past_the_bound() {
        let mut h = Heard::default();
        for i in 0..MAX_HEARD + 3 {
            h.note("t", &format!("w{i}"));
        }
        h.note("t", "w10");
        assert_eq!(h.order.len(), MAX_HEARD);
        assert_eq!(h.set.len(), MAX_HEARD);
        assert!(!h.has("t", "w0") && !h.has("t", "w2"));
        assert!(h.has("t", "w3") && h.has("t", &format!("w{}", MAX_HEARD + 2)));
    }
}
