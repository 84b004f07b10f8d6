//! Stage 4d, a chain of facts: "In which country is the head office of the
//! company Saif Ali Khan's spouse works for?" opens with "Saif Ali Khan is
//! married to Jocelyn Lovell", and the next fact is named by that one's
//! value, not by the question. So when the answer's first memory is a short
//! fact that leaves at least two of the question's words unsaid, a keyword
//! search for its value (the names the question does not say) and those
//! words finds the fact about the value; its current version (newest, as
//! Stage 4c orders) is followed the same way, up to [`MAX_HOPS`] times, and
//! the facts found go right after the first one, in chain order. Nothing
//! above them moves; finds pass the same access and filter checks as every
//! candidate.
//!
//! Each hop is one keyword call (the index is in memory) and runs only for
//! such questions; a failed call ends the chain where it is and reports
//! `chain` degraded.

use std::collections::HashSet;

use engram_proto::{Filters, KeywordSearchRequest, Memory};
use tokio::time::Instant;

use super::cache::cosine;
use super::ctx::{Ctx, StageTrace};
use super::current::order_key;
use super::later::{Vectors, later_keyword, stage_deadline, text_and_vectors, time_for_another};
use super::search::Candidate;
use super::slots::{self, is_note};
use super::strategy::Strategy;
use super::text::{
    AUXILIARIES, CLAUSE_LINKS, RELATION_LINKS, capitalised, clause_at, clause_words, lower_words,
    name_runs, names, query_words,
};
use super::validate::{Checked, static_checks};

/// The strategy a chain's find is credited to; its name is the stage's
/// label in traces (timed, degraded).
pub const CHAIN: Strategy = Strategy::Chain;

/// Facts followed past the first, at most (a chain of four facts).
pub const MAX_HOPS: usize = 3;

/// Names of the first fact tried as its value, at most, one keyword call
/// each.
const VALUES_TRIED: usize = 3;

/// Question words the first fact must leave unsaid for a chain to be
/// followed: one is a paraphrase ("heads" against "CEO"), two are a
/// relation the first fact does not state.
const MIN_UNSAID: usize = 2;

/// Finds read per hop, by the value's name alone: in a tenant of 20,000
/// facts a city is named by dozens ("… lives in Bremen"), and the one the
/// question wants ("Bremen is located in Germany") says none of its words;
/// the index ranks the shortest first, and the meaning of what is still
/// unsaid chooses among them.
const K: u32 = 30;

/// What a find told from its value's side gains over one told from
/// another thing's: "Sapporo is a city in Japan" is about Sapporo, "Bill
/// Bennett resides in the city of Sapporo" about Bill Bennett.
const VALUE_SIDE: f32 = 0.1;

/// Words that meet when they share this many leading characters ("lives"
/// and "lived", "citizen" and "citizenship").
const STEM: usize = 5;

/// Follows the chain from the answer's first memory; returns how many
/// facts it placed.
pub async fn run(
    ctx: &mut Ctx<'_>,
    trace: &mut StageTrace,
    ranked: &mut Vec<(Checked, f32)>,
    filters: &Filters,
) -> usize {
    let shape = relates(&ctx.query.text);
    let means_a_clause = shape == Shape::Clause || by_name_clause(&ctx.query.text);
    let clause_opt = clause(&ctx.query.text, shape);
    if let Some(clause) = &clause_opt
        && !trace.is_degraded(Strategy::Keyword)
    {
        let moved = start_by_clause(ctx, ranked, clause).await;
        trace.counts.push(("chain_start_moves", usize::from(moved)));
    }
    let Some(first) = ranked.first().map(|(c, _)| c.cand.memory.clone()) else {
        return 0;
    };
    let (_, terms) = query_words(&ctx.query.text);
    let passed = said_in_passing(&ctx.query.text, clause_opt.as_deref());
    let mut unsaid: HashSet<String> = (unsaid_by(&terms, &first).into_iter())
        .filter(|w| !is_time_word(w) && !passed.contains(w))
        .collect();
    let min_unsaid = match shape {
        Shape::None => usize::MAX,
        Shape::Clause => 1,
        Shape::Link if says_a_link(&ctx.query.text, &first) => 1,
        Shape::Link => MIN_UNSAID,
    };
    if !is_note(&first) || unsaid.len() < min_unsaid || trace.is_degraded(Strategy::Keyword) {
        tracing::debug!(unsaid = unsaid.len(), min_unsaid, "no chain");
        return 0;
    }
    let t = Instant::now();
    let mut seen: HashSet<String> = lower_words(&ctx.query.text);
    let (mut earlier, _) = query_words(&ctx.query.text);
    let kind_opt = answer_kind(&ctx.query.text);
    let mut chain: Vec<Checked> = Vec::new();
    let mut at = first;
    // The find that answers, and goes first: in a clause question, whose
    // first fact means the clause, not what is asked (also one with no
    // link word: "the team Michael Rae plays for"), the first hop's find,
    // or a later one that says a word the question still left unsaid. A
    // chain from a link ("X's chairperson") starts at a fact that may be
    // the answer itself, and stays after it.
    let mut answer = None;
    for _ in 0..MAX_HOPS {
        if unsaid.is_empty() || !time_for_another(ctx.deadline) {
            break;
        }
        // The first name the fact adds is its value, unless the first
        // fact's is said nowhere else ("Mild cat allergy; … before
        // visiting Jess" opens with a word, not a name): then its next.
        let mut found = None;
        let tried = if chain.is_empty() { VALUES_TRIED } else { 1 };
        for value in values_of(&at, &seen).into_iter().take(tried) {
            seen.extend(value.iter().cloned());
            let want = Want {
                value: &value,
                unsaid: &unsaid,
                kind: kind_opt.as_deref(),
                after_hop: !chain.is_empty(),
                earlier: &earlier,
            };
            let text = value.join(" ");
            if let Some(next) = hop(ctx, trace, ranked, &chain, filters, text, want).await {
                found = Some((value, next));
                break;
            }
        }
        let Some((value, next)) = found else {
            break;
        };
        earlier.extend(value.iter().cloned());
        let before = unsaid.len();
        unsaid = unsaid_by(&unsaid, &next.cand.memory);
        if means_a_clause && (chain.is_empty() || unsaid.len() < before) {
            answer = Some(chain.len());
        }
        at = next.cand.memory.clone();
        chain.push(next);
    }
    let placed = chain.len();
    tracing::debug!(placed, unsaid = unsaid.len(), ?answer, "chain followed");
    place(ranked, chain, answer);
    ctx.timed(CHAIN.name(), t);
    placed
}

/// What one hop looks for: a fact about the value that means what the
/// question still leaves unsaid, and names nothing the chain has passed.
#[derive(Clone, Copy)]
struct Want<'a> {
    value: &'a [String],
    unsaid: &'a HashSet<String>,
    /// The kind of thing the question asks for ("country" in "In which
    /// country …"): the last fact's, so no early hop chooses by it.
    kind: Option<&'a str>,
    /// Whether a hop was made before this one.
    after_hop: bool,
    /// The question's names and the values before this one.
    earlier: &'a HashSet<String>,
}

/// One hop: the keyword search for a value, and the current version of the
/// find about it that passes the checks, is not yet placed, and is closest
/// in meaning to the words still unsaid ([`by_meaning`]: "Ertem Eğilmez
/// holds citizenship of Sweden" over "Ertem Eğilmez is employed by Flax
/// Industries" for "… a citizen of?", whichever the index ranked first).
async fn hop(
    ctx: &Ctx<'_>,
    trace: &mut StageTrace,
    ranked: &[(Checked, f32)],
    chain: &[Checked],
    filters: &Filters,
    text: String,
    want: Want<'_>,
) -> Option<Checked> {
    let value = want.value;
    let req = KeywordSearchRequest {
        text,
        filters: Some(filters.clone()),
        k: K,
    };
    let resp = later_keyword(ctx, trace, CHAIN.name(), req).await?;
    let placed = |id: &str| {
        ranked.first().is_some_and(|(c, _)| c.cand.memory.id == id)
            || chain.iter().any(|c| c.cand.memory.id == id)
    };
    let finds: Vec<Memory> = (resp.hits.into_iter())
        .filter_map(|h| h.memory)
        .filter(|m| is_note(m) && !placed(&m.id) && holds(m, value))
        .collect();
    let cands = (finds.into_iter().enumerate())
        .map(|(i, m)| Candidate::found(m, CHAIN, i, 0.0))
        .collect();
    let checked = static_checks(
        cands,
        &ctx.identity,
        filters,
        filters.decay_floor,
        &mut trace.dropped,
    );
    let checked = forward(checked, want);
    let checked = by_meaning(ctx, by_fit(checked, want.unsaid), want).await;
    current(checked, &ctx.query.text, value)
}

/// The finds that name nothing the chain has passed ("Saif Ali Khan's
/// employer is Mexican Central Railway" is no step on from the railway),
/// or all of them when none is left.
fn forward(finds: Vec<Checked>, want: Want<'_>) -> Vec<Checked> {
    let back = |c: &Checked| {
        (names(&c.cand.memory, &HashSet::new()))
            .any(|n| !want.value.contains(&n) && want.earlier.contains(&n))
    };
    let (on, passed): (Vec<Checked>, Vec<Checked>) = finds.into_iter().partition(|c| !back(c));
    if on.is_empty() { passed } else { on }
}

/// The finds by how close each is in meaning to the words a hop chooses
/// by ([`meant`]; one embedding of them, the finds' stored vectors), a
/// find told from the value's side [`VALUE_SIDE`] closer; in the order
/// given when either read fails.
async fn by_meaning(ctx: &Ctx<'_>, finds: Vec<Checked>, want: Want<'_>) -> Vec<Checked> {
    if finds.len() < 2 {
        return finds;
    }
    let ids = finds.iter().map(|c| c.cand.memory.id.clone()).collect();
    let deadline = stage_deadline(ctx.deadline);
    let unsaid = sorted(&meant(want)).join(" ");
    let not_read = Vectors::NotRead;
    let Some((asked, vectors)) = text_and_vectors(ctx, unsaid, ids, &not_read, deadline).await
    else {
        return finds;
    };
    let score = |c: &Checked| {
        let v = vectors
            .get(&c.cand.memory.id)
            .map_or(&[][..], Vec::as_slice);
        let side = if value_side(&c.cand.memory, want.value) {
            VALUE_SIDE
        } else {
            0.0
        };
        cosine(&asked, v) + side
    };
    let mut scored: Vec<(f32, Checked)> = finds.into_iter().map(|c| (score(&c), c)).collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.into_iter().map(|(_, c)| c).collect()
}

/// Unsaid words that remain when the kind asked for is left out.
const HOLD_KIND: usize = 3;

/// The unsaid words a hop chooses by. The kind asked for is the last
/// fact's: while [`HOLD_KIND`] other words remain, a hop chooses by those
/// ("In which country is the head office of the company X's spouse works
/// for?": chosen by "country", the spouse's hop was "… is a citizen of
/// Albania", not "… is employed by …"); after that, once a hop was made,
/// by the kind alone, the words left beside it being paraphrases of hops
/// already made ("spouse" after "… is married to …"). Before any hop they
/// are the next relation ("citizen" in "Which country is the director of
/// X a citizen of?"), and all the unsaid words count.
fn meant(want: Want<'_>) -> HashSet<String> {
    let Some(kind) = want.kind.filter(|k| want.unsaid.contains(*k)) else {
        return want.unsaid.clone();
    };
    let rest: HashSet<String> = (want.unsaid.iter())
        .filter(|w| w.as_str() != kind)
        .cloned()
        .collect();
    if rest.len() >= HOLD_KIND {
        rest
    } else if want.after_hop {
        HashSet::from([kind.to_string()])
    } else {
        want.unsaid.clone()
    }
}

/// The noun after the question's "which" or "what", when it names a kind
/// ("which country", "what city"; not "what is").
fn answer_kind(question: &str) -> Option<String> {
    let words = slots::tokens(question);
    (words.windows(2))
        .find(|w| w[0] == "which" || w[0] == "what")
        .map(|w| w[1].clone())
        .filter(|k| !AUXILIARIES.contains(&k.as_str()) && k.chars().all(char::is_alphabetic))
}

/// Whether the memory names the value before any other name: it tells
/// something about the value, not about another thing that has it.
fn value_side(m: &Memory, value: &[String]) -> bool {
    (names(m, &HashSet::new()).next()).is_some_and(|n| value.contains(&n))
}

/// The finds, those saying more of the unsaid words first (stable).
fn by_fit(mut finds: Vec<Checked>, unsaid: &HashSet<String>) -> Vec<Checked> {
    let fit = |c: &Checked| unsaid.len() - unsaid_by(unsaid, &c.cand.memory).len();
    finds.sort_by_key(|c| std::cmp::Reverse(fit(c)));
    finds
}

/// The first find, or a newer version of it among the finds.
fn current(mut finds: Vec<Checked>, question: &str, value: &[String]) -> Option<Checked> {
    let first = finds.first()?;
    let mut asked = slots::Asked::of(question);
    asked.words.extend(value.iter().cloned());
    asked.names.extend(value.iter().cloned());
    let toks = |c: &Checked| slots::Said::of(&c.cand.memory.content);
    let head = toks(first);
    let key = |c: &Checked| order_key(&c.cand.memory);
    let mut best = 0;
    for (i, c) in finds.iter().enumerate().skip(1) {
        let newer = key(c) > key(&finds[best]);
        if newer && slots::versions(&head, &toks(c), &asked).is_some() {
            best = i;
        }
    }
    Some(finds.swap_remove(best))
}

/// Puts the chain right after the first memory, in chain order, or, when
/// one of its facts is the `answer`, that fact first and the path after
/// it: the first memory, then the chain's other facts in order. The
/// scores stay with the places (a find that was not a candidate takes the
/// last place's score).
fn place(ranked: &mut Vec<(Checked, f32)>, mut chain: Vec<Checked>, answer: Option<usize>) {
    if chain.is_empty() || ranked.is_empty() {
        return;
    }
    let answer = answer.filter(|&a| a < chain.len());
    if let Some(a) = answer {
        chain[..=a].rotate_right(1);
    }
    let ids: HashSet<String> = chain.iter().map(|c| c.cand.memory.id.clone()).collect();
    let mut scores: Vec<f32> = ranked.iter().map(|(_, s)| *s).collect();
    ranked.retain(|(c, _)| !ids.contains(&c.cand.memory.id));
    let last = scores.last().copied().unwrap_or(0.0);
    scores.resize(ranked.len() + chain.len(), last);
    let rest = ranked.split_off(1);
    ranked.extend(chain.into_iter().map(|c| (c, 0.0)));
    ranked.extend(rest);
    if answer.is_some() {
        ranked[..2].swap(0, 1);
    }
    for ((_, s), score) in ranked.iter_mut().zip(scores) {
        *s = score;
    }
}

/// How a question names a thing through another one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// It does not: "Which languages does X speak?".
    None,
    /// Through "of", "by", a possessive or a name right after the kind:
    /// "the director of X", "X's spouse", "the team X plays for" (also how
    /// a plain relation is asked: "the CEO of X").
    Link,
    /// Through a relative clause: "the city where X lives".
    Clause,
}

/// The nouns a question links its things by: "maker" in "the maker of
/// X", "spouse" in "X's spouse" (or "Acme Systems' spouse").
fn link_nouns(question: &str) -> HashSet<String> {
    let owned = clause_words(question);
    let words: Vec<&str> = owned.iter().map(String::as_str).collect();
    let owned_by = (words.windows(2))
        .filter(|w| possessive(w[0]))
        .map(|w| w[1])
        .filter(|w| w.chars().all(char::is_alphabetic));
    (linked(&words).into_iter().chain(owned_by))
        .map(str::to_string)
        .collect()
}

/// The nouns of "the *noun* of" and "the *two nouns* of" (of, by, where,
/// …: [`RELATION_LINKS`]): "maker" in "the maker of X", "head" and
/// "office" in "the head office of the company X works for".
fn linked<'w>(words: &[&'w str]) -> Vec<&'w str> {
    let noun = |w: &str| w.chars().all(char::is_alphabetic) && !RELATION_LINKS.contains(&w);
    let link = |i: usize| words.get(i).is_some_and(|w| RELATION_LINKS.contains(w));
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let n = |k: usize| words.get(i + k).filter(|w| noun(w));
        match (*w == "the", n(1), n(2)) {
            (true, Some(a), _) if link(i + 2) => out.push(*a),
            (true, Some(a), Some(b)) if link(i + 3) => out.extend([*a, *b]),
            _ => {}
        }
    }
    out
}

/// Whether the first fact states one of the question's links ("The maker
/// of the Spark 5 drone is Mine Safety" for "Where is the maker of the
/// Spark 5 drone headquartered?"): then it is the chain's first hop for
/// sure, and one word it leaves unsaid is the next relation, not a
/// paraphrase of its own.
fn says_a_link(question: &str, first: &Memory) -> bool {
    let links = link_nouns(question);
    unsaid_by(&links, first).len() < links.len()
}

/// "acme's", and a plural's "systems'".
fn possessive(w: &str) -> bool {
    (w.ends_with("'s") && w.len() > 2) || (w.ends_with('\'') && w.len() > 1)
}

/// Whether the question names a thing through another one: "the director
/// of X", "the city where X lives", "X's spouse". A question for several
/// values of one relation ("Which languages does X speak?") does not.
fn relates(question: &str) -> Shape {
    let owned = clause_words(question);
    let words: Vec<&str> = owned.iter().map(String::as_str).collect();
    let possessive = words.iter().any(|w| possessive(w));
    // "the team Michael Rae plays for": a clause with no link word.
    let by_name = || {
        kinds_before(question)
            .iter()
            .any(|(_, next)| capitalised(next))
    };
    if clause_at(&words).is_some() || pronoun_clause_at(&words).is_some() {
        Shape::Clause
    } else if possessive || !linked(&words).is_empty() || by_name() {
        Shape::Link
    } else {
        Shape::None
    }
}

/// The question's words a chain says without stating them, so no hop
/// looks for them: the kinds of the things it passes through ("the city
/// where …", "the company Julia Arthur's spouse works for": Bremen is the
/// city, Bianchi Motors the company), and a relative clause's words, which
/// the first fact means (Stage 4d starts from the fact closest to the
/// clause: "… resides in the city of Bremen" for "where … lives").
fn said_in_passing(question: &str, clause_opt: Option<&str>) -> HashSet<String> {
    let kinds = (kinds_before(question).into_iter())
        .filter(|(_, next)| {
            let lower = next.to_lowercase();
            let opens =
                CLAUSE_LINKS.contains(&lower.as_str()) || PRONOUNS.contains(&lower.as_str());
            opens || capitalised(next)
        })
        .map(|(kind, _)| kind);
    let clause_words = (clause_opt.unwrap_or_default().split(' '))
        .filter(|w| !w.is_empty())
        .map(str::to_string);
    kinds.chain(clause_words).collect()
}

/// Whether the question names its thing by a clause with no link word,
/// whose subject is a name: "the team Michael Rae plays for", "the
/// dashboard Brightline Freight uses". Words must follow the name in its
/// part of the question, past the question's own verb when it asks with
/// "do" ("To whom does the brand Durock belong?" names the brand, and
/// "Who helmed the film Pyar Ka Bandhan?" the film).
fn by_name_clause(question: &str) -> bool {
    let head = question.split([',', ';']).next().unwrap_or_default();
    let words: Vec<&str> = (head.split(|c: char| !(c.is_alphanumeric() || "'-".contains(c))))
        .filter(|w| !w.is_empty())
        .collect();
    let Some(at) = (words.windows(3)).position(|w| {
        w[0].eq_ignore_ascii_case("the")
            && w[1].chars().all(char::is_lowercase)
            && capitalised(w[2])
    }) else {
        return false;
    };
    let asked_with_do = (words[..at].iter()).any(|w| DO.contains(&w.to_lowercase().as_str()));
    let after_name = (words[at + 2..].iter())
        .skip_while(|w| capitalised(w))
        .count();
    after_name > usize::from(asked_with_do)
}

/// Each "the *kind* *next word*" of the question, case kept: ("team",
/// "Michael") in "the team Michael Rae plays for", ("city", "where") in
/// "the city where X lives".
fn kinds_before(question: &str) -> Vec<(String, String)> {
    let words: Vec<&str> = (question.split(|c: char| !(c.is_alphanumeric() || c == '\'')))
        .filter(|w| !w.is_empty())
        .collect();
    (words.windows(3))
        .filter(|w| w[0].eq_ignore_ascii_case("the") && w[1].chars().all(char::is_lowercase))
        .map(|w| (w[1].to_string(), w[2].to_string()))
        .collect()
}

/// A clause question's relative clause, read once for both its uses.
fn clause(question: &str, shape: Shape) -> Option<String> {
    (shape == Shape::Clause)
        .then(|| note_clause(question))
        .flatten()
}

/// Subject pronouns that open a relative clause with no link word: "the
/// friend she visits", "the project we shipped".
const PRONOUNS: &[&str] = &["she", "he", "they", "we", "i", "you"];

/// Where a clause with no link word opens: the index, in `words`
/// (lowercased), of the "the" of "the <noun> <pronoun>".
fn pronoun_clause_at(words: &[&str]) -> Option<usize> {
    (words.windows(3)).position(|w| {
        w[0] == "the" && w[1].chars().all(char::is_alphabetic) && PRONOUNS.contains(&w[2])
    })
}

/// Question words that ask with "do" ("Where does …", "What did …").
const DO: &[&str] = &["do", "does", "did"];

/// The relative clause as a chain over notes reads it: as
/// [`clause_of`](super::text::clause_of) reads a passage question's, or
/// opened by a pronoun ("the friend she visits"). It ends at the first
/// comma ("the customer that gets invoices from billing, and when can I
/// call him?"), and in a question asked with "do" ("Where does the friend
/// she visits live?") before its last word, the question's own verb
/// ("live"), which the clause does not say.
fn note_clause(question: &str) -> Option<String> {
    let all = clause_words(question);
    let asked_with_do = all.get(1).is_some_and(|w| DO.contains(&w.as_str()));
    let segments = question.split([',', ';']).map(clause_words);
    segments.enumerate().find_map(|(i, owned)| {
        let words: Vec<&str> = owned.iter().map(String::as_str).collect();
        let start = (clause_at(&words).map(|at| at + 3))
            .or_else(|| pronoun_clause_at(&words).map(|at| at + 2))?;
        let mut clause = words.get(start..)?.to_vec();
        if asked_with_do && i == 0 && clause.len() > 1 {
            clause.pop();
        }
        (!clause.is_empty()).then(|| clause.join(" "))
    })
}

/// Notes among which a clause question's first fact is chosen.
const START_POOL: usize = 3;

/// For a question that names its thing by a relative clause, the chain
/// starts from the fact that means the clause ("Val Guest's home is in
/// Memphis" for "the city where Val Guest lives"), not from whichever
/// fact about the same subject the fusion ranked first ("Val Guest is a
/// citizen of Saudi Arabia" is as near the whole question, which asks for
/// a country). Among the first [`START_POOL`] places, the notes naming one
/// of the question's names are compared with the clause by cosine; the
/// closest takes the first place, unless it is another version of the
/// first place's fact. One embed and one vectors read; any failure keeps
/// the order. Returns whether it moved one.
async fn start_by_clause(ctx: &Ctx<'_>, ranked: &mut [(Checked, f32)], clause: &str) -> bool {
    let (named, _) = query_words(&ctx.query.text);
    let pool = start_pool(ranked, &named);
    if pool.len() < 2 || pool[0] != 0 {
        return false;
    }
    let ids = (pool.iter())
        .map(|&i| ranked[i].0.cand.memory.id.clone())
        .collect();
    let deadline = stage_deadline(ctx.deadline);
    let not_read = Vectors::NotRead;
    let Some((asked, vectors)) =
        text_and_vectors(ctx, clause.to_string(), ids, &not_read, deadline).await
    else {
        return false;
    };
    let near = |i: usize| {
        (vectors.get(&ranked[i].0.cand.memory.id)).map_or(f32::MIN, |v| cosine(&asked, v))
    };
    let best = pool
        .iter()
        .copied()
        .max_by(|&a, &b| near(a).total_cmp(&near(b)));
    match best {
        Some(b) if b > 0 && near(b) > near(0) && !versions(ranked, 0, b, &ctx.query.text) => {
            move_first(ranked, b);
            true
        }
        _ => false,
    }
}

/// Whether two places hold versions of one slot (slots.rs): Stage 4c has
/// already put the one that counts first ("… head office in Detroit" over
/// the older "… in Pamplona"), and two versions mean the clause equally,
/// so the start stays where Stage 4c put it.
fn versions(ranked: &[(Checked, f32)], a: usize, b: usize, question: &str) -> bool {
    let said = |i: usize| slots::Said::of(&ranked[i].0.cand.memory.content);
    slots::versions(&said(a), &said(b), &slots::Asked::of(question)).is_some()
}

/// Where a clause question's first fact is chosen from: among the first
/// [`START_POOL`] places, the notes naming one of the question's names; a
/// question that names nothing ("Who leads the project that migrates the
/// billing system?") has only its meaning to go by, so the first place and
/// the notes the dense list ranked first among the first
/// [`subject::TOP`](super::subject::TOP) places (the keyword and graph
/// lists rank by the question's common words, which the thing's own note
/// may share with its neighbours: "billing", "system").
fn start_pool(ranked: &[(Checked, f32)], named: &HashSet<String>) -> Vec<usize> {
    if named.is_empty() {
        let mut by_meaning: Vec<usize> = (1..ranked.len().min(super::subject::TOP))
            .filter(|&i| is_note(&ranked[i].0.cand.memory) && dense_rank(&ranked[i].0).is_some())
            .collect();
        by_meaning.sort_by_key(|&i| dense_rank(&ranked[i].0));
        by_meaning.truncate(START_POOL);
        let first_ok = ranked.first().is_some_and(|(c, _)| is_note(&c.cand.memory));
        if !first_ok {
            return Vec::new();
        }
        return std::iter::once(0).chain(by_meaning).collect();
    }
    (0..ranked.len().min(START_POOL))
        .filter(|&i| {
            let m = &ranked[i].0.cand.memory;
            is_note(m) && !lower_words(&m.content.replace("'s", "")).is_disjoint(named)
        })
        .collect()
}

/// The memory's rank in the dense list, if it was there.
fn dense_rank(c: &Checked) -> Option<u32> {
    (c.cand.fused.hits.iter())
        .filter(|h| Strategy::Vector.credited(h))
        .map(|h| h.rank)
        .min()
}

/// Moves `ranked[at]` to the first place; scores stay with the places, so
/// they still fall with rank.
fn move_first(ranked: &mut [(Checked, f32)], at: usize) {
    let scores: Vec<f32> = ranked.iter().map(|(_, s)| *s).collect();
    ranked[..=at].rotate_right(1);
    for ((_, s), score) in ranked.iter_mut().zip(scores) {
        *s = score;
    }
}

/// The values a fact may add to `seen`, in its order: each run of
/// capitalised words that holds a name not seen, less the seen ones, a
/// possessive's "'s" cut ("Val Guest's home is in Memphis" adds
/// "memphis"). The first is its value, one thing, not
/// every name of the note: "Project Atlas migrates the billing system from
/// MySQL to PostgreSQL 18" is about Atlas, and the next hop looks for facts
/// naming Atlas, not ones naming Atlas, MySQL and PostgreSQL at once.
fn values_of(m: &Memory, seen: &HashSet<String>) -> Vec<Vec<String>> {
    let mut values: Vec<Vec<String>> = (name_runs(&m.content).into_iter())
        .map(|run| {
            let mut out: Vec<String> = Vec::new();
            // The question's words keep their "'s" ("bank's", a plural's
            // "systems'"), the run's do not: either form was seen.
            let unseen = |n: &String| {
                !seen.contains(n)
                    && !seen.contains(&format!("{n}'s"))
                    && !seen.contains(&format!("{n}'"))
            };
            for name in run.into_iter().filter(unseen) {
                if !out.contains(&name) {
                    out.push(name);
                }
            }
            out
        })
        .filter(|run| !run.is_empty() && !run.iter().all(|w| is_date_word(w)))
        .collect();
    // A note's first word may open a run it is no name of ("Booked Iris's
    // party …"): the rest of that run is tried next.
    if let Some(tail) = (values.first())
        .filter(|r| r.len() > 1)
        .map(|r| r[1..].to_vec())
    {
        values.insert(1, tail);
    }
    values
}

/// A word that says when, not what ("Where was Acme's head office in
/// February 2024?"): no fact of a chain states it, so it asks for no hop.
fn is_time_word(w: &str) -> bool {
    w.chars().all(|c| c.is_ascii_digit()) || engram_common::text::MONTHS.contains(&w)
}

/// A month or a weekday, whole or cut short ("Sept", "Mon"): a date, not
/// a thing a fact can be about.
fn is_date_word(w: &str) -> bool {
    use engram_common::text::{MONTHS, WEEKDAYS};
    let cut = |full: &&str| w.len() >= 3 && full.starts_with(w);
    MONTHS.iter().any(cut) || WEEKDAYS.iter().any(cut)
}

/// Whether the memory names the whole value.
fn holds(m: &Memory, value: &[String]) -> bool {
    let said: HashSet<String> = (names(m, &HashSet::new()))
        .map(|n| n.trim_end_matches("'s").to_string())
        .collect();
    value.iter().all(|v| said.contains(v))
}

/// The words of `wanted` the memory does not say (by their first
/// [`STEM`] characters).
fn unsaid_by(wanted: &HashSet<String>, m: &Memory) -> HashSet<String> {
    let stem = |w: &str| w.chars().take(STEM).collect::<String>();
    let said: HashSet<String> = (slots::tokens(&m.content).iter())
        .map(|w| stem(w))
        .collect();
    (wanted.iter())
        .filter(|w| !said.contains(&stem(w)))
        .cloned()
        .collect()
}

fn sorted(words: &HashSet<String>) -> Vec<&str> {
    let mut v: Vec<&str> = words.iter().map(String::as_str).collect();
    v.sort_unstable();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(id: &str, content: &str) -> Memory {
        Memory {
            id: id.into(),
            content: content.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_words_a_first_fact_leaves_unsaid() {
        let (_, terms) = query_words("In which country is the city where Tony Scott lives?");
        let first = memory("a", "Tony Scott lives in Lyon.");
        assert_eq!(sorted(&unsaid_by(&terms, &first)), ["city", "country"]);
        let (_, terms) = query_words("Where is Acme's head office?");
        let first = memory("b", "The head office of Acme is in the city of Bergen.");
        assert!(unsaid_by(&terms, &first).is_empty());
    }

    #[test]
    fn a_version_of_the_first_fact_does_not_take_its_place() {
        let c = |id: &str, text: &str| (Checked::passed(memory(id, text), 0.0), 1.0);
        let ranked = vec![
            c("new", "Costa Ceramics has its head office in Detroit."),
            c("old", "Costa Ceramics has its head office in Pamplona."),
            c("other", "Costa Ceramics makes tiles in Lyon."),
        ];
        let q = "Who is the mayor of the city where Costa Ceramics has its head office?";
        assert!(versions(&ranked, 0, 1, q));
        assert!(!versions(&ranked, 0, 2, q));
    }

    #[test]
    fn kinds_and_a_clauses_words_are_said_in_passing() {
        let q = "In which country is the city where Charles Davis Jameson lives?";
        let passed = said_in_passing(q, clause(q, relates(q)).as_deref());
        assert_eq!(
            sorted(&passed),
            ["charles", "city", "davis", "jameson", "lives"]
        );
        // "lives" was said by "resides"; the hop looks for the country only.
        let (_, terms) = query_words(q);
        let first = memory("a", "Charles Davis Jameson resides in the city of Bremen.");
        let unsaid: HashSet<String> = (unsaid_by(&terms, &first).into_iter())
            .filter(|w| !passed.contains(w))
            .collect();
        assert_eq!(sorted(&unsaid), ["country"]);
        let q =
            "In which country is the head office of the company Julia Arthur's spouse works for?";
        assert_eq!(
            sorted(&said_in_passing(q, clause(q, relates(q)).as_deref())),
            ["company"]
        );
        let q = "Who is the director of The Quitter?";
        assert!(said_in_passing(q, clause(q, relates(q)).as_deref()).is_empty());
    }

    #[test]
    fn a_value_is_one_thing_the_fact_names() {
        let seen = lower_words("Who leads the project that migrates the billing system?");
        let atlas = memory(
            "a",
            "Project Atlas migrates the billing system from MySQL to PostgreSQL 18 before the end of Q3.",
        );
        assert_eq!(value_of_(&atlas, &seen), ["atlas"]);
        let lead = memory("b", "Alice Chen is the engineering lead of Project Atlas.");
        assert!(holds(&lead, &["atlas".to_string()]));
        let seen = lower_words("Which physician looks after Roger Richebé?");
        let doctor = memory("c", "Roger Richebé is a patient of Dr. David A. Prior.");
        assert_eq!(value_of_(&doctor, &seen), ["david", "prior"]);
        let seen = lower_words("Who is Saif Ali Khan married to?");
        let spouse = memory(
            "d",
            "Saif Ali Khan is married to Jocelyn Lovell, a painter.",
        );
        assert_eq!(value_of_(&spouse, &seen), ["jocelyn", "lovell"]);
        let seen = lower_words("Who runs the city that hosts Community West Bank's head office?");
        let office = memory(
            "e",
            "Community West Bank's head office is located in Miami.",
        );
        assert_eq!(value_of_(&office, &seen), ["miami"]);
    }

    #[test]
    fn a_chain_is_asked_through_a_link_or_a_possessive() {
        let shape = |q: &str| relates(q);
        assert_eq!(
            shape("What is the citizenship of the person who directed X?"),
            Shape::Clause
        );
        assert_eq!(
            shape("Who is the head coach of Paul Newman's team?"),
            Shape::Link
        );
        assert_eq!(
            shape("In which country is the city where Val Guest lives?"),
            Shape::Clause
        );
        assert_eq!(shape("Who is the CEO of Acme?"), Shape::Link);
        assert_eq!(
            shape("Where is the head office of the company Gaston Popper works for?"),
            Shape::Link
        );
        assert_eq!(shape("Who is in the band with Ann?"), Shape::None);
        assert_eq!(
            shape("Who coaches the team Michael Rae plays for?"),
            Shape::Link
        );
        assert_eq!(
            shape("In what languages can Maurice Elvey hold a conversation?"),
            Shape::None
        );
        assert_eq!(shape("Which customers are using Heron?"), Shape::None);
    }

    #[test]
    fn a_first_fact_that_states_the_link_leaves_one_word_to_follow() {
        let q = "Where is the maker of the Meyers Spark 5 drone headquartered?";
        assert_eq!(sorted(&link_nouns(q)), ["maker"]);
        let maker = memory(
            "a",
            "The maker of the Meyers Spark 5 drone is Mine Safety Appliances Corporation.",
        );
        assert!(says_a_link(q, &maker));
        let price = memory("b", "The Meyers Spark 5 drone retails at $1,184.");
        assert!(!says_a_link(q, &price));
        // A wrong first fact keeps asking for two unsaid words.
        let q = "Who is Community West Bank's board chairperson?";
        assert_eq!(sorted(&link_nouns(q)), ["board"]);
        let ceo = memory(
            "c",
            "Community West Bank is run by chief executive Vasili Pichul.",
        );
        assert!(!says_a_link(q, &ceo));
        let q = "Where is the head office of the company Gaston Popper works for?";
        assert_eq!(sorted(&link_nouns(q)), ["head", "office"]);
        let q = "In which country is Conway Systems' head office?";
        assert_eq!(sorted(&link_nouns(q)), ["head"]);
    }

    #[test]
    fn the_kind_asked_for_waits_for_the_last_hop() {
        let q = "In which country is the head office of the company X's spouse works for?";
        let kind = answer_kind(q);
        assert_eq!(kind.as_deref(), Some("country"));
        assert_eq!(answer_kind("What is X's country of citizenship?"), None);
        let set = |ws: &[&str]| ws.iter().map(|w| w.to_string()).collect::<HashSet<_>>();
        let (value, earlier) = (vec![], HashSet::new());
        let want = |unsaid, after_hop| Want {
            value: &value,
            unsaid,
            kind: kind.as_deref(),
            after_hop,
            earlier: &earlier,
        };
        let early = set(&["country", "head", "office", "works"]);
        assert_eq!(
            sorted(&meant(want(&early, false))),
            ["head", "office", "works"]
        );
        let late = set(&["country", "spouse", "works"]);
        assert_eq!(sorted(&meant(want(&late, true))), ["country"]);
        let said = set(&["spouse", "works"]);
        assert_eq!(sorted(&meant(want(&said, true))), ["spouse", "works"]);
        // Before any hop, the words beside the kind are the next relation.
        let first = set(&["country", "citizen"]);
        assert_eq!(sorted(&meant(want(&first, false))), ["citizen", "country"]);
    }

    #[test]
    fn a_plurals_possessive_is_not_part_of_the_value() {
        let seen =
            lower_words("In which country is the city where Conway Systems' head office is?");
        let first = memory("a", "Conway Systems has its head office in Singapore.");
        assert_eq!(value_of_(&first, &seen), ["singapore"]);
    }

    #[test]
    fn a_possessive_is_not_part_of_the_value() {
        let seen = lower_words("In which country is the city where Val Guest lives?");
        let first = memory("a", "Val Guest's home is in Memphis.");
        assert_eq!(value_of_(&first, &seen), ["memphis"]);
        assert!(holds(
            &memory("b", "Memphis is a city."),
            &["memphis".into()]
        ));
    }

    #[test]
    fn a_hop_follows_the_find_that_says_what_is_still_unsaid() {
        let c = |id: &str, text: &str| Checked::passed(memory(id, text), 0.0);
        let finds = vec![
            c("job", "Ertem Eğilmez is employed by Flax Industries."),
            c("home", "Ertem Eğilmez lives in Izmir."),
            c("nation", "Ertem Eğilmez holds citizenship of Sweden."),
        ];
        let (_, terms) = query_words("Which country is the director of X a citizen of?");
        let first = memory("a", "Ertem Eğilmez directed X.");
        let unsaid = unsaid_by(&terms, &first);
        let ids: Vec<String> = (by_fit(finds, &unsaid).into_iter())
            .map(|c| c.cand.memory.id)
            .collect();
        assert_eq!(ids, ["nation", "job", "home"]);
    }

    #[test]
    fn a_find_about_the_value_is_told_from_its_side() {
        let value = ["sapporo".to_string()];
        assert!(value_side(
            &memory("a", "Sapporo is a city in Japan."),
            &value
        ));
        assert!(value_side(
            &memory("b", "The mayor of Sapporo is Ann Lee."),
            &value
        ));
        let other = memory("c", "Bill Bennett resides in the city of Sapporo.");
        assert!(!value_side(&other, &value));
    }

    #[test]
    fn a_find_naming_what_the_chain_passed_is_no_step_on() {
        let c = |id: &str, text: &str| Checked::passed(memory(id, text), 0.0);
        let finds = vec![
            c("back", "Saif Khan's employer is Mexican Central Railway."),
            c("on", "Mexican Central Railway has its head office in Oslo."),
        ];
        let value: Vec<String> = ["mexican", "central", "railway"].map(String::from).into();
        let earlier: HashSet<String> = ["saif", "khan"].map(String::from).into();
        let unsaid = HashSet::new();
        let want = Want {
            value: &value,
            unsaid: &unsaid,
            kind: None,
            after_hop: false,
            earlier: &earlier,
        };
        let ids: Vec<String> = (forward(finds, want).into_iter())
            .map(|c| c.cand.memory.id)
            .collect();
        assert_eq!(ids, ["on"]);
    }

    fn value_of_(m: &Memory, seen: &HashSet<String>) -> Vec<String> {
        values_of(m, seen).into_iter().next().unwrap_or_default()
    }

    #[test]
    fn a_fact_opening_with_a_capitalised_word_offers_its_name_next() {
        let note = memory(
            "n",
            "Mild cat allergy, itchy eyes; takes an antihistamine before visiting Jess.",
        );
        let values = values_of(&note, &HashSet::new());
        assert_eq!(values, [vec!["mild".to_string()], vec!["jess".to_string()]]);
        let note = memory(
            "n",
            "Booked Iris's 8th birthday party at the Oaks Park roller rink.",
        );
        let values = values_of(&note, &HashSet::new());
        assert_eq!(
            values[..2],
            [
                vec!["booked".to_string(), "iris".to_string()],
                vec!["iris".to_string()]
            ]
        );
    }

    #[test]
    fn a_date_is_no_value_to_follow() {
        let note = memory(
            "n",
            "Lease renewed through Aug 2026 at $2,075 a month, starting Sept 1.",
        );
        assert_eq!(
            values_of(&note, &HashSet::new()),
            [vec!["lease".to_string()]]
        );
    }

    #[test]
    fn a_clause_with_no_link_word_is_told_from_a_name_beside_its_kind() {
        assert!(by_name_clause(
            "Who coaches the team Michael Rae plays for?"
        ));
        assert!(by_name_clause(
            "What's the staging URL for the dashboard Brightline Freight uses?"
        ));
        assert!(by_name_clause(
            "Which AWS region does the project Kai rotated onto run in now?"
        ));
        assert!(!by_name_clause("To whom does the brand Durock belong?"));
        assert!(!by_name_clause("Who helmed the film Pyar Ka Bandhan?"));
        assert!(!by_name_clause(
            "Who is the mayor of the city where Val Guest lives?"
        ));
    }

    #[test]
    fn the_chain_goes_right_after_the_first_memory() {
        let c = |id: &str| Checked::passed(memory(id, ""), 0.0);
        let mut ranked = vec![(c("a"), 0.9), (c("b"), 0.8), (c("x"), 0.7), (c("d"), 0.6)];
        place(&mut ranked, vec![c("x"), c("y")], None);
        let ids: Vec<&str> = ranked
            .iter()
            .map(|(c, _)| c.cand.memory.id.as_str())
            .collect();
        assert_eq!(ids, ["a", "x", "y", "b", "d"]);
        let scores: Vec<f32> = ranked.iter().map(|(_, s)| *s).collect();
        assert_eq!(scores, [0.9, 0.8, 0.7, 0.6, 0.6]);
    }

    #[test]
    fn a_chain_s_answer_goes_first_and_the_path_after_it() {
        let c = |id: &str| Checked::passed(memory(id, ""), 0.0);
        let ids = |ranked: &[(Checked, f32)]| -> Vec<String> {
            (ranked.iter())
                .map(|(c, _)| c.cand.memory.id.clone())
                .collect()
        };
        let mut ranked = vec![(c("a"), 0.9), (c("b"), 0.8), (c("d"), 0.6)];
        place(&mut ranked, vec![c("x"), c("y"), c("z")], Some(1));
        assert_eq!(ids(&ranked), ["y", "a", "x", "z", "b", "d"]);
        let scores: Vec<f32> = ranked.iter().map(|(_, s)| *s).collect();
        assert_eq!(scores, [0.9, 0.8, 0.6, 0.6, 0.6, 0.6]);
        let mut ranked = vec![(c("a"), 0.9), (c("b"), 0.8)];
        place(&mut ranked, vec![c("x")], Some(0));
        assert_eq!(ids(&ranked), ["x", "a", "b"]);
    }

    #[test]
    fn a_note_question_s_clause_ends_where_the_question_takes_over() {
        let q = "Where does the friend she takes an antihistamine before visiting live?";
        assert_eq!(relates(q), Shape::Clause);
        let clause = note_clause(q);
        assert_eq!(
            clause.as_deref(),
            Some("she takes an antihistamine before visiting")
        );
        let q = "Who is the contact at the customer that gets invoices from billing, and when can I call him?";
        assert_eq!(
            note_clause(q).as_deref(),
            Some("gets invoices from billing")
        );
        let q = "What does the person whose cousins stayed over for the Fourth do for work?";
        let passed = said_in_passing(q, note_clause(q).as_deref());
        assert!(passed.contains("cousins") && !passed.contains("work"));
        let q = "In which country is the city where Val Guest lives?";
        assert_eq!(note_clause(q).as_deref(), Some("val guest lives"));
    }

    #[test]
    fn a_newer_version_among_the_finds_is_the_one_followed() {
        let at = |id: &str, text: &str, secs: i64| {
            let mut m = memory(id, text);
            m.event_time = Some(prost_types::Timestamp {
                seconds: secs,
                nanos: 0,
            });
            Checked::passed(m, 0.0)
        };
        let finds = vec![
            at("old", "The head office of Acme is in the city of Lyon.", 10),
            at("other", "The CEO of Acme is Ada Park.", 30),
            at(
                "new",
                "The head office of Acme is in the city of Bergen.",
                20,
            ),
        ];
        let q = "In which country is the head office of the company Ada works for?";
        let got = current(finds, q, &["acme".to_string()]);
        assert_eq!(got.map(|c| c.cand.memory.id), Some("new".to_string()));
    }
}
