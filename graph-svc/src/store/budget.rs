//! Which tenant graphs to drop: a pure choice over what is loaded, so the
//! order is tested apart from loading.
//!
//! A hand-written choice rather than a cache crate: an instance holds tens
//! of tenants, so sorting them on each install or sweep costs nothing, and
//! a weighted cache (moka) refuses to keep an entry larger than its whole
//! capacity, which would make a tenant bigger than the budget reload on
//! every query; here the most recently used graph always stays.

/// One loaded tenant graph as the budget sees it.
#[derive(Debug, Clone)]
pub struct Resident {
    /// Estimated bytes (graph plus pooled walk scratch).
    pub bytes: u64,
    /// When a query last used it (milliseconds on the registry's clock).
    pub last_used_ms: u64,
}

/// Indexes into `residents` to evict, least recently used first: every
/// graph idle longer than `idle_ms_opt`, then more until the rest fit in
/// `budget`. The budget never takes the most recently used graph, so the
/// tenant being served keeps its graph even when it alone exceeds it.
pub fn evictions(
    residents: &[Resident],
    budget: u64,
    now_ms: u64,
    idle_ms_opt: Option<u64>,
) -> Vec<usize> {
    let mut order: Vec<usize> = (0..residents.len()).collect();
    order.sort_by_key(|&i| residents[i].last_used_ms);
    let newest_opt = order.last().copied();
    let mut total: u64 = residents.iter().map(|r| r.bytes).sum();
    let mut out = Vec::new();
    for i in order {
        let r = &residents[i];
        let idle = idle_ms_opt.is_some_and(|idle| now_ms.saturating_sub(r.last_used_ms) > idle);
        let over = total > budget && Some(i) != newest_opt;
        if !idle && !over {
            break;
        }
        total -= r.bytes;
        out.push(i);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(bytes: u64, last_used_ms: u64) -> Resident {
        Resident {
            bytes,
            last_used_ms,
        }
    }

    #[test]
    fn nothing_is_evicted_within_the_budget() {
        let rs = [r(10, 1), r(10, 2), r(10, 3)];
        assert!(evictions(&rs, 30, 100, None).is_empty());
    }

    #[test]
    fn the_least_recently_used_go_first_until_the_rest_fit() {
        // Used at 5, 1, 9, 3: over a budget of 25 by 15.
        let rs = [r(10, 5), r(10, 1), r(10, 9), r(10, 3)];
        assert_eq!(evictions(&rs, 25, 100, None), vec![1, 3]);
        assert_eq!(evictions(&rs, 10, 100, None), vec![1, 3, 0]);
    }

    #[test]
    fn the_most_recently_used_stays_even_alone_over_budget() {
        let rs = [r(100, 2), r(500, 7)];
        assert_eq!(evictions(&rs, 50, 100, None), vec![0]);
        assert!(evictions(&[r(500, 7)], 50, 100, None).is_empty());
        assert!(evictions(&[], 50, 100, None).is_empty());
    }

    #[test]
    fn idle_graphs_go_even_within_the_budget() {
        // Idle for 90 and 60 ms against a limit of 50; the newest stays.
        let rs = [r(1, 10), r(1, 40), r(1, 95)];
        assert_eq!(evictions(&rs, 1000, 100, Some(50)), vec![0, 1]);
        assert_eq!(evictions(&rs, 1000, 100, Some(70)), vec![0]);
        // Idle eviction returns memory nobody uses, the newest's too.
        assert_eq!(evictions(&[r(1, 0)], 1000, 100, Some(5)), vec![0]);
        assert!(evictions(&[r(1, 0)], 1000, 100, None).is_empty());
    }
}
