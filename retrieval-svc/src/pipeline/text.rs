//! Words of a query and of a memory, shared by the stages that compare
//! them lexically (abstention's evidence, the ranker's coverage features).
//! A leaf: it imports nothing from the pipeline.

use std::borrow::Cow;
use std::collections::HashSet;

use engram_proto::Memory;

const STOPWORDS: &[&str] = &[
    "about", "after", "and", "are", "before", "but", "can", "could", "did", "does", "for", "from",
    "had", "has", "have", "her", "his", "how", "into", "its", "kind", "many", "much", "not", "of",
    "one", "onto", "other", "over", "she", "some", "than", "that", "the", "their", "them", "then",
    "there", "these", "they", "this", "those", "through", "was", "were", "what", "when", "where",
    "which", "while", "who", "whom", "whose", "why", "will", "with", "would", "you", "your",
];

/// Words that attach a relation to the noun before them: "the composer
/// of", "the country where", "the person who" (route.rs reads chains of
/// relations with them, chain.rs chains of facts).
pub const RELATION_LINKS: &[&str] = &["of", "where", "whose", "which", "who", "whom", "that", "by"];

/// Link words that open a relative clause ("the city where X lives", "the
/// company that owns X"): the question names its thing through another.
pub const CLAUSE_LINKS: &[&str] = &["where", "whose", "who", "whom", "that", "which"];

/// Where a question's relative clause opens: the index, in `words`
/// (lowercased), of the "the" of "the <noun> <link>".
pub fn clause_at(words: &[&str]) -> Option<usize> {
    (words.windows(3)).position(|w| {
        w[0] == "the" && w[1].chars().all(char::is_alphabetic) && CLAUSE_LINKS.contains(&w[2])
    })
}

/// The question's words, lowercased, split as [`clause_at`] reads them
/// (apostrophes kept: "acme's").
pub fn clause_words(question: &str) -> Vec<String> {
    question
        .to_lowercase()
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// The relative clause through which a question names its thing, in
/// lower case: "In which country is the city where Val Guest lives?" →
/// "val guest lives" (the words after "the city where", to the end).
pub fn clause_of(question: &str) -> Option<String> {
    let owned = clause_words(question);
    let words: Vec<&str> = owned.iter().map(String::as_str).collect();
    let at = clause_at(&words)?;
    let clause = words.get(at + 3..).filter(|c| !c.is_empty())?;
    Some(clause.join(" "))
}

/// A memory's text as said: a conversation turn with a speaker reads
/// "speaker: text" (search-svc embeds it so), anything else its content.
pub fn said(m: &Memory) -> Cow<'_, str> {
    match m.turn.as_ref().filter(|t| !t.speaker.is_empty()) {
        Some(t) => Cow::Owned(format!("{}: {}", t.speaker, m.content)),
        None => Cow::Borrowed(&m.content),
    }
}

/// Alphanumeric runs of three or more characters.
pub fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 3)
}

fn content(word: &str) -> Option<String> {
    let lower = word.to_lowercase();
    (!STOPWORDS.contains(&lower.as_str())).then_some(lower)
}

/// The query's names (capitalised content words after the first word) and
/// all its content words, lowercased.
pub fn query_words(query: &str) -> (HashSet<String>, HashSet<String>) {
    let mut names = HashSet::new();
    let mut terms = HashSet::new();
    for (i, w) in words(query).enumerate() {
        let Some(lower) = content(w) else { continue };
        if i > 0 && w.chars().next().is_some_and(char::is_uppercase) {
            names.insert(lower.clone());
        }
        terms.insert(lower);
    }
    (names, terms)
}

/// How much of a text the pipeline reads for words: its first 8 KiB, cut
/// at a space. Each stage that compares words scanned whole memories, so a
/// read of `limit` 100 over 60 KiB memories cost the gateway ~26 ms of CPU
/// on the async workers every other tenant's requests share (issue 47,
/// High 3); a note, a turn or a passage is far shorter, and a long
/// document names its subject, and the bridges the name scanners look
/// for, early.
pub const SCAN_BYTES: usize = 8 * 1024;

/// The part of `text` the word scanners read: all of it up to
/// [`SCAN_BYTES`], else its first [`SCAN_BYTES`] cut back to a space (or,
/// with none, to a character boundary).
pub fn head(text: &str) -> &str {
    if text.len() <= SCAN_BYTES {
        return text;
    }
    let mut cut = SCAN_BYTES;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let part = &text[..cut];
    match part.rfind(char::is_whitespace) {
        Some(space) if space > 0 => &part[..space],
        _ => part,
    }
}

/// Adds the lowercased words of `text` (its [`head`]) to `have`, each also
/// without a trailing "s", so "groups" meets "group".
pub fn collect_words(text: &str, have: &mut HashSet<String>) {
    for w in words(head(text)) {
        let lower = w.to_lowercase();
        have.insert(lower.trim_end_matches('s').to_string());
        have.insert(lower);
    }
}

/// Share of `wanted` found in `have` (1 when nothing is wanted).
pub fn coverage(wanted: &HashSet<String>, have: &HashSet<String>) -> f32 {
    if wanted.is_empty() {
        return 1.0;
    }
    let found = wanted
        .iter()
        .filter(|w| have.contains(*w) || have.contains(w.trim_end_matches('s')))
        .count();
    found as f32 / wanted.len() as f32
}

/// Words that say nothing about which thing a text is about, even when
/// capitalised at a sentence's start.
pub const FILLER: &[&str] = &[
    "the", "a", "an", "of", "in", "on", "at", "to", "for", "and", "or", "with", "by", "from", "as",
    "is", "was", "were", "be", "been", "are", "that", "this", "which", "who", "whom", "whose",
    "what", "when", "where", "why", "how", "it", "its", "his", "her", "their", "they", "he", "she",
    "them", "also", "into", "than", "then", "there", "these", "those", "not", "but", "after",
    "before", "about", "over", "under", "during", "between", "first", "one", "two", "three", "new",
];

/// Runs of letters, digits, `_`, `'` and `-`, without a leading `'` or `-`,
/// of three or more characters.
fn name_tokens(text: &str) -> impl Iterator<Item = &str> {
    head(text)
        .split(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '\'' | '-')))
        .map(|w| w.trim_start_matches(['\'', '-']))
        .filter(|w| w.chars().count() >= 3)
}

/// Whether a word opens with a capital ("Acme", "Dr.").
pub fn capitalised(w: &str) -> bool {
    w.chars().next().is_some_and(char::is_uppercase)
}

/// The question's content words, lowercased (what [`names`] leaves out).
pub fn lower_words(text: &str) -> HashSet<String> {
    name_tokens(text)
        .map(str::to_lowercase)
        .filter(|w| !FILLER.contains(&w.as_str()))
        .collect()
}

/// A memory's names in the order it says them (its title's, then its
/// content's capitalised words, lowercased), each once, leaving out what
/// `asked` holds (the question's words, [`lower_words`]).
pub fn names<'m>(m: &'m Memory, asked: &'m HashSet<String>) -> impl Iterator<Item = String> + 'm {
    let mut seen = HashSet::new();
    name_tokens(&m.title)
        .chain(name_tokens(&m.content))
        .filter(|w| w.chars().next().is_some_and(char::is_uppercase))
        .map(str::to_lowercase)
        .filter(|w| !FILLER.contains(&w.as_str()) && !asked.contains(w))
        .filter(move |w| seen.insert(w.clone()))
}

/// The text's ([`head`]'s) runs of capitalised words, lowercased, each
/// word of three characters or more and not a filler ("The"), a
/// possessive's "'s" cut.
/// A lowercase word, a filler or a comma, semicolon or sentence end ends a
/// run; a short abbreviation's period ("Dr.", "A.") does not.
pub fn name_runs(text: &str) -> Vec<Vec<String>> {
    let mut runs: Vec<Vec<String>> = Vec::new();
    let mut run: Vec<String> = Vec::new();
    for raw in head(text).split_whitespace() {
        let word = raw.trim_matches(|c: char| !(c.is_alphanumeric() || c == '\''));
        let word = word.trim_end_matches("'s").trim_end_matches('\'');
        let lower = word.to_lowercase();
        let capital = word.chars().next().is_some_and(char::is_uppercase);
        let short = word.chars().count() <= 2;
        if capital && short && !raw.ends_with([',', ';', ':', '!', '?', ')']) {
            // An initial or a title ("A.", "Dr."): inside the run, not a name.
            continue;
        }
        if !capital || FILLER.contains(&lower.as_str()) {
            runs.push(std::mem::take(&mut run));
            continue;
        }
        if !short {
            run.push(lower);
        }
        let ends = raw.ends_with([',', ';', ':', '!', '?', ')'])
            || (raw.ends_with('.') && word.chars().count() > 2);
        if ends {
            runs.push(std::mem::take(&mut run));
        }
    }
    runs.push(run);
    runs.retain(|r| !r.is_empty());
    runs
}

// Question wording shared by the route and the stages after it.

/// Lower case, every character but letters, digits and apostrophes a
/// space, single spaces: the form [`has_phrase`] matches on.
pub fn normalise(text: &str) -> String {
    let lower: String = text
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '\'' {
                c.to_ascii_lowercase()
            } else {
                ' '
            }
        })
        .collect();
    lower.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `phrase` occurs in `norm` ([`normalise`]d) as whole words.
pub fn has_phrase(norm: &str, phrase: &str) -> bool {
    // Word-boundary match on the space-normalised text.
    format!(" {norm} ").contains(&format!(" {phrase} "))
}

/// Wording that compares things the question names itself ("who was born
/// first, A or B?", "are both X and Y ...", "the same country"): both ends
/// are in the question, so no bridge between them is needed (Stage 4b's
/// bridge weight stays off for it).
const COMPARATIVE: &[&str] = &[
    "both",
    "same",
    "difference between",
    "or",
    "older",
    "younger",
    "earlier",
    "later",
    "longer",
    "first",
];

/// Whether the question compares things it names (see [`COMPARATIVE`];
/// "compare…" and "respective…" match as word prefixes).
pub fn comparative(text: &str) -> bool {
    let norm = normalise(text);
    COMPARATIVE.iter().any(|p| has_phrase(&norm, p))
        || norm
            .split(' ')
            .any(|w| w.starts_with("compare") || w.starts_with("respective"))
}

/// Auxiliaries: "who is the person that…" asks about the person, it does
/// not relate another one to them (and "what is …" names no kind, chain.rs).
pub const AUXILIARIES: &[&str] = &[
    "is", "was", "are", "were", "am", "be", "been", "does", "did", "do", "has", "had", "have",
    "can", "could", "will", "would", "should", "shall", "may", "might", "must",
];

/// A memory with a title and content only, for unit tests.
#[cfg(test)]
pub fn page(title: &str, content: &str) -> Memory {
    Memory {
        title: title.into(),
        content: content.into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scanners_read_a_texts_first_8_kib_cut_at_a_space() {
        let short = "Mira works at Acme.";
        assert_eq!(head(short), short);
        let long = "é word ".repeat(2_000);
        let h = head(&long);
        assert!(
            h.len() <= SCAN_BYTES && h.len() > SCAN_BYTES - 16,
            "{}",
            h.len()
        );
        assert!(long.starts_with(h) && h.ends_with("word"), "cut at a space");
        let unbroken = "é".repeat(SCAN_BYTES);
        assert_eq!(
            head(&unbroken).len(),
            SCAN_BYTES,
            "no space: a char boundary"
        );
        let mut have = HashSet::new();
        collect_words(&format!("{} zebra", "a ".repeat(SCAN_BYTES)), &mut have);
        assert!(!have.contains("zebra"), "past the head is not read");
    }

    #[test]
    fn a_clause_is_the_words_after_its_link() {
        let q = "In which country is the city where Val Guest lives?";
        assert_eq!(clause_of(q).as_deref(), Some("val guest lives"));
        let q = "Who is the spouse of the man who directed Kiss of Death?";
        assert_eq!(clause_of(q).as_deref(), Some("directed kiss of death"));
        assert_eq!(clause_of("Where does Lena live?"), None);
        assert_eq!(clause_of("Name the city where"), None);
    }

    #[test]
    fn the_first_word_and_stopwords_are_not_names() {
        let (names, terms) = query_words("Where did The Beatles play in Hamburg?");
        assert!(names.contains("beatles") && names.contains("hamburg"));
        assert!(!names.contains("where") && !terms.contains("the"));
    }

    #[test]
    fn plurals_meet_their_singular() {
        let mut have = HashSet::new();
        collect_words("the support groups met", &mut have);
        let (_, terms) = query_words("support group");
        assert_eq!(coverage(&terms, &have), 1.0);
    }
}
