//! Stage 4c's first step, a subject's facts by what they say about it: when
//! several short memories near the top of an answer all name everything the
//! question names ("Who heads Martins Bank?" against "The headquarters of
//! Martins Bank are in …", "The CEO of Martins Bank is …"), the keyword and
//! graph lists rank them by that shared name, which tells them apart not at
//! all; what does is how close each one's meaning is to the question. So
//! these memories swap places among themselves by their query cosine, and
//! nothing else moves. Passages (longer than a fact), titled pages and
//! conversation turns (their speaker is not their subject) are never
//! reordered.
//!
//! A question that asks for a name ("Who heads Martins Bank?", "Which
//! company employs K. Narayanan?") puts the facts that offer one before
//! those that do not (wants.rs): closeness alone ranks "… works as a
//! nurse" and "… has its head office in Samarkand" above the fact that
//! answers.
//!
//! A fact that holds the question's name only inside a longer one
//! ("Florence Green …" for "Florence", "Cedar County" and "Vilnius" for
//! "Vilnius County") is about something else, and goes after those that
//! name it whole.
//!
//! Before that, `near_first`: a note far from the question's meaning does
//! not lead one close to it, whatever the keyword and graph lists said.
//!
//! A leaf over the validated candidates: the places stay, so the scores
//! still fall with rank.

use std::collections::HashSet;

use super::slots::is_note;
use super::strategy::Strategy;
use super::text::{collect_words, name_runs, query_words};
use super::validate::Checked;
use super::wants::Wants;

/// The places looked at, from the top: where the answer's first line is
/// decided.
pub const TOP: usize = 10;

/// How far below the closest note's query cosine a note may sit and still
/// lead the notes farther than that. On the dev sets (docs/decisions.md,
/// "Far notes"): 0.08 to 0.15 give the same answers; 0.05 lets a version
/// rise over the current one on the streams, 0.2 frees too little.
pub const FAR: f32 = 0.1;

/// Among the first [`TOP`] places, the notes whose query cosine is more
/// than [`FAR`] below the closest note's (or that the dense list did not
/// return at all) go below the notes near it, each group in the order it
/// had; passages, pages and turns keep their places. In a tenant of short
/// notes the keyword list matches a question's small words ("What handset
/// does she carry these days?" finds "… carries an EpiPen") and the graph
/// every note naming the user; neither may put a note the question's
/// meaning is far from above one it is close to. Returns how many places
/// changed hands.
pub fn near_first(ranked: &mut Vec<(Checked, f32)>) -> usize {
    let n = ranked.len().min(TOP);
    let places: Vec<usize> = (0..n)
        .filter(|&i| is_note(&ranked[i].0.cand.memory))
        .collect();
    let best = (places.iter())
        .map(|&i| cosine(&ranked[i].0))
        .fold(0.0, f32::max);
    let near = |i: &usize| cosine(&ranked[*i].0) >= best - FAR;
    let (mut order, far): (Vec<usize>, Vec<usize>) = places.iter().copied().partition(near);
    order.extend(far);
    let mut from: Vec<usize> = (0..n).collect();
    for (&place, &f) in places.iter().zip(&order) {
        from[place] = f;
    }
    move_places(ranked, &from)
}

/// Reorders the subject's facts among the first [`TOP`] places; returns how
/// many places changed hands.
pub fn order(question: &str, ranked: &mut Vec<(Checked, f32)>) -> usize {
    let (names, _) = query_words(question);
    if names.is_empty() {
        return 0;
    }
    let n = ranked.len().min(TOP);
    let places: Vec<usize> = (0..n).filter(|&i| about(&ranked[i].0, &names)).collect();
    if places.len() < 2 {
        return 0;
    }
    let wants = Wants::of(question);
    let runs = name_runs(question);
    // Each place's key once: (names the subject as the question does,
    // offers what is asked, query cosine).
    let key = |i: usize| {
        let c = &ranked[i].0;
        let content = &c.cand.memory.content;
        (
            names_whole(content, &runs),
            wants.offered_by(content, &names),
            cosine(c),
        )
    };
    let keys: Vec<(bool, bool, f32)> = (0..n).map(key).collect();
    let mut by_closeness = places.clone();
    // Stable: equal keys keep the fused order.
    by_closeness.sort_by(|&a, &b| {
        let ((wa, fa, ca), (wb, fb, cb)) = (keys[a], keys[b]);
        wb.cmp(&wa).then(fb.cmp(&fa)).then(cb.total_cmp(&ca))
    });
    // from[place]: the place whose memory lands there.
    let mut from: Vec<usize> = (0..n).collect();
    for (&place, &f) in places.iter().zip(&by_closeness) {
        from[place] = f;
    }
    move_places(ranked, &from)
}

/// Puts the memory of place `from[i]` at place `i` for the first
/// `from.len()` places; the scores stay with the places, so they still fall
/// with rank. Returns how many places changed hands.
pub(super) fn move_places(ranked: &mut Vec<(Checked, f32)>, from: &[usize]) -> usize {
    let n = from.len();
    let moved = (0..n).filter(|&i| from[i] != i).count();
    if moved == 0 {
        return 0;
    }
    let scores: Vec<f32> = ranked.iter().take(n).map(|(_, s)| *s).collect();
    let mut head: Vec<Option<Checked>> = ranked.drain(..n).map(|(c, _)| Some(c)).collect();
    let tail = std::mem::take(ranked);
    let moved_in = (from.iter()).filter_map(|&f| head.get_mut(f).and_then(Option::take));
    ranked.extend(moved_in.zip(scores));
    ranked.extend(tail);
    moved
}

/// A short untitled memory, not a turn, whose words hold every name of
/// the question. A titled page is about its title, which the question may
/// name without the page being the answer's subject.
fn about(c: &Checked, names: &HashSet<String>) -> bool {
    let m = &c.cand.memory;
    if !is_note(m) {
        return false;
    }
    let mut have = HashSet::new();
    collect_words(&m.content, &mut have);
    names.iter().all(|w| have.contains(w))
}

/// Whether each of the question's names (`runs`, text::name_runs) is a
/// whole name in `content`, not part of a longer one: "Florence Green is
/// the mayor of Pamplona" holds the words of "Florence" but is not about
/// it, nor is "Vilnius is the capital of Cedar County" about "Vilnius
/// County".
fn names_whole(content: &str, runs: &[Vec<String>]) -> bool {
    let have = name_runs(content);
    runs.iter().all(|r| have.contains(r))
}

/// The memory's cosine to the question from the dense list (0 when dense
/// search did not return it: it was farther than all it did return).
pub(super) fn cosine(c: &Checked) -> f32 {
    (c.cand.fused.hits.iter())
        .filter(|h| Strategy::Vector.credited(h))
        .map(|h| h.score)
        .fold(0.0, f32::max)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::pipeline::fusion::Fused;
    use crate::pipeline::search::Candidate;
    use engram_proto::{Memory, StrategyHit};

    pub(in crate::pipeline) fn fact(id: &str, content: &str, cos: Option<f32>) -> (Checked, f32) {
        let hits = (cos.iter())
            .map(|&score| StrategyHit {
                strategy: Strategy::Vector.name().into(),
                rank: 1,
                score,
            })
            .collect();
        let cand = Candidate {
            memory: Memory {
                id: id.into(),
                content: content.into(),
                ..Default::default()
            },
            fused: Fused {
                id: id.into(),
                rrf: 0.0,
                hits,
            },
            via_entities: Vec::new(),
        };
        let c = Checked {
            cand,
            temporal: 1.0,
            confidence: 1.0,
            relevance_opt: None,
            checks: Vec::new(),
        };
        (c, 0.0)
    }

    pub(in crate::pipeline) fn ids(r: &[(Checked, f32)]) -> Vec<&str> {
        r.iter().map(|(c, _)| c.cand.memory.id.as_str()).collect()
    }

    #[test]
    fn the_subjects_facts_swap_places_by_closeness_only() {
        let mut r = vec![
            fact(
                "hq",
                "The headquarters of Martins Bank are in Prague.",
                Some(0.6),
            ),
            fact(
                "other",
                "Metzler Bank has its head office in Waterford.",
                Some(0.9),
            ),
            fact(
                "ceo",
                "The CEO of Martins Bank is Lesley Selander.",
                Some(0.8),
            ),
        ];
        assert_eq!(order("Who heads Martins Bank?", &mut r), 2);
        // "other" does not name Martins: it keeps its place.
        assert_eq!(ids(&r), ["ceo", "other", "hq"]);
    }

    #[test]
    fn a_fact_holding_the_name_inside_a_longer_one_goes_after() {
        let mut r = vec![
            fact(
                "green",
                "Florence Green is the mayor of Pamplona.",
                Some(0.8),
            ),
            fact(
                "gallu",
                "Florence is governed by mayor Matthew Gallu.",
                Some(0.7),
            ),
        ];
        assert_eq!(order("Who holds the mayoralty of Florence?", &mut r), 2);
        assert_eq!(ids(&r), ["gallu", "green"]);
        let mut r = vec![
            fact(
                "cedar",
                "Vilnius is the capital of Cedar County.",
                Some(0.8),
            ),
            fact(
                "palud",
                "Nurbek Palud serves as governor of Vilnius County.",
                Some(0.7),
            ),
        ];
        assert_eq!(order("Who leads Vilnius County as governor?", &mut r), 2);
        assert_eq!(ids(&r), ["palud", "cedar"]);
    }

    #[test]
    fn a_question_for_someone_puts_a_fact_naming_someone_first() {
        let rows = || {
            vec![
                fact("in", "Perth is located in Australia.", Some(0.63)),
                fact("job", "Perth is a large port city.", Some(0.6)),
                fact(
                    "mayor",
                    "Margaret Paleologa is the mayor of Perth.",
                    Some(0.55),
                ),
            ]
        };
        let mut r = rows();
        assert_eq!(order("Who runs the city government of Perth?", &mut r), 3);
        assert_eq!(ids(&r), ["mayor", "in", "job"]);
        // Not asked for someone: closeness alone.
        let mut r = rows();
        assert_eq!(order("What do we know about Perth?", &mut r), 0);
    }

    #[test]
    fn a_note_far_from_the_question_goes_below_the_near_ones() {
        let mut r = vec![
            fact(
                "epipen",
                "Also allergic to shellfish; carries an EpiPen.",
                None,
            ),
            fact(
                "rain",
                "Asked about the weekend forecast; rain both days.",
                Some(0.22),
            ),
            fact("pixel", "Her phone is a Google Pixel 7.", Some(0.51)),
            fact(
                "iphone",
                "Lena's on an iPhone 15 now, same number.",
                Some(0.46),
            ),
        ];
        let long = format!("A passage {}", "word ".repeat(60));
        r.insert(1, fact("page", &long, Some(0.1)));
        assert_eq!(near_first(&mut r), 4);
        // The passage keeps its place; the notes near the best lead, each
        // group in the order it had.
        assert_eq!(ids(&r), ["pixel", "page", "iphone", "epipen", "rain"]);
        let mut r = vec![
            fact("a", "Dana likes tea.", None),
            fact("b", "Kai rides.", None),
        ];
        assert_eq!(near_first(&mut r), 0, "no dense list, no order to judge by");
    }

    #[test]
    fn passages_turns_and_nameless_questions_stay() {
        let long = format!("Martins Bank {}", "word ".repeat(60));
        let mut r = vec![
            fact("long", &long, Some(0.1)),
            fact(
                "ceo",
                "The CEO of Martins Bank is Lesley Selander.",
                Some(0.8),
            ),
        ];
        assert_eq!(order("Who heads Martins Bank?", &mut r), 0);
        let mut r = vec![
            fact("a", "Martins Bank is in Prague.", Some(0.1)),
            fact("b", "Martins Bank is run by Lesley.", Some(0.8)),
        ];
        assert_eq!(order("who heads it?", &mut r), 0);
        assert_eq!(ids(&r), ["a", "b"]);
        let turn = engram_proto::Turn {
            speaker: "Martins".into(),
            ..Default::default()
        };
        r[0].0.cand.memory.turn = Some(turn);
        assert_eq!(order("Who heads Martins Bank?", &mut r), 0);
    }
}
