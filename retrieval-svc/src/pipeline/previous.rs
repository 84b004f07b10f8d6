//! Stage 4c's last step, what it was before when the change was reworded:
//! "Which gym was she going to before she took up climbing?" names the
//! state that is true now, so the note that states it ("Joined the
//! Edgeworks climbing gym in Fremont") comes first, and the note asked for
//! is the older one it replaced ("Works out at Crunch Fitness on
//! Hawthorne"), which shares no words with it for slots.rs to align.
//!
//! So for a question about the past whose first memory is a short note
//! with no version slots.rs found, the older note among the first
//! [`TOP`] places that is closest in meaning to that first note moves
//! above it, when the two are at least [`SAME_THING`] alike (their stored
//! vectors): a note about the same thing, said before. Nothing else moves
//! and nothing leaves the window; the first note stays right below it.
//!
//! Trust: the older note rises only over a note of an access level no
//! higher than its own (a low-trust writer's note never outranks one it
//! cannot see). One read of the window's stored vectors, only for such
//! questions; a failed read keeps the order and reports `previous`
//! degraded. Chosen leave-one-set-out on the dev sets (docs/benchmarks.md,
//! "What it was before, reworded").

use engram_proto::ConflictPair;
use tokio::time::Instant;

use super::cache::cosine;
use super::ctx::{Ctx, StageTrace};
use super::current::{asks_past, order_key};
use super::later::{Vectors, read_vectors, stage_deadline};
use super::slots::is_note;
use super::subject::{TOP, move_places};
use super::validate::Checked;

/// The stage's name in traces (timed, degraded).
pub const PREVIOUS: &str = "previous";

/// How alike (cosine of the stored vectors) an older note must be to the
/// first one to count as what it replaced. The dev pairs that were asked
/// about sit at 0.57–0.67; an older note about something else that came
/// nearest was at 0.44 ("Leased a blue Hyundai" against "Lease renewed
/// … $2,075 a month"). Any value in 0.45–0.57 gives the same answers on
/// every dev set, whichever two of the three assistant sets choose it.
pub const SAME_THING: f32 = 0.5;

/// Moves the note before the first one above it, for a question about the
/// past; `versions` are the pairs slots.rs judged (a first memory among
/// them was already ordered by current.rs). Returns how many places
/// changed hands.
pub async fn run(
    ctx: &mut Ctx<'_>,
    trace: &mut StageTrace,
    ranked: &mut Vec<(Checked, f32)>,
    versions: &[ConflictPair],
) -> usize {
    let Some(older) = older_notes(&ctx.query.text, ranked, versions) else {
        return 0;
    };
    let t = Instant::now();
    let mut ids: Vec<String> = older.iter().map(|&i| id(ranked, i)).collect();
    ids.push(id(ranked, 0));
    let deadline = stage_deadline(ctx.deadline);
    let read = read_vectors(ctx, ids, deadline).await;
    // Timed whether or not the read answered: a failed read's wait is
    // what the trace must show.
    ctx.timed(PREVIOUS, t);
    let Vectors::Read(vectors) = read else {
        trace.degraded.push(PREVIOUS.into());
        return 0;
    };
    let vector = |i: usize| vectors.get(&id(ranked, i)).map_or(&[][..], Vec::as_slice);
    let alike: Vec<(usize, f32)> = (older.iter())
        .map(|&i| (i, cosine(vector(0), vector(i))))
        .collect();
    promote(ranked, &alike)
}

fn id(ranked: &[(Checked, f32)], i: usize) -> String {
    ranked[i].0.cand.memory.id.clone()
}

/// The places (among the first [`TOP`]) of the notes older than the first
/// memory that may rise above it, when the question asks about the past
/// and the first memory is a note no version pair names; `None` when the
/// step does not apply.
fn older_notes(
    question: &str,
    ranked: &[(Checked, f32)],
    versions: &[ConflictPair],
) -> Option<Vec<usize>> {
    let first = &ranked.first()?.0.cand.memory;
    let paired = |p: &ConflictPair| p.memory_a == first.id || p.memory_b == first.id;
    if !asks_past(question) || !is_note(first) || versions.iter().any(paired) {
        return None;
    }
    let key = order_key(first);
    let older: Vec<usize> = (1..ranked.len().min(TOP))
        .filter(|&i| {
            let m = &ranked[i].0.cand.memory;
            let k = order_key(m);
            is_note(m) && k.0 >= key.0 && (k.1, k.2) < (key.1, key.2)
        })
        .collect();
    (!older.is_empty()).then_some(older)
}

/// Moves the older note most alike to the first (place, cosine) to the
/// top when it is at least [`SAME_THING`] alike; the rest keep their
/// order below it.
fn promote(ranked: &mut Vec<(Checked, f32)>, alike: &[(usize, f32)]) -> usize {
    let best = (alike.iter().copied()).max_by(|a, b| a.1.total_cmp(&b.1));
    let Some((i, score)) = best else {
        return 0;
    };
    if score < SAME_THING || i >= ranked.len() {
        return 0;
    }
    let mut order: Vec<usize> = (0..ranked.len().min(TOP)).collect();
    order.remove(i);
    order.insert(0, i);
    move_places(ranked, &order)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::subject::tests::{fact, ids};

    fn at(id: &str, content: &str, secs: i64, level: i32) -> (Checked, f32) {
        let mut f = fact(id, content, Some(0.5));
        f.0.cand.memory.event_time = Some(prost_types::Timestamp {
            seconds: secs,
            nanos: 0,
        });
        f.0.cand.memory.access_level = level;
        f
    }

    fn gyms() -> Vec<(Checked, f32)> {
        vec![
            at(
                "climb",
                "Joined the Edgeworks climbing gym in Fremont.",
                30,
                0,
            ),
            at("trip", "Back from Lisbon; loved Alfama.", 40, 0),
            at("crunch", "Works out at Crunch Fitness on Hawthorne.", 10, 0),
            at("later", "Booked a spin class for next week.", 50, 0),
        ]
    }

    const PAST: &str = "Which gym was she going to before she took up climbing?";

    #[test]
    fn only_older_notes_of_a_past_question_are_candidates() {
        let r = gyms();
        assert_eq!(older_notes(PAST, &r, &[]), Some(vec![2]));
        assert_eq!(older_notes("Which gym does she go to?", &r, &[]), None);
    }

    #[test]
    fn a_first_note_with_versions_is_left_to_current() {
        let r = gyms();
        let pair = ConflictPair {
            memory_a: "older".into(),
            memory_b: "climb".into(),
            ..Default::default()
        };
        assert_eq!(older_notes(PAST, &r, &[pair]), None);
    }

    #[test]
    fn no_note_rises_over_a_first_of_a_higher_access_level() {
        let mut r = gyms();
        r[0].0.cand.memory.access_level = 1;
        assert_eq!(older_notes(PAST, &r, &[]), None);
    }

    #[test]
    fn the_most_alike_older_note_rises_when_alike_enough() {
        let mut r = gyms();
        assert_eq!(promote(&mut r, &[(2, 0.57)]), 3);
        assert_eq!(ids(&r), ["crunch", "climb", "trip", "later"]);
        let mut r = gyms();
        assert_eq!(promote(&mut r, &[(2, 0.44)]), 0);
        assert_eq!(ids(&r), ["climb", "trip", "crunch", "later"]);
    }
}
