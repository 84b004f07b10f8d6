//! Versions of one slot, judged on the words alone (pure; a leaf).
//!
//! Two short memories are *versions* of one slot when their words are the
//! same but for one short span in the middle — the value — and that span is
//! not what the question names: "The head office of Acme is in the city of
//! Lyon." and "… of Paris." asked "Where is Acme's head office?". When the
//! differing span holds a word the question uses ("Acme" against "Globex",
//! same city), the span is the subject, and the two are different facts.
//!
//! The frame must also say the relation: a word that is not a name. In
//! "Saif Ali Khan is a citizen of Serbia." against "Saif Ali Khan is
//! married to Jocelyn Lovell." the words shared are the subject's alone, so
//! the differing span holds the relation too and the two are different
//! facts, not versions.
//!
//! How many values the slot holds at once is inferred from the sentence's
//! own structure, not from a list of relations: a number, a time or an
//! amount holds one; a definite frame ("the head office of", "Dana's
//! dentist is") holds one; an indefinite one ("has a child named", "is a
//! member of", "also") adds a value. Anything else is unsure. The score
//! says how sure the judgement is that the newer one replaces the older
//! (docs/decisions.md, "What is true now").

use std::collections::HashSet;

use super::text::head;

/// The longest text judged, in tokens: a fact or a note, not a passage.
pub const MAX_TOKENS: usize = 48;

/// The longest value span, in tokens, on either side.
const MAX_SPAN: usize = 6;

/// Function words that do not make two texts say the same thing.
const FUNCTION: &[&str] = &[
    "a", "an", "the", "is", "are", "was", "were", "be", "to", "in", "at", "on", "of", "for", "and",
    "or", "by", "as", "it", "its", "s", "has", "have", "had", "with", "from", "that", "this",
    "user", "i", "my", "we", "our",
];

/// Words that make a frame indefinite: the value is one of several.
const INDEFINITE: &[&str] = &["a", "an", "one", "another", "also", "too", "some"];

/// Score of a slot that holds one value (a replacement is sure).
pub const ONE_VALUE: f32 = 0.9;
/// Score of a slot whose structure says nothing (newer first, both kept).
pub const UNSURE: f32 = 0.5;
/// Score of a slot that holds several values (neither replaces the other).
pub const MANY_VALUES: f32 = 0.2;

/// Lowercased alphanumeric runs of the text's [`head`]: "Acme's 9:30" →
/// acme, s, 9, 30.
pub fn tokens(text: &str) -> Vec<String> {
    words(head(text)).map(str::to_lowercase).collect()
}

fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
}

/// [`tokens`] of a memory, at most one past [`MAX_TOKENS`]: a passage is
/// never judged, so its words past that are not worth splitting.
pub fn fact_tokens(text: &str) -> Vec<String> {
    words(text)
        .take(MAX_TOKENS + 1)
        .map(str::to_lowercase)
        .collect()
}

/// The words a text (its [`head`]) capitalises as names, lowercased: a
/// capitalised word inside a sentence, or one that opens a sentence and is
/// followed by another capitalised word ("Saif Ali Khan is …", "Dr. Grace
/// Lee"). A sentence's lone first word ("Standup is daily …") is not a
/// name, and neither is an acronym ("CEO", "GP"): it names a role as often
/// as a thing.
pub fn names(text: &str) -> HashSet<String> {
    let capitalised = |w: &str| w.chars().next().is_some_and(char::is_uppercase);
    let acronym = |w: &str| w.chars().count() > 1 && !w.chars().any(char::is_lowercase);
    let mut out = HashSet::new();
    for sentence in head(text).split(['.', '!', '?', ':', ';', '\n']) {
        let ws: Vec<&str> = words(sentence).collect();
        for (i, w) in ws.iter().enumerate() {
            let next_too = ws.get(i + 1).is_some_and(|n| capitalised(n));
            if capitalised(w) && !acronym(w) && (i > 0 || next_too) {
                out.insert(w.to_lowercase());
            }
        }
    }
    out
}

/// A text as judged: its [`fact_tokens`] and its [`names`].
#[derive(Debug, Clone, Default)]
pub struct Said {
    pub tokens: Vec<String>,
    pub names: HashSet<String>,
}

impl Said {
    pub fn of(text: &str) -> Self {
        Said {
            tokens: fact_tokens(text),
            names: names(text),
        }
    }
}

/// What a question asks: its lowercased words, and its [`names`].
#[derive(Debug, Clone, Default)]
pub struct Asked {
    pub words: HashSet<String>,
    pub names: HashSet<String>,
}

impl Asked {
    pub fn of(question: &str) -> Self {
        Asked {
            words: tokens(question).into_iter().collect(),
            names: names(question),
        }
    }
}

/// A note: a short untitled memory that is not a conversation turn. A
/// titled page is about its title and a turn's speaker is not its
/// subject, so Stages 4c and 4d judge notes only.
pub fn is_note(m: &engram_proto::Memory) -> bool {
    let is_turn = m.turn.as_ref().is_some_and(|t| !t.speaker.is_empty());
    !is_turn && m.title.is_empty() && is_statement(&m.content)
}

/// A statement, not a passage: at most [`MAX_TOKENS`] words.
pub fn is_statement(text: &str) -> bool {
    fact_tokens(text).len() <= MAX_TOKENS
}

/// What differs between two versions, and how sure a replacement is.
#[derive(Debug, Clone, PartialEq)]
pub struct Versions {
    /// The first text's value span.
    pub a: String,
    /// The second text's value span.
    pub b: String,
    /// [`ONE_VALUE`], [`UNSURE`] or [`MANY_VALUES`].
    pub score: f32,
}

/// Whether `a` and `b` are versions of one slot for the question `asked`.
pub fn versions(x: &Said, y: &Said, asked: &Asked) -> Option<Versions> {
    let (a, b) = (x.tokens.as_slice(), y.tokens.as_slice());
    if a == b || a.len() > MAX_TOKENS || b.len() > MAX_TOKENS {
        return None;
    }
    let p = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let room = a.len().min(b.len()) - p;
    let s = (a.iter().rev().zip(b.iter().rev()))
        .take(room)
        .take_while(|(x, y)| x == y)
        .count();
    let (mid_a, mid_b) = (&a[p..a.len() - s], &b[p..b.len() - s]);
    let shared: Vec<&String> = a[..p].iter().chain(&a[a.len() - s..]).collect();
    let spans_ok = !mid_a.is_empty() && !mid_b.is_empty();
    let short = mid_a.len() <= MAX_SPAN && mid_b.len() <= MAX_SPAN;
    let mostly_shared = 2 * shared.len() >= a.len().max(b.len());
    if !(spans_ok && short && mostly_shared) {
        return None;
    }
    // The frame must be about what was asked, and the value must not be. A
    // word the frame already holds says nothing about the span: in "Luis
    // Trenker is a patient of Dr. José Luis Garci" against "… Dr. Christopher
    // H. Clark", asked about Luis Trenker, the "luis" in the value is not
    // the subject swapped.
    let content = |w: &str| !FUNCTION.contains(&w) && w.len() >= 2;
    let frame_asked = (shared.iter()).any(|w| content(w) && asked.words.contains(*w));
    let in_frame = |w: &String| shared.contains(&w);
    // Nor does a word of a name the question uses only as a common noun:
    // "Caldwell Company" against "Bolt Motors", asked about "the company
    // Gaston Popper works for", swaps the employer, not the subject.
    let named_in_texts = |w: &str| x.names.contains(w) || y.names.contains(w);
    let common_in_question = |w: &str| named_in_texts(w) && !asked.names.contains(w);
    let span_asked = (mid_a.iter().chain(mid_b))
        .any(|w| content(w) && asked.words.contains(w) && !in_frame(w) && !common_in_question(w));
    let name = |w: &str| asked.names.contains(w) || x.names.contains(w) || y.names.contains(w);
    let relation = (shared.iter()).any(|w| content(w) && !has_digit(&[w]) && !name(w));
    if !frame_asked || span_asked || !relation || has_digit(mid_a) != has_digit(mid_b) {
        return None;
    }
    // A value swapped keeps the frame's small words: "… is made by Jordan
    // Retail" against "… is assembled in Miami" swaps the relation ("by"
    // against "in"), not the value.
    let named = |w: &str| x.names.contains(w) || y.names.contains(w);
    if links(mid_a, &named) != links(mid_b, &named) {
        return None;
    }
    Some(Versions {
        a: mid_a.join(" "),
        b: mid_b.join(" "),
        score: cardinality(&a[..p], mid_a, mid_b, &shared),
    })
}

/// A span's function words, in order, but its articles and those inside a
/// name ("Bosnia and Herzegovina", "University of Virginia"): what links
/// its value to the frame.
fn links<'s>(span: &'s [String], named: &dyn Fn(&str) -> bool) -> Vec<&'s str> {
    let inside = |i: usize| {
        i > 0
            && (span.get(i - 1)).is_some_and(|w| named(w))
            && (span.get(i + 1)).is_some_and(|w| named(w))
    };
    (span.iter().enumerate())
        .filter(|&(i, w)| {
            FUNCTION.contains(&w.as_str()) && !ARTICLES.contains(&w.as_str()) && !inside(i)
        })
        .map(|(_, w)| w.as_str())
        .collect()
}

/// Articles: "in the Czech Republic" and "in Iraq" link their values alike
/// (and wants.rs reads a place after "in the" as after "in").
pub const ARTICLES: &[&str] = &["a", "an", "the"];

fn has_digit<S: AsRef<str>>(span: &[S]) -> bool {
    span.iter()
        .any(|w| w.as_ref().chars().any(|c| c.is_ascii_digit()))
}

/// How sure it is that the slot holds one value: from the value's kind and
/// the frame's articles (see the module doc).
fn cardinality(before: &[String], mid_a: &[String], mid_b: &[String], shared: &[&String]) -> f32 {
    if has_digit(mid_a) || has_digit(mid_b) {
        return ONE_VALUE;
    }
    if shared.iter().any(|w| INDEFINITE.contains(&w.as_str())) {
        return MANY_VALUES;
    }
    // "the X of …", "…'s X is": a definite description names one thing.
    let definite = before.iter().any(|w| w == "the" || w == "s");
    if definite { ONE_VALUE } else { UNSURE }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(a: &str, b: &str, q: &str) -> Option<Versions> {
        versions(&Said::of(a), &Said::of(b), &Asked::of(q))
    }

    #[test]
    fn a_frame_of_names_alone_holds_no_relation() {
        let v = judge(
            "Saif Ali Khan is a citizen of Serbia.",
            "Saif Ali Khan is married to Jocelyn Lovell.",
            "To whom is Saif Ali Khan wed?",
        );
        assert_eq!(v, None);
        let v = judge(
            "Alain Corneau coaches Perth Glory.",
            "Jonathan Demme plays for Perth Glory.",
            "Who is in charge of training Perth Glory?",
        );
        assert_eq!(v, None);
        // An acronym is a role as often as a name.
        let v = judge(
            "The CEO of Martins Bank is Oldřich Lipský.",
            "The CEO of Martins Bank is Lesley Selander.",
            "Who is at the helm of Martins Bank as CEO?",
        );
        assert!(v.is_some());
        // The same subject in lower case is still the subject (the
        // question names it).
        let v = judge(
            "Saif Ali Khan is married to Jocelyn Lovell.",
            "Saif Ali Khan is married to Margaret Paleologa.",
            "To whom is Saif Ali Khan wed?",
        );
        assert!(v.is_some());
    }

    #[test]
    fn a_swapped_relation_is_no_version() {
        let v = judge(
            "The Freda Prime 5 laptop is made by Jordan Retail.",
            "The Freda Prime 5 laptop is assembled in Miami.",
            "Which company produces the Freda Prime 5 laptop?",
        );
        assert_eq!(v, None);
        let v = judge(
            "The Lucas Halo 45 espresso machine is manufactured by United States Motion Picture Corporation.",
            "The Lucas Halo 45 espresso machine is produced in a factory in Malmö.",
            "Where does the Lucas Halo 45 espresso machine come off the production line?",
        );
        assert_eq!(v, None);
        // Small words inside a name link nothing.
        let v = judge(
            "Romolo Guerrieri studies at University of Virginia.",
            "Romolo Guerrieri studies at Tennessee State University.",
            "Where is Romolo Guerrieri a student?",
        );
        assert!(v.is_some());
        let v = judge(
            "The headquarters of Martins Bank are in the Czech Republic.",
            "The headquarters of Martins Bank are in Bosnia and Herzegovina.",
            "What country is home to the main base of Martins Bank?",
        );
        assert!(v.is_some());
        // A lowercase value with no small words is still a value.
        let v = judge(
            "By profession, Vincenzo Lapuma is a surgeon.",
            "By profession, Vincenzo Lapuma is a pilot.",
            "What is Vincenzo Lapuma's line of work?",
        );
        assert!(v.is_some());
    }

    #[test]
    fn names_are_capitalised_inside_a_sentence_or_in_a_run() {
        let n = names("Saif Ali Khan is a patient of Dr. Grace Lee. Standup is at 9:15.");
        for w in ["saif", "ali", "khan", "grace", "lee"] {
            assert!(n.contains(w), "{w}");
        }
        assert!(!n.contains("standup"));
        assert!(!names("The CEO of Acme is Dana.").contains("ceo"));
    }

    #[test]
    fn a_swapped_value_is_a_version_of_one_slot() {
        let v = judge(
            "The head office of Acme is in the city of Lyon.",
            "The head office of Acme is in the city of Paris.",
            "Where is Acme's head office?",
        )
        .expect("versions");
        assert_eq!((v.a.as_str(), v.b.as_str()), ("lyon", "paris"));
        assert_eq!(v.score, ONE_VALUE);
        let v = judge(
            "The headquarters of Santander Group are in the Czech Republic.",
            "The headquarters of Santander Group are in Iraq.",
            "In which country does Santander Group have its headquarters?",
        );
        assert!(v.is_some());
    }

    #[test]
    fn a_swapped_subject_is_another_fact() {
        let v = judge(
            "The head office of Acme is in the city of Lyon.",
            "The head office of Globex is in the city of Lyon.",
            "Where is Acme's head office?",
        );
        assert_eq!(v, None);
        // A name's word the question says only as a common noun is no
        // subject: the employer is the value.
        let v = judge(
            "Gaston Popper is employed by Caldwell Company.",
            "Gaston Popper is employed by Bolt Motors.",
            "In which city is the company Gaston Popper works for based?",
        )
        .expect("versions");
        assert_eq!(
            (v.a.as_str(), v.b.as_str()),
            ("caldwell company", "bolt motors")
        );
        // Named in the question, it is the subject.
        let v = judge(
            "The head office of Caldwell Company is in Lyon.",
            "The head office of Bolt Company is in Lyon.",
            "Where is the head office of Caldwell Company?",
        );
        assert_eq!(v, None);
    }

    #[test]
    fn a_value_that_repeats_a_word_of_the_subject_is_still_a_value() {
        let v = judge(
            "Luis Trenker is a patient of Dr. José Luis Garci.",
            "Luis Trenker is a patient of Dr. Christopher H. Clark.",
            "Who is Luis Trenker's GP?",
        )
        .expect("versions");
        assert_eq!(v.a, "josé luis garci");
        // The other way round the name is the subject: "Luis" asked, and
        // only one of the two says it.
        let v = judge(
            "The GP of Luis Trenker is Dr. Clark.",
            "The GP of Anna Trenker is Dr. Clark.",
            "Who is Luis Trenker's GP?",
        );
        assert_eq!(v, None);
    }

    #[test]
    fn an_indefinite_frame_holds_several_values() {
        let v = judge(
            "Mira has a child named Leo.",
            "Mira has a child named Ana.",
            "What are the names of Mira's children? Mira child",
        )
        .expect("versions");
        assert_eq!(v.score, MANY_VALUES);
    }

    #[test]
    fn a_verb_frame_is_unsure_and_a_number_is_one_value() {
        let v = judge(
            "Dana lives in Berlin.",
            "Dana lives in Lisbon.",
            "Where does Dana live?",
        );
        assert_eq!(v.map(|v| v.score), Some(UNSURE));
        let v = judge(
            "Standup is at 9:30.",
            "Standup is at 10:00.",
            "When is standup?",
        );
        assert_eq!(v.map(|v| v.score), Some(ONE_VALUE));
    }

    #[test]
    fn different_kinds_of_value_fill_different_slots() {
        let v = judge(
            "The 1:1 is at 10:15.",
            "The 1:1 is on Tuesdays.",
            "When is the 1:1?",
        );
        assert_eq!(v, None);
    }

    #[test]
    fn texts_that_share_too_little_or_nothing_asked_are_not_versions() {
        assert_eq!(
            judge("Dana likes tea.", "Kai owns a red bike.", "Dana tea"),
            None
        );
        assert_eq!(
            judge(
                "Dana lives in Berlin.",
                "Dana lives in Lisbon.",
                "What time is it?"
            ),
            None
        );
        assert_eq!(
            judge("Dana lives in Berlin.", "Dana lives in Berlin.", "Dana"),
            None
        );
    }
}
