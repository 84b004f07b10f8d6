//! Stage 4c, what is true now: among the candidates one query retrieved,
//! versions of one slot (slots.rs: the same words but for the value) are
//! ordered newest first, so the agent sees the current fact before an
//! outdated one even when the writer linked nothing and no write-time
//! detection ran. Errors cost rank, never visibility: an older version is
//! kept right below the newer one, or — when the slot surely holds one
//! value — moved below the rest of the window as history; nothing is
//! removed. Every pair is reported in `conflicts` with its reason and score.
//!
//! A question about the past ("before", "used to", "originally", …) gets
//! the previous version first and the current one right after it; a
//! question about a time ("in March 2024", `when.rs`) gets the version that
//! was the latest then.
//!
//! Trust: a version never outranks one of a higher access level (a
//! low-trust writer cannot bury what it cannot see), and only the caller's
//! own candidates are compared, so another tenant's words never count.

use std::collections::HashSet;

use engram_common::convert::ts_to_chrono;
use engram_proto::{ConflictPair, ConflictResolution, Memory};

use super::slots::{self, MANY_VALUES, ONE_VALUE, Versions};
use super::text::said;
use super::validate::Checked;
use super::when::{self, Span};
use crate::query::Query;

/// The candidates compared, from the top: the answer and what could rise
/// into it.
pub const WINDOW: usize = 40;

/// The edge type reported for a pair judged here.
pub const SAME_SLOT: &str = "same_slot";

/// Query words that ask for the earlier version on their own.
const PAST: &[&str] = &[
    "before",
    "previously",
    "previous",
    "originally",
    "original",
    "formerly",
    "former",
    "earlier",
    "old",
    "prior",
    "initially",
    "changed",
];

/// Words that ask for it only three together ("what was it when it first
/// changed"): "was" and "did" alone ask about the past, not a version.
const WEAK_PAST: &[&str] = &["used", "first", "change", "was", "were", "did"];

/// Whether the question asks what was true before.
pub fn asks_past(question: &str) -> bool {
    let words = slots::tokens(question);
    let asked: HashSet<&str> = words.iter().map(String::as_str).collect();
    let strong = PAST.iter().any(|w| asked.contains(w));
    // "used to", and its question form "did she use to …".
    let used_to = (asked.contains("used") || (asked.contains("use") && asked.contains("did")))
        && asked.contains("to");
    // "at first", "in the beginning": an earlier time, said in two words.
    let phrase = (words.windows(2)).any(|w| w[0] == "at" && w[1] == "first")
        || (words.windows(3)).any(|w| w[0] == "in" && w[1] == "the" && w[2] == "beginning");
    let weak = WEAK_PAST.iter().filter(|w| asked.contains(**w)).count();
    strong || used_to || phrase || weak >= 3
}

/// Words that ask for an earlier version whatever the tense.
const HISTORY: &[&str] = &[
    "originally",
    "previously",
    "formerly",
    "initially",
    "changed",
];

/// Words that ask for it only in a question about the past ("where did
/// she live before?", not "what do I prepare before the demo?").
const HISTORY_IF_PAST: &[&str] = &[
    "before", "earlier", "prior", "original", "old", "previous", "former",
];

/// Past tense, for [`HISTORY_IF_PAST`].
const PAST_TENSE: &[&str] = &["was", "were", "did", "had", "used"];

/// Whether a question asks for an earlier version: a narrower reading than
/// [`asks_past`], because it widens what is read, not only the order.
pub fn asks_history(question: &str) -> bool {
    let words = slots::tokens(question);
    let has = |list: &[&str]| words.iter().any(|w| list.contains(&w.as_str()));
    let used_to = (words.windows(2)).any(|w| (w[0] == "used" || w[0] == "use") && w[1] == "to");
    asks_past(question)
        && (has(HISTORY)
            || (has(HISTORY_IF_PAST) && has(PAST_TENSE))
            || (used_to && has(&["used", "did"]))
            || (words.windows(2)).any(|w| w[0] == "at" && w[1] == "first")
            || (words.windows(3)).any(|w| w == ["in", "the", "beginning"]))
}

/// A question about an earlier version ([`asks_history`]) reads the
/// versions that are history now too (superseded, or past their validity),
/// so "what did it cost originally?" can answer with the earlier version
/// even when the writer linked the two; `assemble` then labels each
/// outdated one in the context block. An as-of read already asks for a
/// point in time and is left as it is.
pub fn with_history_when_past(mut q: Query) -> Query {
    let f = &mut q.filters;
    if !f.include_historical
        && f.as_of_event.is_none()
        && f.as_of_ingestion.is_none()
        && asks_history(&q.text)
    {
        f.include_historical = true;
    }
    q
}

/// One judged pair, by position in the window.
struct Pair {
    older: usize,
    newer: usize,
    v: Versions,
}

/// Reorders `ranked` (best first) and returns the pairs it judged. The
/// window's scores stay where they were, so they still fall with rank
/// (callers sort by them): a version moved up takes the score of the place
/// it lands on.
pub fn run(query: &Query, ranked: &mut Vec<(Checked, f32)>) -> Vec<ConflictPair> {
    let asked = slots::Asked::of(&query.text);
    let n = ranked.len().min(WINDOW);
    let toks: Vec<slots::Said> = (ranked.iter().take(n))
        .map(|(c, _)| slots::Said::of(&said(&c.cand.memory)))
        .collect();
    let keys: Vec<Key> = (ranked.iter().take(n))
        .map(|(c, _)| order_key(&c.cand.memory))
        .collect();
    let mut pairs = Vec::new();
    for i in 0..n {
        for j in i + 1..n {
            let Some(v) = slots::versions(&toks[i], &toks[j], &asked) else {
                continue;
            };
            let (ti, tj) = (keys[i], keys[j]);
            let pair = match (ti.1, ti.2) <= (tj.1, tj.2) {
                true => Pair {
                    older: i,
                    newer: j,
                    v,
                },
                false => Pair {
                    older: j,
                    newer: i,
                    v: Versions {
                        a: v.b,
                        b: v.a,
                        ..v
                    },
                },
            };
            pairs.push(pair);
        }
    }
    if pairs.is_empty() {
        return Vec::new();
    }
    let memory = |i: usize| &ranked[i].0.cand.memory;
    let conflicts = pairs
        .iter()
        .map(|p| conflict(memory(p.older), memory(p.newer), &p.v))
        .collect();
    // A time asked for: only versions of then or before count first.
    let reference_opt = (query.filters.as_of_event.as_ref())
        .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, 0));
    let span_opt = when::parse(&query.text, reference_opt, chrono::Utc::now());
    let then: Vec<bool> = (keys.iter())
        .map(|k| span_opt.is_none_or(|s| then(s, k.1)))
        .collect();
    let past = span_opt.is_none() && asks_past(&query.text);
    let order = reorder(&keys, &then, &pairs, past);
    let mut scores: Vec<f32> = ranked.iter().take(n).map(|(_, s)| *s).collect();
    scores.sort_by(|a, b| b.total_cmp(a));
    let mut head: Vec<_> = ranked.drain(..n).map(Some).collect();
    let tail = std::mem::take(ranked);
    let moved = order.into_iter().filter_map(|i| head[i].take());
    ranked.extend(moved.zip(scores).map(|((c, _), s)| (c, s)));
    ranked.extend(tail);
    conflicts
}

/// The pair as the answer reports it. The newer version wins unless the
/// slot holds several values, or the older is of a higher access level
/// (then the older one keeps its place and the pair is unresolved).
fn conflict(older: &Memory, newer: &Memory, v: &Versions) -> ConflictPair {
    let outranked = older.access_level > newer.access_level;
    let (resolution, winner_id) = if v.score <= MANY_VALUES || outranked {
        (ConflictResolution::Unresolved, String::new())
    } else {
        (ConflictResolution::Recency, newer.id.clone())
    };
    let how = match v.score {
        s if s >= ONE_VALUE => "one value at a time",
        s if s <= MANY_VALUES => "may hold several values",
        _ => "unsure how many values",
    };
    ConflictPair {
        memory_a: older.id.clone(),
        memory_b: newer.id.clone(),
        resolution: resolution as i32,
        winner_id,
        edge_type: SAME_SLOT.into(),
        reason: format!(
            "same words but the value: \"{}\" then \"{}\" ({how})",
            v.a, v.b
        ),
        score: v.score,
    }
}

/// (access level, event time, ingestion time): what makes a version the
/// one that counts; higher counts.
pub type Key = (i32, i64, i64);

/// The [`Key`] of a memory (Stage 4d picks a chain's next fact by it too).
pub fn order_key(m: &Memory) -> Key {
    let ms = |t: &Option<prost_types::Timestamp>| {
        (t.as_ref().and_then(ts_to_chrono)).map_or(i64::MIN, |t| t.timestamp_millis())
    };
    let ingested = ms(&m.ingestion_time).max(ms(&m.recorded_at));
    let event = match ms(&m.event_time) {
        i64::MIN => ingested,
        e => e,
    };
    (m.access_level, event, ingested)
}

/// Whether a version with this event time (ms) was stated by the end of
/// `span` (a bare month: in that month of any year).
fn then(span: Span, event_ms: i64) -> bool {
    let Some(t) = chrono::DateTime::from_timestamp_millis(event_ms) else {
        return true;
    };
    match span {
        Span::Between(_, end) => t < end,
        Span::Month(_) => span.contains(t),
    }
}

/// The window's new order: each group of versions at its best member's
/// place, the one that counts first (for the past, the one before it
/// first); versions of a one-valued slot that are neither go below the
/// rest of the window.
fn reorder(keys: &[Key], then: &[bool], pairs: &[Pair], past: bool) -> Vec<usize> {
    let n = keys.len();
    let mut group: Vec<usize> = (0..n).collect();
    fn find(g: &mut [usize], i: usize) -> usize {
        let mut r = i;
        while g[r] != r {
            r = g[r];
        }
        g[i] = r;
        r
    }
    for p in pairs {
        let (a, b) = (find(&mut group, p.older), find(&mut group, p.newer));
        group[a.max(b)] = a.min(b);
    }
    let roots: Vec<usize> = (0..n).map(|i| find(&mut group, i)).collect();
    let sure = |i: usize| pairs.iter().any(|p| p.older == i && p.v.score >= ONE_VALUE);
    let mut out = Vec::with_capacity(n);
    let mut history = Vec::new();
    let mut placed = vec![false; n];
    for i in 0..n {
        if placed[i] {
            continue;
        }
        let mut members: Vec<usize> = (i..n).filter(|&j| roots[j] == roots[i]).collect();
        members.sort_by_key(|&j| std::cmp::Reverse((then[j], keys[j])));
        if past && members.len() > 1 {
            members.swap(0, 1);
        }
        for (rank, &j) in members.iter().enumerate() {
            placed[j] = true;
            let aside = !past && rank > 0 && sure(j);
            if aside { history.push(j) } else { out.push(j) }
        }
    }
    out.extend(history);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_wording() {
        assert!(asks_past("Where did Dana live before?"));
        assert!(asks_past("What was the original deadline?"));
        assert!(asks_past("Where did she use to live? she used to"));
        assert!(asks_past("Which airline did she use to be loyal to?"));
        assert!(!asks_past("Which app does she use to pay rent?"));
        assert!(asks_past("Which warehouse did we have in mind at first?"));
        assert!(!asks_past("Who sits first at the table?"));
        assert!(!asks_past("Where does Dana live?"));
        assert!(!asks_past("Where was Acme founded?"));
    }

    #[test]
    fn a_past_question_reads_history_unless_it_asks_as_of() {
        let q = |text: &str, as_of: bool| {
            let as_of_event = as_of.then_some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            });
            let r = engram_proto::RetrieveRequest {
                text: text.into(),
                as_of_event,
                ..Default::default()
            };
            with_history_when_past(Query::try_from(r).expect("valid")).filters
        };
        assert!(q("What was the original deadline?", false).include_historical);
        assert!(!q("What is the deadline?", false).include_historical);
        assert!(q("Where did she live before?", false).include_historical);
        assert!(q("Which warehouse did we have in mind at first?", false).include_historical);
        assert!(q("Which airline did she use to be loyal to?", false).include_historical);
        assert!(!q("What do I prepare before the demo?", false).include_historical);
        assert!(!q("What is the original receipt number?", false).include_historical);
        assert!(!q("Which app does she use to pay rent?", false).include_historical);
        assert!(!q("What was the original deadline?", true).include_historical);
    }

    fn pair(older: usize, newer: usize, score: f32) -> Pair {
        let v = Versions {
            a: "old".into(),
            b: "new".into(),
            score,
        };
        Pair { older, newer, v }
    }

    /// Positions 0..4; 1 and 3 are versions, 3 the newer.
    const KEYS: [Key; 4] = [(1, 50, 0), (1, 10, 0), (1, 60, 0), (1, 20, 0)];
    const ALL: [bool; 4] = [true; 4];

    #[test]
    fn a_time_asked_for_puts_the_version_of_then_first() {
        // 3 (t = 20) came after the span; 1 (t = 10) was the latest then,
        // and the later one follows it.
        let then = [true, true, true, false];
        let sure = [pair(1, 3, ONE_VALUE)];
        assert_eq!(reorder(&KEYS, &then, &sure, false), [0, 1, 3, 2]);
        let s = Span::Between(
            chrono::DateTime::from_timestamp(0, 0).expect("t"),
            chrono::DateTime::from_timestamp(15, 0).expect("t"),
        );
        assert!(super::then(s, 10_000) && !super::then(s, 20_000));
    }

    #[test]
    fn the_newest_version_takes_the_groups_best_place() {
        let unsure = [pair(1, 3, slots::UNSURE)];
        assert_eq!(reorder(&KEYS, &ALL, &unsure, false), [0, 3, 1, 2]);
        let many = [pair(1, 3, MANY_VALUES)];
        assert_eq!(reorder(&KEYS, &ALL, &many, false), [0, 3, 1, 2]);
    }

    #[test]
    fn a_one_valued_slots_older_version_goes_below_the_window() {
        let sure = [pair(1, 3, ONE_VALUE)];
        assert_eq!(reorder(&KEYS, &ALL, &sure, false), [0, 3, 2, 1]);
    }

    #[test]
    fn the_past_asked_puts_the_previous_version_first() {
        let sure = [pair(1, 3, ONE_VALUE)];
        assert_eq!(reorder(&KEYS, &ALL, &sure, true), [0, 1, 3, 2]);
    }

    #[test]
    fn a_higher_access_level_counts_before_recency() {
        let keys = [(1, 50, 0), (4, 10, 0), (1, 60, 0), (1, 20, 0)];
        let sure = [pair(1, 3, ONE_VALUE)];
        // 1 is older but of a higher level: it keeps the place, 3 follows
        // (the one-valued rule demotes only a pair's older member).
        assert_eq!(reorder(&keys, &ALL, &sure, false), [0, 1, 3, 2]);
    }
}
