//! Speaker names in the first person for a dense query (issue 20).
//!
//! A turn is embedded as said, "Caroline: I went to a support group", and
//! almost every question about a conversation names a speaker ("When did
//! Caroline go to the support group?"). MiniLM gives the name so much of
//! the query's vector that every turn of that speaker looks alike, and the
//! question's subject (the support group) decides little. Asked as the
//! speaker would have said it, "When did I go to the support group?", the
//! question meets the turn: on LoCoMo 0–4, dense R@5 / R@10 42.1 / 50.8 as
//! asked, 50.8 / 60.8 with the name dropped, 51.3 / 62.6 in the first
//! person (docs/conversations.md). Who said it is not lost: the keyword
//! index holds the speaker, and the gateway lifts the named speaker's
//! turns after fusion (retrieval-svc pipeline/session.rs).
//!
//! Only words that are the speaker of a turn the caller can read count,
//! found with dense search's own access predicate, so a turn above the
//! caller's trust, in another namespace or another tenant never changes
//! the caller's query; names in memories without a speaker (documents)
//! are never touched.
//!
//! And only names (issue 47, item 6): a run of words counts when each is
//! written with a capital in the question and none is a stop word, so a
//! turn whose speaker is "the" or "where" cannot turn every question into
//! the first person. A lower-trust writer's turns do not steer a
//! higher-trust caller's query: a speaker counts only from a turn at the
//! caller's own level or one the caller's own agent wrote. (A public key
//! given the same agent id as a sensitive one is trusted as that agent.)

use std::collections::HashSet;

use engram_common::Identity;
use engram_common::entities::is_stopword;
use sqlx::{Postgres, QueryBuilder};

use crate::bounds;
use crate::error::Result;
use crate::filters::push_where;
use crate::turns::MAX_SPEAKER_CHARS;
use crate::validate::SearchFilters;

/// Longest speaker name matched, in words ("Mary Ann Lee").
const MAX_NAME_WORDS: usize = 3;

/// At most this many word n-grams are looked up: a query is bounded, but
/// one statement should stay one small index probe per name.
const MAX_GRAMS: usize = 96;

/// One word of a query: its byte span, lowercased without a possessive
/// "'s" (so "Caroline's" names "caroline"), and whether it had one.
struct Word {
    start: usize,
    end: usize,
    bare: String,
    possessive: bool,
}

fn words(text: &str) -> Vec<Word> {
    let mut out = Vec::new();
    let mut start_opt: Option<usize> = None;
    let flush = |start: usize, end: usize, out: &mut Vec<Word>| {
        let word = &text[start..end];
        let stem_opt = word.strip_suffix("'s").or_else(|| word.strip_suffix("’s"));
        let bare = stem_opt.unwrap_or(word).trim_end_matches(['\'', '’']);
        if !bare.is_empty() {
            out.push(Word {
                start,
                end,
                bare: bare.to_lowercase(),
                possessive: stem_opt.is_some(),
            });
        }
    };
    for (i, c) in text.char_indices() {
        let in_word = c.is_alphanumeric() || c == '\'' || c == '’';
        match (in_word, start_opt) {
            (true, None) => start_opt = Some(i),
            (false, Some(s)) => {
                flush(s, i, &mut out);
                start_opt = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start_opt {
        flush(s, text.len(), &mut out);
    }
    out
}

/// Whether a word can be part of a name: written with a capital in the
/// question ("Caroline", "Mary Ann") and not a stop word ("Where", "The").
fn is_name_word(text: &str, w: &Word) -> bool {
    let capital = text[w.start..]
        .chars()
        .next()
        .is_some_and(char::is_uppercase);
    capital && !is_stopword(&w.bare)
}

fn joined(run: &[Word]) -> String {
    run.iter()
        .map(|w| w.bare.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every run of one to `MAX_NAME_WORDS` name words ([`is_name_word`]),
/// lowercased and joined by one space (how a speaker name compares:
/// `lower(speaker)`).
pub fn grams(text: &str) -> Vec<String> {
    let w = words(text);
    let mut out: Vec<String> = Vec::new();
    let mut seen = HashSet::new();
    for n in 1..=MAX_NAME_WORDS {
        for run in w.windows(n) {
            if !run.iter().all(|x| is_name_word(text, x)) {
                continue;
            }
            let gram = joined(run);
            // Longer than any speaker may be: no probe can match it.
            if gram.chars().count() > MAX_SPEAKER_CHARS {
                continue;
            }
            if seen.insert(gram.clone()) {
                out.push(gram);
            }
        }
    }
    out.truncate(MAX_GRAMS);
    out
}

/// `text` with each word run in `names` (longest first) said in the first
/// person: "Caroline" → "I", "Caroline's" → "my", the way the speaker put
/// it in the turn. `None` when no name matched, or when the query is
/// nothing but names (it then asks about that person, and keeps them).
pub fn in_first_person(text: &str, names: &HashSet<String>) -> Option<String> {
    if names.is_empty() {
        return None;
    }
    let w = words(text);
    // For each word: the end of the name run it starts, if it starts one.
    let mut runs: Vec<Option<usize>> = vec![None; w.len()];
    let mut covered = vec![false; w.len()];
    for n in (1..=MAX_NAME_WORDS).rev() {
        for i in 0..w.len().saturating_sub(n - 1) {
            let run = &w[i..i + n];
            if covered[i..i + n].iter().any(|c| *c)
                || !run.iter().all(|x| is_name_word(text, x))
                || !names.contains(&joined(run))
            {
                continue;
            }
            covered[i..i + n].iter_mut().for_each(|c| *c = true);
            runs[i] = Some(i + n - 1);
        }
    }
    if !covered.iter().any(|c| *c) || covered.iter().all(|c| *c) {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (i, last_opt) in runs.iter().enumerate() {
        let Some(last) = *last_opt else { continue };
        out.push_str(&text[at..w[i].start]);
        out.push_str(if w[last].possessive { "my" } else { "I" });
        at = w[last].end;
    }
    out.push_str(&text[at..]);
    Some(out)
}

/// The query text dense search embeds: `text` with the names of speakers
/// of turns the caller can read in the first person, or `None` to embed it
/// as given.
pub async fn dense_text(
    readers: &bounds::Readers,
    identity: &Identity,
    filters: &SearchFilters,
    text: &str,
    default_decay_floor: f32,
    timeout_ms: u64,
) -> Result<Option<String>> {
    let grams = grams(text);
    if grams.is_empty() {
        return Ok(None);
    }
    let mut qb = QueryBuilder::<Postgres>::new("SELECT g FROM unnest(");
    qb.push_bind(grams).push(
        "::text[]) AS g WHERE EXISTS (SELECT 1 FROM memories m \
         WHERE m.speaker <> '' AND lower(m.speaker) = g AND (m.access_level >= ",
    );
    qb.push_bind(identity.trust.as_i16())
        .push(" OR m.agent_id = ")
        .push_bind(identity.agent_id.clone())
        .push(") AND ");
    push_where(&mut qb, identity, filters, default_decay_floor);
    qb.push(")");
    let mut read = readers.read(timeout_ms).await?;
    let found: Vec<String> = qb.build_query_scalar().fetch_all(&mut *read).await?;
    read.finish().await?;
    let names: HashSet<String> = found.into_iter().collect();
    Ok(in_first_person(text, &names))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> HashSet<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn grams_are_lowercased_name_runs_without_possessives() {
        let g = grams("When did Caroline's sister, Mary Ann, call?");
        for want in ["caroline", "mary ann", "mary", "ann"] {
            assert!(g.contains(&want.to_string()), "{want} missing from {g:?}");
        }
        assert!(!g.iter().any(|x| x.contains("'s")), "{g:?}");
        for not in ["when", "sister", "call", "caroline sister mary", "did"] {
            assert!(!g.contains(&not.to_string()), "{not} in {g:?}");
        }
    }

    #[test]
    fn only_capitalised_words_that_are_not_stop_words_can_be_speakers() {
        // Issue 47, item 6: turns whose speaker was "the" or "where" put
        // every question of the tenant in the first person.
        assert!(grams("Where does the client live?").is_empty());
        assert!(grams("where does bob martinez live").is_empty());
        let first = |q: &str, n: &[&str]| in_first_person(q, &names(n));
        assert_eq!(
            first("Where does the client live?", &["where", "the"]),
            None
        );
        assert_eq!(
            first("Where did Bob go after the bob sleigh race?", &["bob"]).as_deref(),
            Some("Where did I go after the bob sleigh race?")
        );
    }

    #[test]
    fn grams_are_bounded() {
        let long = "Word ".repeat(1000) + &(0..500).map(|i| format!("W{i} ")).collect::<String>();
        assert!(grams(&long).len() <= MAX_GRAMS);
        let huge = "X".repeat(MAX_SPEAKER_CHARS + 1);
        assert!(
            grams(&format!("{huge} Said Hi"))
                .iter()
                .all(|g| !g.contains('x'))
        );
        assert!(grams("").is_empty());
        assert!(grams("?! --").is_empty());
    }

    #[test]
    fn speaker_names_are_said_in_the_first_person() {
        let first = |q: &str, n: &[&str]| in_first_person(q, &names(n));
        assert_eq!(
            first(
                "When did Caroline go to the LGBTQ support group?",
                &["caroline"]
            )
            .as_deref(),
            Some("When did I go to the LGBTQ support group?")
        );
        assert_eq!(
            first("What is Melanie's hobby?", &["melanie"]).as_deref(),
            Some("What is my hobby?")
        );
        assert_eq!(
            first("Did Mary Ann meet Jon's dog?", &["mary ann", "jon", "ann"]).as_deref(),
            Some("Did I meet my dog?")
        );
    }

    #[test]
    fn nothing_to_change_or_only_a_name_keeps_the_query() {
        let first = |q: &str, n: &[&str]| in_first_person(q, &names(n));
        assert_eq!(first("Who founded Rome?", &["caroline"]), None);
        assert_eq!(first("Who founded Rome?", &[]), None);
        assert_eq!(first("Caroline", &["caroline"]), None);
        assert_eq!(first("Caroline's?", &["caroline"]), None);
    }

    #[test]
    fn non_ascii_text_is_cut_on_character_boundaries() {
        assert_eq!(
            in_first_person(
                "Was hat Jürgen über Zoë gesagt?",
                &names(&["jürgen", "zoë"])
            )
            .as_deref(),
            Some("Was hat I über I gesagt?")
        );
    }
}
