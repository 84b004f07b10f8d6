//! Stage 4c's third step, a note that says it is news: "Lena's on an
//! iPhone 15 now", "The building sold in March; Lakeshore manages it now",
//! "Heron prod lives in eu-central-1 after the review". An assistant
//! writing down a change rewords the fact, so slots.rs finds no shared
//! words to align and the older statement, worded the way the question is,
//! stays above it. A note that marks itself as a change, and that is as
//! close to the question's meaning as the closest note ([`FAR`]), rises
//! above the older notes before it among the first [`TOP`] places.
//!
//! Errors cost rank, not visibility: nothing leaves the window. A question
//! about the past ("before", "originally") keeps its order; a note never
//! rises above one of a higher access level (a low-trust writer's "now"
//! cannot bury what it cannot see).
//!
//! The markers are English function words and phrases that say a state
//! changed, not words of any relation; docs/decisions.md has the figures
//! per dev set and how the list was chosen.

use super::current::{asks_past, order_key};
use super::slots::{self, is_note};
use super::subject::{FAR, TOP, cosine, move_places};
use super::validate::Checked;

/// Single words that mark a statement as a change.
const MARKERS: &[&str] = &[
    "now",
    "currently",
    "nowadays",
    "anymore",
    "instead",
    "switched",
    "moved",
    "new",
    "changed",
    "replaced",
    "starting",
    "after",
    "pushed",
    "slipped",
    "rescheduled",
    "bump",
    "bumped",
    "sold",
    "handed",
    "upgraded",
    "rebooked",
];

/// Word pairs that do.
const MARKER_PAIRS: &[(&str, &str)] = &[
    ("these", "days"),
    ("no", "longer"),
    ("any", "more"),
    ("took", "over"),
    ("as", "of"),
    ("went", "up"),
    ("went", "down"),
];

/// Whether the words mark a change: a marker, a marker pair, or "from X
/// on" ("from March on").
pub fn says_change(words: &[String]) -> bool {
    let one = words.iter().any(|w| MARKERS.contains(&w.as_str()));
    let pair = (words.windows(2)).any(|p| MARKER_PAIRS.contains(&(p[0].as_str(), p[1].as_str())));
    let from_on = (words.windows(3)).any(|t| t[0] == "from" && t[2] == "on");
    one || pair || from_on
}

/// Moves each near note that marks a change above the first older note
/// before it (of an access level no higher) among the first [`TOP`]
/// places. Returns how many places changed hands.
pub fn changes_first(question: &str, ranked: &mut Vec<(Checked, f32)>) -> usize {
    if asks_past(question) {
        return 0;
    }
    let n = ranked.len().min(TOP);
    // Each place's memory judged once: the loop below asks again and again.
    let notes: Vec<bool> = (ranked.iter().take(n))
        .map(|(c, _)| is_note(&c.cand.memory))
        .collect();
    let note = |i: usize| notes[i];
    let best = ((0..n).filter(|&i| note(i)))
        .map(|i| cosine(&ranked[i].0))
        .fold(0.0, f32::max);
    let rises = |i: usize| {
        note(i)
            && cosine(&ranked[i].0) >= best - FAR
            && says_change(&slots::fact_tokens(&ranked[i].0.cand.memory.content))
    };
    let mut order: Vec<usize> = (0..n).collect();
    for b in 0..n {
        if !rises(order[b]) {
            continue;
        }
        let newer = order_key(&ranked[order[b]].0.cand.memory);
        let older = |i: &usize| {
            let k = order_key(&ranked[*i].0.cand.memory);
            note(*i) && (k.1, k.2) < (newer.1, newer.2) && k.0 <= newer.0
        };
        if let Some(a) = order[..b].iter().position(older) {
            let i = order.remove(b);
            order.insert(a, i);
        }
    }
    move_places(ranked, &order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::subject::tests::{fact, ids};

    /// The older phone note and the newer one that says it is news.
    fn phones() -> Vec<(Checked, f32)> {
        vec![
            at(
                fact("pixel", "Her phone is a Google Pixel 7.", Some(0.51)),
                10,
            ),
            at(
                fact("iphone", "Lena's on an iPhone 15 now.", Some(0.46)),
                20,
            ),
        ]
    }

    fn at(mut f: (Checked, f32), secs: i64) -> (Checked, f32) {
        f.0.cand.memory.event_time = Some(prost_types::Timestamp {
            seconds: secs,
            nanos: 0,
        });
        f
    }

    fn words(s: &str) -> Vec<String> {
        slots::tokens(s)
    }

    #[test]
    fn markers_are_words_pairs_and_from_x_on() {
        assert!(says_change(&words("Lena's on an iPhone 15 now.")));
        assert!(says_change(&words("Sony A7 IV is her body these days.")));
        assert!(says_change(&words("Daily sync is at 9:45 from March on.")));
        assert!(!says_change(&words("Her phone is a Google Pixel 7.")));
        assert!(!says_change(&words("Nowhere on the list.")));
    }

    #[test]
    fn a_near_note_that_marks_a_change_rises_above_older_ones() {
        let mut r = phones();
        r.push(at(fact("tea", "Green tea now, no coffee.", Some(0.2)), 30));
        assert_eq!(changes_first("What handset does she carry?", &mut r), 2);
        // "tea" marks a change too but is far from the question.
        assert_eq!(ids(&r), ["iphone", "pixel", "tea"]);
    }

    #[test]
    fn past_questions_older_markers_and_higher_levels_stay() {
        let rows = phones;
        let mut r = rows();
        assert_eq!(changes_first("What phone did she have before?", &mut r), 0);
        let mut r = rows();
        r[1].0.cand.memory.event_time = Some(prost_types::Timestamp::default());
        assert_eq!(changes_first("What handset does she carry?", &mut r), 0);
        let mut r = rows();
        r[0].0.cand.memory.access_level = 2;
        assert_eq!(changes_first("What handset does she carry?", &mut r), 0);
        assert_eq!(ids(&r), ["pixel", "iphone"]);
    }
}
