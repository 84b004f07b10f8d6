//! Stage 4c's third step, a note that says it is news: "Lena's on an
//! iPhone 15 now", "The building sold in March; Lakeshore manages it now",
//! "Heron prod lives in eu-central-1 after the review". An assistant
//! writing down a change rewords the fact, so slots.rs finds no shared
//! words to align and the older statement, worded the way the question is,
//! stays above it. A note that marks itself as a change, and that is as
//! close to the question's meaning as the closest note ([`FAR`]), rises
//! above the older notes before it among the first [`TOP`] places. One
//! farther from the question rises above an older near note whose value
//! it names: "Reports to Anita Shah now; Greg went to Denver" over "Lena's
//! manager is Greg Pollard".
//!
//! Errors cost rank, not visibility: nothing leaves the window. A question
//! about the past ("before", "originally") keeps its order; a note never
//! rises above one of a higher access level (a low-trust writer's "now"
//! cannot bury what it cannot see).
//!
//! The markers are English function words and phrases that say a state
//! changed, not words of any relation; docs/decisions.md has the figures
//! per dev set and how the list was chosen.

use std::collections::HashSet;

use super::current::{asks_past, order_key};
use super::slots::{self, is_note};
use super::subject::{FAR, TOP, cosine, move_places};
use super::text;
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

/// Moves each note that marks a change above the first older note before
/// it (of an access level no higher) that it replaces, among the first
/// [`TOP`] places: any older note when the changed note is near the
/// question itself, else an older near note whose value it names
/// ([`names_what_it_replaces`]). Returns how many places changed hands.
pub fn changes_first(question: &str, ranked: &mut Vec<(Checked, f32)>) -> usize {
    if asks_past(question) {
        return 0;
    }
    let n = ranked.len().min(TOP);
    // Each place's memory judged once: the loop below asks again and again.
    let notes: Vec<bool> = (ranked.iter().take(n))
        .map(|(c, _)| is_note(&c.cand.memory))
        .collect();
    let best = ((0..n).filter(|&i| notes[i]))
        .map(|i| cosine(&ranked[i].0))
        .fold(0.0, f32::max);
    let near = |i: usize| notes[i] && cosine(&ranked[i].0) >= best - FAR;
    let asked: HashSet<String> = slots::tokens(question).into_iter().collect();
    let mut order: Vec<usize> = (0..n).collect();
    for b in 0..n {
        let i = order[b];
        let words = slots::fact_tokens(&ranked[i].0.cand.memory.content);
        if !notes[i] || !says_change(&words) {
            continue;
        }
        let newer = order_key(&ranked[i].0.cand.memory);
        // What the newer note is about: its first name run.
        let runs = text::name_runs(&ranked[i].0.cand.memory.content);
        let about = runs.first().map_or(&[][..], Vec::as_slice);
        let replaces = |j: &usize| {
            let k = order_key(&ranked[*j].0.cand.memory);
            let older = notes[*j] && (k.1, k.2) < (newer.1, newer.2) && k.0 <= newer.0;
            let old = &ranked[*j].0.cand.memory.content;
            older && (near(i) || near(*j) && names_what_it_replaces(old, (about, &words), &asked))
        };
        if let Some(a) = order[..b].iter().position(replaces) {
            let i = order.remove(b);
            order.insert(a, i);
        }
    }
    move_places(ranked, &order)
}

/// Whether a note that says it is news (`about`, its first name run, and
/// its `words`) names the older note's value: a
/// word of one of the older note's names after its first (the first is
/// what the note is about, "Lena's manager …"), that is not what the
/// newer note is about (its own first name: "Lena's on an iPhone 15 now"
/// replaces nothing of "friends call her Lena") and that the question did
/// not ask. "Reports to Anita Shah now; Greg went to the Denver office"
/// replaces "Lena's manager at work is Greg Pollard" although MiniLM puts
/// it far from "Who's her boss?": a writer noting a change says what it
/// replaces.
fn names_what_it_replaces(
    older: &str,
    (about, words): (&[String], &[String]),
    asked: &HashSet<String>,
) -> bool {
    let runs = text::name_runs(older);
    (runs.iter().skip(1).flatten())
        .any(|w| !asked.contains(w) && !about.contains(w) && words.contains(w))
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
    fn a_far_note_that_names_the_older_value_rises_above_it() {
        let mut r = vec![
            at(
                fact(
                    "greg",
                    "Lena's manager at work is Greg Pollard.",
                    Some(0.54),
                ),
                10,
            ),
            at(
                fact("corvid", "Elena works at Corvid Freight.", Some(0.44)),
                5,
            ),
            at(fact("phone", "Lena's on an iPhone 15 now.", Some(0.40)), 15),
            at(
                fact(
                    "anita",
                    "Reports to Anita Shah now; Greg went to Denver.",
                    Some(0.35),
                ),
                20,
            ),
        ];
        // "Lena" is what the manager note is about, not its value, and what
        // the phone note is about: it stays; the note naming Greg rises
        // above his.
        assert_eq!(changes_first("Who's her boss?", &mut r), 4);
        assert_eq!(ids(&r), ["anita", "greg", "corvid", "phone"]);
        // A name the question asks is no replaced value.
        let mut r = vec![r[1].clone(), r[0].clone()];
        assert_eq!(changes_first("Is Greg still her boss?", &mut r), 0);
        assert_eq!(ids(&r), ["greg", "anita"]);
        // The user's own name, later in the older note, is what the newer
        // note is about.
        let mut r = vec![
            at(
                fact(
                    "name",
                    "User's name is Elena Marsh; they call her Lena.",
                    Some(0.41),
                ),
                10,
            ),
            at(fact("phone", "Lena's on an iPhone 15 now.", Some(0.30)), 20),
        ];
        assert_eq!(changes_first("What are her kids called?", &mut r), 0);
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
