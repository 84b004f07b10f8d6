//! Stage 4b, multi-hop questions only: the first slots hold memories that
//! complete one another. A two-hop question needs two memories (the film's
//! page and its director's), and ranking each candidate alone fills the
//! #2 with another near-copy of the #1's half of the question. Here the
//! fusion's #1 opens the answer, and each next slot goes to the candidate
//! whose vector, added to the slots already chosen, resembles the question
//! most, plus a share of its own Stage 4 score (relative to the best) so a
//! weak memory does not win on coverage alone. No model runs: the
//! memories' stored vectors and the query's (the vector list already
//! embedded it) are enough.
//!
//! Chosen leave-one-dataset-out on the dev sets (docs/benchmarks.md,
//! "Complementary slots"): R@1 and R@2 up on 2Wiki, HotpotQA and MuSiQue,
//! LoCoMo untouched (its questions route simple).

use std::collections::HashSet;

use engram_common::settings::ComplementSettings;
use engram_proto::Memory;
use tokio::time::Instant;

use super::ctx::{Ctx, StageTrace};
use super::later::{Vectors, read_vectors};
use super::text::{self, comparative, lower_words};
use super::validate::{Checked, best_fused};

/// The degraded-stage name when the memories' vectors could not be read.
pub const COMPLEMENT: &str = "complement";

/// What takes the place after the slots, beside the slots' own choice.
#[derive(Debug, Clone, Copy, Default)]
pub struct After<'a> {
    /// The simple reading's first (Stage 2's `Candidates::hedge_opt`).
    pub hedge_opt: Option<&'a str>,
    /// The second search's finds, best first (hop.rs).
    pub hop: &'a [String],
    /// A clause question's memory of the clause (hop.rs `Found::opens_opt`):
    /// it opens the slots in the fusion's #1's stead, and the second
    /// search's find takes the place right after it.
    pub opening_opt: Option<&'a str>,
}

/// Stage 4b: the slots, then the place after them: the hedge, then the
/// next hop's find, which pushes the hedge one down.
pub async fn run(
    ctx: &mut Ctx<'_>,
    trace: &mut StageTrace,
    ranked: &mut [(Checked, f32)],
    query_opt: Option<&[f32]>,
    prefetched: Vectors,
    after: After<'_>,
) {
    let by_clause = slots(ctx, trace, ranked, query_opt, prefetched, after.opening_opt).await;
    let at = ctx.settings.pipeline.complement.slots;
    hedge(ranked, after.hedge_opt, at);
    // A clause's memory opened the slots: the find its name led to is the
    // chain's next memory, right after it.
    next_hop(ranked, after.hop, if by_clause { 1 } else { at });
}

/// Reorders the head of `ranked` (best first, each with its Stage 4
/// score) when the settings ask for it, with the vectors Stage 2 read (or,
/// when it did not, read here); on a failed read the order stands and the
/// stage is reported degraded. Whether a clause's memory opened the slots.
async fn slots(
    ctx: &mut Ctx<'_>,
    trace: &mut StageTrace,
    ranked: &mut [(Checked, f32)],
    query_opt: Option<&[f32]>,
    prefetched: Vectors,
    opening_opt: Option<&str>,
) -> bool {
    let c = &ctx.settings.pipeline.complement;
    let pool = c.pool.min(ranked.len());
    let (Some(query), true) = (query_opt, pool >= 2) else {
        return false;
    };
    let t = Instant::now();
    let read = match prefetched {
        Vectors::NotRead => {
            let ids = (ranked[..pool].iter())
                .map(|(k, _)| k.cand.memory.id.clone())
                .collect();
            read_vectors(ctx, ids, ctx.deadline).await
        }
        done => done,
    };
    let Vectors::Read(vectors) = read else {
        trace.degraded.push(COMPLEMENT.into());
        return false;
    };
    let head = &mut ranked[..pool];
    let (order, by_clause) = {
        let bridging = c.bridge_weight > 0.0 && !comparative(&ctx.query.text);
        let asked = if bridging {
            lower_words(&ctx.query.text)
        } else {
            HashSet::new()
        };
        let slots: Vec<Slot<'_>> = (head.iter())
            .map(|(k, score)| Slot {
                vector_opt: vectors.get(&k.cand.memory.id).map(Vec::as_slice),
                score: *score,
                names: if bridging {
                    names_beyond(&k.cand.memory, &asked)
                } else {
                    HashSet::new()
                },
            })
            .collect();
        let (first, by_clause) = opening(head, opening_opt);
        (choose(query, &slots, first, c), by_clause)
    };
    apply(head, &order);
    keep_scores_descending(head);
    ctx.timed(COMPLEMENT, t);
    by_clause && !order.is_empty()
}

/// The hedge: the simple reading's #1 (`id_opt`, Stage 2's
/// `Candidates::hedge_opt`) takes index `at` (the place after the slots;
/// the next hop's find then pushes it one down) when the answer holds it
/// lower. A multi-hop answer is graph-led, and the
/// graph can miss the page a question names (a name it does not link:
/// "the Tikhaya Sosna" against the page "Tikhaya Sosna River"); the dense
/// and keyword lists then agree on a page the multi-hop weights leave out
/// of the top 10. One place, after the slots, so the chain they chose
/// stands.
pub fn hedge(ranked: &mut [(Checked, f32)], id_opt: Option<&str>, at: usize) {
    let Some(id) = id_opt else { return };
    if let Some(pos) = ranked.iter().position(|(k, _)| k.cand.memory.id == id) {
        lift_to(ranked, pos, at);
    }
}

/// The next hop: the first of the second search's finds (best first,
/// hop.rs) that is in the answer but not in its first `at` places takes
/// place `at`.
pub fn next_hop(ranked: &mut [(Checked, f32)], hop: &[String], at: usize) {
    let pos_of = |id: &String| ranked.iter().position(|(k, _)| &k.cand.memory.id == id);
    // A find Stage 3 dropped is in no place: the next one is tried.
    if let Some(pos) = hop.iter().filter_map(pos_of).find(|&pos| pos >= at) {
        lift_to(ranked, pos, at);
    }
}

/// Moves `ranked[pos]` up to `at` (nothing when it is there or higher, or
/// `at` is past the end); the scores stay with the places, so they still
/// fall with rank and no two places tie that did not.
fn lift_to<T>(ranked: &mut [(T, f32)], pos: usize, at: usize) {
    if pos <= at || pos >= ranked.len() {
        return;
    }
    let scores: Vec<f32> = ranked[at..=pos].iter().map(|(_, s)| *s).collect();
    ranked[at..=pos].rotate_right(1);
    for ((_, s), score) in ranked[at..=pos].iter_mut().zip(scores) {
        *s = score;
    }
}

/// The head's own scores, highest first, dealt to its places in order, so
/// scores still fall with rank: callers, and the agentic merge (stable
/// sorts by score), would otherwise undo the order. No two places tie
/// that did not (raising each to the best below it showed the demo's
/// five answers at one score), and the head's last is still at least
/// every score after the head, the head being the best by score.
fn keep_scores_descending<T>(head: &mut [(T, f32)]) {
    let mut scores: Vec<f32> = head.iter().map(|(_, s)| *s).collect();
    scores.sort_by(|a, b| b.total_cmp(a));
    for ((_, s), score) in head.iter_mut().zip(scores) {
        *s = score;
    }
}

/// Which of the head opens the answer: a clause question's memory of the
/// clause when hop.rs chose it to open ([`After::opening_opt`]) and the
/// head holds it, else [`fused_first`]. Also whether the clause's memory
/// is the one.
fn opening(head: &[(Checked, f32)], id_opt: Option<&str>) -> (usize, bool) {
    let clause_opt = id_opt.and_then(|id| head.iter().position(|(k, _)| k.cand.memory.id == id));
    match clause_opt {
        Some(i) => (i, true),
        None => (fused_first(head), false),
    }
}

/// Which of the head opens the answer otherwise: the fusion's best (highest fused
/// score), not necessarily Stage 4's. The ranker lifts memories linked from
/// the fused #1, which helps them into the top few but sometimes over the
/// #1 itself: the dev sets' R@1 was 2.5–3 points below the fusion alone's
/// on 2Wiki, HotpotQA and MuSiQue; with the fused #1 first it is the
/// fusion's (docs/benchmarks.md, "Complementary slots").
fn fused_first(head: &[(Checked, f32)]) -> usize {
    best_fused(head.iter().map(|(k, _)| k)).unwrap_or(0)
}

/// One candidate of the head, as the choice sees it.
pub struct Slot<'a> {
    /// Its stored vector, when the read returned one.
    pub vector_opt: Option<&'a [f32]>,
    /// Its Stage 4 score.
    pub score: f32,
    /// Its names the question does not say (empty when bridging is off).
    pub names: HashSet<String>,
}

/// The chosen slots, as indices into the head: `first`, then greedily the
/// candidate that best completes the slots so far: the cosine of the query
/// to the slots' summed vectors, plus its own score relative to the best,
/// plus its bridge to the slots already chosen relative to the best
/// bridge. Empty when nothing can be chosen (no vector for `first`, a best
/// score that is not positive, a query of another dimension): the order
/// then stands.
pub fn choose(
    query: &[f32],
    head: &[Slot<'_>],
    first: usize,
    c: &ComplementSettings,
) -> Vec<usize> {
    let dim = query.len();
    let top_score = head
        .iter()
        .map(|s| s.score)
        .fold(f32::NEG_INFINITY, f32::max);
    let Some(opening) = head.get(first).and_then(|s| s.vector_opt) else {
        return Vec::new();
    };
    if dim == 0 || opening.len() != dim || !(top_score.is_finite() && top_score > 0.0) {
        return Vec::new();
    }
    let mut chosen = vec![first];
    let mut sum: Vec<f32> = opening.to_vec();
    let query_norm = norm(query);
    while chosen.len() < c.slots.min(head.len()) {
        let open: Vec<(usize, &[f32])> = (0..head.len())
            .filter(|j| !chosen.contains(j))
            .filter_map(|j| Some((j, head[j].vector_opt.filter(|v| v.len() == dim)?)))
            .collect();
        let bridges = bridges(head, &chosen, &open);
        let best_opt = (open.iter().zip(&bridges))
            .map(|(&(j, v), bridge)| {
                let fit = cosine_of_sum(query, query_norm, &sum, v);
                let own = c.score_weight * head[j].score / top_score;
                (j, v, fit + own + c.bridge_weight * bridge)
            })
            .filter(|(_, _, s)| s.is_finite())
            .max_by(|a, b| a.2.total_cmp(&b.2).then(b.0.cmp(&a.0)));
        let Some((j, v, _)) = best_opt else { break };
        sum.iter_mut().zip(v).for_each(|(s, x)| *s += x);
        chosen.push(j);
    }
    chosen
}

/// Each open candidate's bridge: the most names it shares with one chosen
/// slot, over the most any open candidate shares (0..=1; all 0 when none
/// shares any). A two-hop chain's second memory names what its first
/// names and the question does not ("Finland" in a singer's page and in
/// the Finnish markka's); a memory that only echoes the question's words
/// shares none of those.
fn bridges(head: &[Slot<'_>], chosen: &[usize], open: &[(usize, &[f32])]) -> Vec<f32> {
    let shared: Vec<usize> = (open.iter())
        .map(|&(j, _)| {
            (chosen.iter())
                .map(|&c| head[j].names.intersection(&head[c].names).count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let most = shared.iter().copied().max().unwrap_or(0);
    (shared.iter())
        .map(|&n| {
            if most > 0 {
                n as f32 / most as f32
            } else {
                0.0
            }
        })
        .collect()
}

/// A memory's names (its title's and content's capitalised words,
/// lowercased) that the question does not say.
fn names_beyond(m: &Memory, asked: &HashSet<String>) -> HashSet<String> {
    text::names(m, asked).collect()
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

/// cos(query, sum + v), without building sum + v.
fn cosine_of_sum(query: &[f32], query_norm: f32, sum: &[f32], v: &[f32]) -> f32 {
    let (mut dot, mut joined_sq) = (0.0f32, 0.0f32);
    for ((q, s), x) in query.iter().zip(sum).zip(v) {
        let joined = s + x;
        dot += q * joined;
        joined_sq += joined * joined;
    }
    let denominator = query_norm * joined_sq.sqrt();
    if denominator > 0.0 {
        dot / denominator
    } else {
        0.0
    }
}

/// Moves the chosen to the front in their chosen order; the rest keep
/// theirs. `at` follows which original index sits where.
fn apply<T>(head: &mut [T], order: &[usize]) {
    let mut at: Vec<usize> = (0..head.len()).collect();
    for (slot, original) in order.iter().enumerate() {
        let Some(offset) = at[slot..].iter().position(|i| i == original) else {
            continue;
        };
        let now = slot + offset;
        head[slot..=now].rotate_right(1);
        at[slot..=now].rotate_right(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranked(ids: &[&str]) -> Vec<(Checked, f32)> {
        (ids.iter().enumerate())
            .map(|(i, id)| {
                let m = Memory {
                    id: id.to_string(),
                    ..Default::default()
                };
                (Checked::passed(m, 0.0), 10.0 - i as f32)
            })
            .collect()
    }

    fn order(r: &[(Checked, f32)]) -> Vec<&str> {
        r.iter().map(|(c, _)| c.cand.memory.id.as_str()).collect()
    }

    #[test]
    fn the_next_hop_is_the_first_find_the_slots_lack_and_the_hedge_follows_it() {
        let mut r = ranked(&["a", "b", "c", "d", "e", "f"]);
        hedge(&mut r, Some("f"), 3);
        assert_eq!(order(&r), ["a", "b", "c", "f", "d", "e"]);
        // The search's own #1 is the first memory: the next find goes up.
        next_hop(&mut r, &["a".into(), "e".into()], 3);
        assert_eq!(order(&r), ["a", "b", "c", "e", "f", "d"]);
        // Finds the slots hold already, or none in the answer: no move.
        next_hop(&mut r, &["b".into(), "zz".into()], 3);
        assert_eq!(order(&r), ["a", "b", "c", "e", "f", "d"]);
        hedge(&mut r, None, 3);
        assert_eq!(order(&r), ["a", "b", "c", "e", "f", "d"]);
        let scores: Vec<f32> = r.iter().map(|(_, s)| *s).collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    }

    #[test]
    fn a_clause_memory_in_the_head_opens_it_and_its_find_follows_it() {
        let r = ranked(&["billing", "atlas", "acme", "alice"]);
        assert_eq!(opening(&r, Some("atlas")), (1, true));
        // Not in the head, or none chosen: the fusion's best opens.
        assert!(!opening(&r, Some("zz")).1);
        assert!(!opening(&r, None).1);
        // Slots [atlas, billing, acme]: the find its name led to is next.
        let mut r = ranked(&["atlas", "billing", "acme", "alice"]);
        next_hop(&mut r, &["alice".into()], 1);
        assert_eq!(order(&r), ["atlas", "alice", "billing", "acme"]);
    }

    #[test]
    fn the_hedge_takes_the_place_after_the_slots_and_scores_still_fall() {
        let mut ranked: Vec<(char, f32)> =
            ('a'..='f').zip([6.0, 5.0, 4.0, 3.0, 2.0, 1.0]).collect();
        lift_to(&mut ranked, 5, 3);
        let order: String = ranked.iter().map(|(c, _)| *c).collect();
        assert_eq!(order, "abcfde");
        let scores: Vec<f32> = ranked.iter().map(|(_, s)| *s).collect();
        assert_eq!(scores, [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]);
        // Already at the place or above it, or a place past the end: no move.
        for (pos, at) in [(3, 3), (1, 3), (5, 9)] {
            let before = ranked.clone();
            lift_to(&mut ranked, pos, at);
            assert_eq!(ranked, before);
        }
    }

    fn settings(slots: usize, score_weight: f32) -> ComplementSettings {
        ComplementSettings {
            pool: 10,
            slots,
            score_weight,
            bridge_weight: 0.0,
            hedge: true,
            hop_names: 4,
            hop_depth: 2,
        }
    }

    /// The choice without names: vectors and scores alone.
    fn choose_plain(
        query: &[f32],
        vectors: &[Option<&[f32]>],
        scores: &[f32],
        first: usize,
        c: &ComplementSettings,
    ) -> Vec<usize> {
        let head: Vec<Slot<'_>> = (vectors.iter().zip(scores))
            .map(|(v, s)| Slot {
                vector_opt: *v,
                score: *s,
                names: HashSet::new(),
            })
            .collect();
        choose(query, &head, first, c)
    }

    use super::super::text::page as memory;

    #[test]
    fn names_are_capitalised_words_the_question_does_not_say() {
        let asked = lower_words("What currency predated the Euro in the country Signmark is from?");
        let m = memory(
            "Signmark",
            "Signmark (born Marko Vuoriheimo) is a Finnish rapper. The first deaf artist signed by Warner-Music.",
        );
        let names = names_beyond(&m, &asked);
        let mut sorted: Vec<&str> = names.iter().map(String::as_str).collect();
        sorted.sort_unstable();
        // Not "signmark" (the question says it), not "the" / "first"
        // (filler), not "rapper" (lower case).
        assert_eq!(
            sorted,
            vec!["finnish", "marko", "vuoriheimo", "warner-music"]
        );
        // A huge memory is read only so far.
        let late = format!("{}Finland", "word ".repeat(text::SCAN_BYTES / 5));
        assert!(names_beyond(&memory("", &late), &asked).is_empty());
        let early = format!("Finland {}", "word ".repeat(text::SCAN_BYTES / 5));
        assert_eq!(names_beyond(&memory("", &early), &asked).len(), 1);
    }

    #[test]
    fn the_bridge_lifts_the_memory_that_shares_the_first_slots_names() {
        // #1 is the singer's page; the generic "Euro" page resembles the
        // question more than the markka's, which shares "Finnish" with #1.
        let q = unit([1.0, 1.0, 0.0]);
        let singer = unit([1.0, 0.0, 0.2]);
        let euro = unit([0.2, 1.0, 0.0]);
        let markka = unit([0.1, 0.8, 0.6]);
        let asked = lower_words("What currency predated the Euro in the country Signmark is from?");
        let pages = [
            memory("Signmark", "A Finnish rapper from Helsinki."),
            memory("Euro", "The Euro is the currency of the Eurozone."),
            memory(
                "Finnish markka",
                "The Finnish markka was the currency of Finland.",
            ),
        ];
        let head: Vec<Slot<'_>> = [&singer, &euro, &markka]
            .iter()
            .zip(&pages)
            .zip([0.9, 0.8, 0.7])
            .map(|((v, m), score)| Slot {
                vector_opt: Some(v.as_slice()),
                score,
                names: names_beyond(m, &asked),
            })
            .collect();
        let mut c = settings(2, 0.5);
        assert_eq!(choose(&q, &head, 0, &c), vec![0, 1]);
        c.bridge_weight = 0.2;
        assert_eq!(choose(&q, &head, 0, &c), vec![0, 2]);
    }

    fn unit(v: [f32; 3]) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    #[test]
    fn the_second_slot_goes_to_what_the_first_lacks() {
        // The question asks about a and b; #1 is about a, #2 is another
        // copy of a, #3 is about b.
        let q = unit([1.0, 1.0, 0.0]);
        let a = unit([1.0, 0.0, 0.1]);
        let a2 = unit([1.0, 0.05, 0.1]);
        let b = unit([0.0, 1.0, 0.1]);
        let vecs = [Some(a.as_slice()), Some(a2.as_slice()), Some(b.as_slice())];
        let scores = [0.9, 0.85, 0.8];
        assert_eq!(
            choose_plain(&q, &vecs, &scores, 0, &settings(2, 0.8)),
            vec![0, 2]
        );
        // A heavy weight on the own score keeps Stage 4's order.
        assert_eq!(
            choose_plain(&q, &vecs, &scores, 0, &settings(2, 10.0)),
            vec![0, 1]
        );
        assert_eq!(
            choose_plain(&q, &vecs, &scores, 0, &settings(3, 0.8)),
            vec![0, 2, 1]
        );
        // Opening with another (the fusion's #1): its complement follows.
        assert_eq!(
            choose_plain(&q, &vecs, &scores, 2, &settings(2, 0.8)),
            vec![2, 0]
        );
    }

    #[test]
    fn nothing_is_chosen_without_a_usable_first() {
        let q = unit([1.0, 1.0, 0.0]);
        let a = unit([1.0, 0.0, 0.0]);
        let s = settings(2, 0.8);
        assert!(choose_plain(&q, &[None, Some(a.as_slice())], &[0.9, 0.8], 0, &s).is_empty());
        assert!(choose_plain(&q, &[Some(a.as_slice())], &[0.9], 3, &s).is_empty());
        let vecs = [Some(a.as_slice()), Some(a.as_slice())];
        assert!(choose_plain(&q, &vecs, &[0.0, -0.8], 0, &s).is_empty());
        assert!(choose_plain(&q[..2], &vecs, &[0.9, 0.8], 0, &s).is_empty());
        // A candidate without a vector, or of another dimension, is passed over.
        let short = [1.0f32, 0.0];
        let vecs = [Some(a.as_slice()), None, Some(&short[..])];
        assert_eq!(choose_plain(&q, &vecs, &[0.9, 0.8, 0.7], 0, &s), vec![0]);
    }

    #[test]
    fn the_choice_is_bounded_and_breaks_ties_by_rank() {
        // Identical candidates: every tie goes to the better-ranked one.
        let v = unit([1.0, 0.0, 0.0]);
        let vecs = vec![Some(v.as_slice()); 8];
        let scores = [0.5; 8];
        let chosen = choose_plain(&v, &vecs, &scores, 0, &settings(3, 0.8));
        assert_eq!(chosen, vec![0, 1, 2]);
        // Never more slots than asked for or candidates there are.
        assert_eq!(
            choose_plain(&v, &vecs[..2], &scores[..2], 0, &settings(5, 0.8)).len(),
            2
        );
    }

    #[test]
    fn scores_fall_with_rank_after_the_move_and_none_tie_that_did_not() {
        let mut head = vec![('a', 0.9), ('c', 0.7), ('b', 0.8), ('d', 0.6)];
        keep_scores_descending(&mut head);
        assert_eq!(head, vec![('a', 0.9), ('c', 0.8), ('b', 0.7), ('d', 0.6)]);
        let mut head = vec![('f', 0.85), ('x', 0.9), ('c', 0.5)];
        keep_scores_descending(&mut head);
        assert_eq!(head, vec![('f', 0.9), ('x', 0.85), ('c', 0.5)]);
        // The best scored last (the demo's first question): five places,
        // five scores.
        let mut head = vec![('a', 0.3), ('b', 0.5), ('c', 0.4), ('d', 0.2), ('e', 0.82)];
        keep_scores_descending(&mut head);
        let scores: Vec<f32> = head.iter().map(|(_, s)| *s).collect();
        assert_eq!(scores, [0.82, 0.5, 0.4, 0.3, 0.2]);
    }

    #[test]
    fn apply_moves_the_chosen_up_and_keeps_the_rest_in_order() {
        let mut head = vec!['a', 'b', 'c', 'd', 'e'];
        apply(&mut head, &[0, 3, 1]);
        assert_eq!(head, vec!['a', 'd', 'b', 'c', 'e']);
        let mut head = vec!['a', 'b', 'c', 'd', 'e'];
        apply(&mut head, &[0, 4]);
        assert_eq!(head, vec!['a', 'e', 'b', 'c', 'd']);
        let mut head = vec!['a', 'b', 'c'];
        apply(&mut head, &[2]);
        assert_eq!(head, vec!['c', 'a', 'b']);
    }
}
