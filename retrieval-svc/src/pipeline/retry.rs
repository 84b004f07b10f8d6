//! When and how an attempt is retried: a weak answer (no records, or
//! confidence under [`LOW_CONFIDENCE`]) is asked again one route up, with
//! consolidated memories included; what the caller set stays a hard
//! filter, and a plan identical to the last one is never repeated.

use engram_proto::Filters;

use crate::query::Route;

/// Below this, an attempt's answer is "low" and the next attempt broadens.
pub const LOW_CONFIDENCE: f32 = 0.05;

/// The route of retry `attempt` (>= 1) and whether the evidence fuses it,
/// given the route the best attempt resolved to and the previous attempt's
/// plan (`None` when a downstream was degraded in it, so repeating it may
/// help). A retry goes one route step up: after a whole attempt, the same
/// strategies again with only consolidated memories let in returned the
/// same weak answer at full cost for any tenant that has none (issue 47,
/// item 20); from the third attempt on it goes up even after a degraded
/// one. A plan identical to the previous one goes up instead of running
/// again, and when there is no step up left there is nothing new to try
/// (`None`).
pub fn escalate(
    attempt: u32,
    mut route: Route,
    mut by_evidence: bool,
    filters: &Filters,
    previous_opt: Option<&(Route, bool, Filters)>,
) -> Option<(Route, bool)> {
    if attempt >= 2 || previous_opt.is_some() {
        route = route.next_up();
        by_evidence = false;
    }
    let same = |route: Route, by_evidence: bool| {
        previous_opt.is_some_and(|(r, e, f)| *r == route && *e == by_evidence && f == filters)
    };
    while same(route, by_evidence) {
        if route.next_up() == route && !by_evidence {
            return None;
        }
        route = route.next_up();
        by_evidence = false;
    }
    Some((route, by_evidence))
}

/// What a retry may open: only what the caller left open. The caller's
/// time window, confidence floor, types, scope, namespace, metadata and
/// as-of times are hard filters, kept as set (a retry that returned
/// memories outside the window the caller asked for was a wrong answer
/// with `retry_count` its only sign). A request cannot mark
/// `include_consolidated` as deliberately false, so it is the one filter a
/// retry opens; the retry's other lever is the route (`escalate`).
pub fn broaden(f: &Filters) -> Filters {
    Filters {
        include_consolidated: true,
        ..f.clone()
    }
}

/// Whether an attempt with `records` records at `confidence` is a better
/// answer than the best so far (records, confidence): the first answer
/// always is; later, only a non-empty one that beats an empty best or a
/// less confident one.
pub fn better(records: usize, confidence: f32, best_opt: Option<(usize, f32)>) -> bool {
    best_opt.is_none_or(|(best_records, best_confidence)| {
        records > 0 && (best_records == 0 || confidence > best_confidence)
    })
}

#[cfg(test)]
mod tests {
    use engram_proto::TimeRange;
    use prost_types::Timestamp;

    use super::*;

    #[test]
    fn a_retry_never_repeats_the_previous_plan() {
        use Route::*;
        let f = Filters::default();
        // `escalate` after a previous attempt that ran `prev` on filters `f`.
        let after = |attempt, route, evidence, filters: &Filters, prev: Option<(Route, bool)>| {
            let prev = prev.map(|(r, e)| (r, e, Filters::default()));
            escalate(attempt, route, evidence, filters, prev.as_ref())
        };
        // Same route, evidence and filters as before: one step up instead.
        assert_eq!(
            after(1, Simple, true, &f, Some((Simple, true))),
            Some((MultiHop, false))
        );
        // A degraded previous attempt (no plan recorded) may be repeated.
        assert_eq!(after(1, Simple, true, &f, None), Some((Simple, true)));
        // The second attempt goes up a route
        // (`the_second_attempt_runs_other_strategies`).
        let wider = Filters {
            include_consolidated: true,
            ..Filters::default()
        };
        assert_eq!(
            after(1, MultiHop, false, &wider, Some((MultiHop, false))),
            Some((Exploratory, false))
        );
        // The third attempt goes up from the best route, past a repeat...
        assert_eq!(
            after(2, Simple, true, &f, Some((MultiHop, false))),
            Some((Exploratory, false))
        );
        // ...and stops when exploratory already ran.
        assert_eq!(
            after(2, MultiHop, false, &f, Some((Exploratory, false))),
            None
        );
    }

    /// A whole first attempt's strategies are not run again with only
    /// consolidated memories let in (its answer, for a tenant with none):
    /// attempt 2 goes a route up. Only at the top route, where no other
    /// strategy is left, may the consolidated memories be the one change.
    #[test]
    fn the_second_attempt_runs_other_strategies() {
        use Route::*;
        let first = Filters::default();
        let wider = broaden(&first);
        for (route, evidence, up) in [
            (Simple, true, MultiHop),
            (Simple, false, MultiHop),
            (MultiHop, true, Exploratory),
            (MultiHop, false, Exploratory),
            (Exploratory, true, Exploratory),
        ] {
            let whole = (route, evidence, first.clone());
            let next = escalate(1, route, evidence, &wider, Some(&whole));
            assert_eq!(
                next,
                Some((up, false)),
                "after {route:?}, evidence {evidence}"
            );
            assert_ne!(next, Some((route, evidence)), "attempt 1 again");
        }
        let whole = (Exploratory, false, first.clone());
        assert_eq!(
            escalate(1, Exploratory, false, &wider, Some(&whole)),
            Some((Exploratory, false)),
            "nothing above exploratory: only the consolidated memories are new"
        );
        let caller_wide = (Exploratory, false, wider.clone());
        assert_eq!(
            escalate(1, Exploratory, false, &wider, Some(&caller_wide)),
            None,
            "the caller already let them in: nothing new to try"
        );
    }

    #[test]
    fn broadening_keeps_what_the_caller_set() {
        let f = Filters {
            min_confidence: 0.5,
            time_range: Some(TimeRange {
                start: Some(Timestamp {
                    seconds: 1000,
                    nanos: 0,
                }),
                end: Some(Timestamp {
                    seconds: 2000,
                    nanos: 0,
                }),
            }),
            namespace: "ns".into(),
            ..Default::default()
        };
        let b = broaden(&f);
        assert!(b.include_consolidated);
        assert_eq!(
            Filters {
                include_consolidated: false,
                ..b
            },
            f
        );
    }
}
