//! What a question asks for, and whether a fact offers it: the answer
//! type, read from the question's first words (pure; a leaf).
//!
//! "Who heads Martins Bank?" asks for someone: a name, and not a name
//! right after "in" ("… has its head office in Samarkand" says where, not
//! who, and neither does "… are in the Czech Republic" or "… resides in the
//! city of Miami"). So does "Which company employs K. Narayanan?": the
//! noun after "which" is no place ("… works as a nurse" offers no name,
//! "… resides in the city of Miami" no company). "Which city …", "Which
//! languages …" ask for a name of any kind (nouns whose names follow "in",
//! [`IN_NOUNS`]); "In which city is the Jitao 9 made?" for a place, a name
//! right after "in" ("The maker of the Jitao 9 is Middleton Railway" offers
//! none). Other questions ("What …", "Where …", "When …") want anything,
//! and so does a question that names its thing through a relative clause
//! ("Who is the mayor of the city where Acme has its head office?" is a
//! chain, chain.rs, whose first fact names a place).
//!
//! Stage 4c (subject.rs) puts the subject's facts that offer what is asked
//! before those that do not; nothing else reads it.

use std::collections::HashSet;

use super::slots;
use super::text::{FILLER, capitalised, clause_at, clause_words};

/// What a question asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wants {
    /// "Who …", "Whom …", "To whom …", "Which company …": a name, not a
    /// place.
    Someone,
    /// "Which city …", "At which place …": a name.
    Name,
    /// "In which …": a place, a name right after "in" ("… is assembled in
    /// Miami", not "The maker of … is Middleton Railway").
    Place,
    /// Anything.
    Anything,
}

/// Prepositions that may open a "which" question ("At which company …").
const OPENERS: &[&str] = &["in", "at", "for", "to", "from", "with", "by", "on"];

impl Wants {
    pub fn of(question: &str) -> Wants {
        let owned = clause_words(question);
        let clause = clause_at(&owned.iter().map(String::as_str).collect::<Vec<_>>());
        if clause.is_some() {
            return Wants::Anything;
        }
        let words = slots::tokens(question);
        match words.as_slice() {
            [w, ..] if w == "who" || w == "whom" => Wants::Someone,
            [to, whom, ..] if to == "to" && whom == "whom" => Wants::Someone,
            [w, noun, ..] if w == "which" => of_noun(noun),
            // "In which city does Léa Pool's employer have its head
            // office?" asks where another thing is (a chain, chain.rs):
            // the subject's own places must not lead, so any name does.
            [p, w, ..] if p == "in" && w == "which" && !possessive(question) => Wants::Place,
            [p, w, noun, ..] if OPENERS.contains(&p.as_str()) && w == "which" => of_noun(noun),
            _ => Wants::Anything,
        }
    }

    /// Whether the fact offers what is asked: a name the question does not
    /// say (`asked`: the question's names, lowercased), of the kind wanted.
    pub fn offered_by(self, content: &str, asked: &HashSet<String>) -> bool {
        match self {
            Wants::Anything => true,
            Wants::Name => !new_names(content, asked).is_empty(),
            Wants::Someone => new_names(content, asked).contains(&false),
            Wants::Place => new_names(content, asked).contains(&true),
        }
    }
}

/// For each run of capitalised words in `content` that holds a word the
/// question does not name (a run opened by a filler word such as "The"
/// starts after it), whether it comes right after "in" (a place), articles
/// between them aside ("in the Czech Republic").
fn new_names(content: &str, asked: &HashSet<String>) -> Vec<bool> {
    let words: Vec<&str> = content
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()))
        .filter(|w| !w.is_empty())
        .collect();
    let filler = |w: &str| FILLER.contains(&w.to_lowercase().as_str());
    let mut runs = Vec::new();
    let mut i = 0;
    while i < words.len() {
        if !capitalised(words[i]) || filler(words[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < words.len() && capitalised(words[i]) {
            i += 1;
        }
        // An initial ("K." of "K. Narayanan") names nothing new.
        let new = |w: &&str| w.chars().count() > 1 && !asked.contains(&possessed(w));
        if words[start..i].iter().any(new) {
            runs.push(after_in(&words[..start]));
        }
    }
    runs
}

/// Whether the words before a name end in "in", articles and a place
/// noun's "… of" aside: "in Prague", "in the Czech Republic", "in the city
/// of Miami".
fn after_in(before: &[&str]) -> bool {
    let mut back = before.iter().rev().map(|w| w.to_lowercase()).peekable();
    while let Some(w) = back.next() {
        let of_place = w == "of" && back.peek().is_some_and(|n| is_place_noun(n));
        if of_place {
            back.next();
        } else if !slots::ARTICLES.contains(&w.as_str()) {
            return w == "in";
        }
    }
    false
}

/// "Which company …", "Which physician …": a name that is not a place;
/// "Which city …", "Which languages …": any name ("… is a citizen of
/// Argentina", "… is fluent in Czech").
fn of_noun(noun: &str) -> Wants {
    match is_place_noun(noun) {
        true => Wants::Name,
        false => Wants::Someone,
    }
}

/// Nouns whose names are said after "in": places, and languages.
const IN_NOUNS: &[&str] = &[
    "city",
    "town",
    "village",
    "country",
    "nation",
    "county",
    "state",
    "province",
    "region",
    "district",
    "place",
    "area",
    "capital",
    "continent",
    "island",
    "neighborhood",
    "neighbourhood",
    "language",
    "location",
];

/// Whether the noun (singular or plural) is one of [`IN_NOUNS`].
fn is_place_noun(noun: &str) -> bool {
    let singular = (noun.strip_suffix("ies").map(|s| format!("{s}y")))
        .or_else(|| noun.strip_suffix('s').map(str::to_string))
        .unwrap_or_else(|| noun.to_string());
    IN_NOUNS.contains(&noun) || IN_NOUNS.contains(&singular.as_str())
}

/// Whether a word of the question is possessed ("Léa Pool's").
fn possessive(question: &str) -> bool {
    (question.split_whitespace()).any(|w| w.contains("'s") || w.contains("’s"))
}

/// A word without its possessive, lowercased: "Pujol's" → "pujol".
fn possessed(word: &str) -> String {
    let lower = word.to_lowercase();
    match (lower.strip_suffix("'s")).or_else(|| lower.strip_suffix("’s")) {
        Some(stem) => stem.to_string(),
        None => lower,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(names: &[&str]) -> HashSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_first_words_say_what_is_asked() {
        assert_eq!(Wants::of("To whom is Antonio Pujol wed?"), Wants::Someone);
        assert_eq!(Wants::of("Who's her boss?"), Wants::Someone);
        assert_eq!(Wants::of("Which company employs Dana?"), Wants::Someone);
        assert_eq!(
            Wants::of("At which company does Rosa work?"),
            Wants::Someone
        );
        assert_eq!(
            Wants::of("Which country is Rosa a citizen of?"),
            Wants::Name
        );
        assert_eq!(Wants::of("Which languages does Rosa speak?"), Wants::Name);
        assert_eq!(Wants::of("Which cities has Rosa visited?"), Wants::Name);
        assert_eq!(Wants::of("Where does Dana live?"), Wants::Anything);
        assert_eq!(Wants::of("What is Dana's line of work?"), Wants::Anything);
        assert_eq!(
            Wants::of("In which city is the Jitao 9 made?"),
            Wants::Place
        );
        // Another thing's place: a name of any kind, as before.
        let chain = "In which city does Léa Pool's employer have its head office?";
        assert_eq!(Wants::of(chain), Wants::Name);
        let chain = "Who is the mayor of the city where Acme has its head office?";
        assert_eq!(Wants::of(chain), Wants::Anything);
    }

    #[test]
    fn a_name_after_in_is_a_place_and_the_questions_names_do_not_count() {
        let pujol = asked(&["antonio", "pujol"]);
        let spouse = "Antonio Pujol's spouse is Jack Spring.";
        let home = "Antonio Pujol lives in Prague.";
        let job = "Antonio Pujol works as a nurse.";
        assert!(Wants::Someone.offered_by(spouse, &pujol));
        assert!(!Wants::Someone.offered_by(home, &pujol));
        assert!(Wants::Name.offered_by(home, &pujol));
        assert!(!Wants::Name.offered_by(job, &pujol));
        assert!(Wants::Anything.offered_by(job, &pujol));
        // An article between "in" and the name: still a place.
        let hq = "The headquarters of Martins Bank are in the Czech Republic.";
        assert!(!Wants::Someone.offered_by(hq, &asked(&["martins", "bank"])));
        assert!(Wants::Place.offered_by(hq, &asked(&["martins", "bank"])));
        assert!(!Wants::Place.offered_by(spouse, &pujol));
        let nurse = "K. Narayanan works as a nurse.";
        assert!(!Wants::Someone.offered_by(nurse, &asked(&["narayanan"])));
        let city = "Antonio Pujol resides in the city of Miami.";
        assert!(Wants::Place.offered_by(city, &pujol));
        assert!(!Wants::Someone.offered_by(city, &pujol));
        // "The" opens no name; "CEO" is one the question does not say.
        let ceo = "The CEO of Martins Bank is Lesley Selander.";
        assert!(Wants::Someone.offered_by(ceo, &asked(&["martins", "bank"])));
    }
}
