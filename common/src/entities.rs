//! Entity normalisation, the built-in (no-LLM) extractor and the dictionary
//! linker. Shared by the write path (search-svc stores what [`extract`]
//! finds) and the graph (graph-svc matches the tenant's entity dictionary in
//! memories and queries with [`ngram_spans`] / [`link`]) so both sides agree
//! on what a name is.
//!
//! The rules reproduce the no-LLM graph that reached R@5 ≈ 92 on 2Wiki dev
//! (notes/graph-probe.md); deviating from them cost recall there:
//!
//! * Names are compared in [`normalize`]d form: lowercase, every run of
//!   non-alphanumeric characters folded to one space.
//! * The title, without parentheticals ("Foo (film)" → "Foo"), is the
//!   memory's *home* entity: the memory is about it. Kept even when short.
//! * Capitalised spans of the content: maximal runs of words starting with an
//!   uppercase letter, separated only by whitespace, optionally bridged by
//!   one lowercase connector (`of the de von van la le du di da &`), e.g.
//!   "Bishop of Elmham". Spans are split on "and" and commas. A span at the
//!   start of a sentence loses its leading stopwords ("The film …" → nothing,
//!   "In Paris" → "Paris"). Spans made only of stopwords, or whose normalised
//!   form has at most two characters, are dropped.
//! * Quoted names: 1–8 words between double quotes (straight or curly).
//! * Years (1000–2099) and numbers followed by a unit word ("5 km",
//!   "3 million"), so facts about quantities share a node.
//! * Results are deduplicated by normalised name; the home flag wins.
//!
//! Linking (queries, and memories against the whole tenant dictionary) uses
//! word n-grams of the normalised text: a gram is a candidate when it is a
//! dictionary name and not made only of stopwords; a match lying inside a
//! longer match is dropped ("john smith" hides "smith").

use std::collections::HashSet;

/// One entity found by [`extract`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractedEntity {
    /// [`normalize`]d: the key in the `entities` table.
    pub name: String,
    /// As written (first occurrence), for display.
    pub display: String,
    /// True for the title entity: the memory is about it.
    pub is_home: bool,
}

/// Longest word n-gram matched against the dictionary inside a memory.
pub const MEMORY_MAX_NGRAM: usize = 6;
/// Longest word n-gram matched against the dictionary inside a query.
pub const QUERY_MAX_NGRAM: usize = 8;

/// Lowercase, punctuation folded to spaces, whitespace collapsed.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut space = true;
    for ch in name.chars() {
        if ch.is_alphanumeric() {
            out.extend(ch.to_lowercase());
            space = false;
        } else if !space {
            out.push(' ');
            space = true;
        }
    }
    while out.ends_with(' ') {
        out.pop();
    }
    out
}

/// `name` without its diacritics (canonical decomposition, combining marks
/// dropped: "akinoshū" → "akinoshu", "tekezé" → "tekeze"), and the Latin
/// letters that do not decompose written as the keyword index's ASCII
/// folding writes them ("søren" → "soren", "straße" → "strasse"): people
/// type names without them, memories keep them, and a name that matches
/// the keyword index should link the graph too. Borrowed when there is
/// nothing to fold.
pub fn fold_diacritics(name: &str) -> std::borrow::Cow<'_, str> {
    use unicode_normalization::UnicodeNormalization;
    use unicode_normalization::char::is_combining_mark;
    if name.is_ascii() {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut plain = String::with_capacity(name.len());
    for c in name.nfd().filter(|c| !is_combining_mark(*c)) {
        match plain_letters(c) {
            Some(letters) => plain.push_str(letters),
            None => plain.push(c),
        }
    }
    match plain == name {
        true => std::borrow::Cow::Borrowed(name),
        false => std::borrow::Cow::Owned(plain),
    }
}

/// Latin letters without a decomposition, as tantivy's `AsciiFoldingFilter`
/// (Lucene's table; search-svc's keyword analyzer) writes them.
fn plain_letters(c: char) -> Option<&'static str> {
    Some(match c {
        'ø' => "o",
        'Ø' => "O",
        'ß' => "ss",
        'æ' => "ae",
        'Æ' => "AE",
        'œ' => "oe",
        'Œ' => "OE",
        'đ' | 'ð' => "d",
        'Đ' | 'Ð' => "D",
        'ł' => "l",
        'Ł' => "L",
        'þ' => "th",
        'Þ' => "TH",
        'ı' => "i",
        'ħ' => "h",
        'Ħ' => "H",
        'ŧ' => "t",
        'Ŧ' => "T",
        _ => return None,
    })
}

// English function words plus the relation words of encyclopedic questions
// ("director", "mother", ...): as names they only create hub nodes that link
// every question to everything.
const STOPWORDS: &[&str] = &[
    "a",
    "about",
    "above",
    "after",
    "again",
    "against",
    "all",
    "also",
    "am",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "because",
    "been",
    "before",
    "being",
    "below",
    "between",
    "both",
    "born",
    "but",
    "by",
    "can",
    "could",
    "did",
    "die",
    "died",
    "do",
    "does",
    "doing",
    "down",
    "during",
    "each",
    "few",
    "film",
    "first",
    "for",
    "from",
    "further",
    "had",
    "has",
    "have",
    "having",
    "he",
    "her",
    "here",
    "hers",
    "herself",
    "him",
    "himself",
    "his",
    "how",
    "however",
    "i",
    "if",
    "in",
    "into",
    "is",
    "it",
    "its",
    "itself",
    "just",
    "me",
    "more",
    "most",
    "mother",
    "father",
    "wife",
    "husband",
    "director",
    "song",
    "my",
    "myself",
    "no",
    "nor",
    "not",
    "now",
    "of",
    "off",
    "on",
    "once",
    "only",
    "or",
    "other",
    "our",
    "ours",
    "ourselves",
    "out",
    "over",
    "own",
    "same",
    "she",
    "should",
    "so",
    "some",
    "such",
    "than",
    "that",
    "the",
    "their",
    "theirs",
    "them",
    "themselves",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "to",
    "too",
    "under",
    "until",
    "up",
    "very",
    "was",
    "we",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "whom",
    "whose",
    "why",
    "will",
    "with",
    "would",
    "you",
    "your",
    "yours",
    "yourself",
    "s",
    "t",
    "d",
    "ll",
    "re",
    "ve",
    "m",
];

fn stopword_set() -> &'static HashSet<&'static str> {
    static SET: std::sync::OnceLock<HashSet<&'static str>> = std::sync::OnceLock::new();
    SET.get_or_init(|| STOPWORDS.iter().copied().collect())
}

/// Whether a single normalised word is a stopword.
pub fn is_stopword(word: &str) -> bool {
    stopword_set().contains(word)
}

/// Whether a normalised name consists only of stopwords (or is empty).
pub fn is_stopword_only(name: &str) -> bool {
    name.split(' ').all(|w| w.is_empty() || is_stopword(w))
}

/// Removes every parenthetical ("Foo (film)" → "Foo"); unbalanced brackets
/// drop the rest of the string.
pub fn strip_parentheticals(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut depth = 0usize;
    for ch in s.chars() {
        match ch {
            '(' | '[' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(ch),
            _ => {}
        }
    }
    out.trim().to_string()
}

/// Key under which two entity names are synonyms: normalised after dropping
/// parentheticals, so "Foo (film)" and "foo" meet.
pub fn synonym_key(display: &str) -> String {
    normalize(&strip_parentheticals(display))
}

const CONNECTORS: &[&str] = &[
    "of", "the", "de", "von", "van", "la", "le", "du", "di", "da", "&",
];

const UNITS: &[&str] = &[
    "km",
    "kilometres",
    "kilometers",
    "m",
    "metres",
    "meters",
    "cm",
    "mm",
    "mi",
    "miles",
    "ft",
    "feet",
    "kg",
    "g",
    "lb",
    "lbs",
    "pounds",
    "tons",
    "tonnes",
    "percent",
    "%",
    "million",
    "billion",
    "thousand",
    "hundred",
    "years",
    "days",
    "hours",
    "minutes",
    "seconds",
    "usd",
    "$",
    "eur",
    "mph",
    "kmh",
    "acres",
    "hectares",
];

#[derive(Debug, Clone, Copy)]
struct Token<'a> {
    text: &'a str,
    /// Only whitespace between the previous token and this one.
    glued: bool,
    /// First token of a sentence (start of text, or after . ! ? : ; or newline).
    sentence_start: bool,
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '\'' || c == '-' || c == '’'
}

fn tokenize(text: &str) -> Vec<Token<'_>> {
    let mut tokens = Vec::new();
    let mut glued = false;
    let mut sentence_start = true;
    let mut iter = text.char_indices().peekable();
    while let Some((i, c)) = iter.next() {
        if is_word_char(c) && !(c == '\'' || c == '’' || c == '-') || c == '&' {
            let mut end = i + c.len_utf8();
            if c != '&' {
                while let Some(&(j, d)) = iter.peek() {
                    if is_word_char(d) {
                        end = j + d.len_utf8();
                        iter.next();
                    } else {
                        break;
                    }
                }
            }
            tokens.push(Token {
                text: &text[i..end],
                glued,
                sentence_start,
            });
            glued = true;
            sentence_start = false;
        } else if c.is_whitespace() {
            if c == '\n' {
                sentence_start = true;
                glued = false;
            }
        } else {
            if matches!(c, '.' | '!' | '?' | ':' | ';') {
                sentence_start = true;
            }
            glued = false;
        }
    }
    tokens
}

fn starts_upper(s: &str) -> bool {
    s.chars().next().is_some_and(char::is_uppercase)
}

/// Capitalised spans, already split on "and" / commas, as token slices.
fn capitalised_spans<'a>(tokens: &[Token<'a>]) -> Vec<(bool, Vec<&'a str>)> {
    let mut spans = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if !starts_upper(tokens[i].text) {
            i += 1;
            continue;
        }
        let sentence_start = tokens[i].sentence_start;
        let mut words = vec![tokens[i].text];
        let mut j = i + 1;
        while let Some(next) = tokens.get(j) {
            if !next.glued {
                break;
            }
            if starts_upper(next.text) {
                words.push(next.text);
                j += 1;
                continue;
            }
            let lower = next.text.to_lowercase();
            let bridged = CONNECTORS.contains(&lower.as_str())
                && tokens
                    .get(j + 1)
                    .is_some_and(|t| t.glued && starts_upper(t.text));
            if bridged {
                words.push(next.text);
                words.push(tokens[j + 1].text);
                j += 2;
            } else {
                break;
            }
        }
        spans.push((sentence_start, words));
        i = j;
    }
    // Split on "and" (also when capitalised: "Smith And Jones").
    let mut out = Vec::new();
    for (sentence_start, words) in spans {
        let mut first = true;
        for part in words.split(|w| w.eq_ignore_ascii_case("and")) {
            if !part.is_empty() {
                out.push((sentence_start && first, part.to_vec()));
            }
            first = false;
        }
    }
    out
}

fn quoted_spans(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut open: Option<usize> = None;
    for (i, c) in text.char_indices() {
        match (c, open) {
            ('"' | '“', None) => open = Some(i + c.len_utf8()),
            ('"' | '”', Some(start)) => {
                let inner = text[start..i].trim();
                let words = inner.split_whitespace().count();
                if (1..=8).contains(&words) {
                    out.push(inner);
                }
                open = None;
            }
            ('\n', Some(_)) => open = None,
            _ => {}
        }
    }
    out
}

fn numeric_entities(tokens: &[Token<'_>]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let digits: String = t.text.chars().filter(|c| *c != ',').collect();
        if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Some(next) = tokens.get(i + 1).filter(|n| n.glued)
            && UNITS.contains(&next.text.to_lowercase().as_str())
        {
            out.push(format!("{} {}", t.text, next.text));
        } else if digits.len() == 4 && (digits.starts_with('1') || digits.starts_with("20")) {
            out.push(digits);
        }
    }
    out
}

/// The built-in no-LLM extractor; see the module doc for the rules.
pub fn extract(title: &str, content: &str) -> Vec<ExtractedEntity> {
    let mut out: Vec<ExtractedEntity> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut push = |display: String, is_home: bool, out: &mut Vec<ExtractedEntity>| {
        let name = normalize(&display);
        if name.is_empty() || is_stopword_only(&name) {
            return;
        }
        if !is_home && name.chars().count() <= 2 {
            return;
        }
        if seen.insert(name.clone()) {
            out.push(ExtractedEntity {
                name,
                display,
                is_home,
            });
        } else if is_home && let Some(e) = out.iter_mut().find(|e| e.name == name) {
            e.is_home = true;
        }
    };
    let home = strip_parentheticals(title);
    if !home.is_empty() {
        push(home, true, &mut out);
    }
    let tokens = tokenize(content);
    for (sentence_start, mut words) in capitalised_spans(&tokens) {
        if sentence_start {
            while words
                .first()
                .is_some_and(|w| is_stopword_only(&normalize(w)))
            {
                words.remove(0);
            }
        }
        if words.is_empty() {
            continue;
        }
        push(words.join(" "), false, &mut out);
    }
    for q in quoted_spans(content) {
        push(q.to_string(), false, &mut out);
    }
    for n in numeric_entities(&tokens) {
        push(n, false, &mut out);
    }
    out
}

/// Every word n-gram (n ≤ `max_n`) of an already [`normalize`]d text, as
/// `(first_word, last_word_exclusive, gram)`; grams borrow from `normalized`.
pub fn ngram_spans(normalized: &str, max_n: usize) -> Vec<(usize, usize, &str)> {
    let bounds: Vec<(usize, usize)> = {
        let mut v = Vec::new();
        let mut start = None;
        for (i, c) in normalized.char_indices() {
            match (c == ' ', start) {
                (true, Some(s)) => {
                    v.push((s, i));
                    start = None;
                }
                (false, None) => start = Some(i),
                _ => {}
            }
        }
        if let Some(s) = start {
            v.push((s, normalized.len()));
        }
        v
    };
    let mut out = Vec::with_capacity(bounds.len() * max_n);
    for i in 0..bounds.len() {
        for j in i + 1..=(i + max_n).min(bounds.len()) {
            out.push((i, j, &normalized[bounds[i].0..bounds[j - 1].1]));
        }
    }
    out
}

/// Calls `f(gram)` for each n-gram (n ≤ `max_n`) of a normalised text;
/// allocation-free, for matching every memory against a large dictionary.
pub fn for_each_ngram(normalized: &str, max_n: usize, mut f: impl FnMut(&str)) {
    let mut starts = Vec::new();
    let mut ends = Vec::new();
    let mut start = None;
    for (i, c) in normalized.char_indices() {
        match (c == ' ', start) {
            (true, Some(s)) => {
                starts.push(s);
                ends.push(i);
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        starts.push(s);
        ends.push(normalized.len());
    }
    for i in 0..starts.len() {
        for j in i..(i + max_n).min(starts.len()) {
            f(&normalized[starts[i]..ends[j]]);
        }
    }
}

/// Dictionary linking of a query: the n-grams (n ≤ `max_n`) of
/// `normalize(text)` that `lookup` knows, stopword-only grams out, and
/// matches lying inside a longer match dropped. When a gram is unknown, a
/// trailing plural / possessive "s" on its last word is tried too (cheap
/// fuzzy matching: "beatles'" and "americans" still link).
pub fn link<T: Clone>(
    text: &str,
    max_n: usize,
    lookup: impl Fn(&str) -> Option<T>,
) -> Vec<(String, T)> {
    let normalized = normalize(text);
    let mut found: Vec<(usize, usize, String, T)> = Vec::new();
    for (i, j, gram) in ngram_spans(&normalized, max_n) {
        if is_stopword_only(gram) {
            continue;
        }
        let hit = lookup(gram).map(|t| (gram.to_string(), t)).or_else(|| {
            let stem = gram
                .strip_suffix('s')
                .filter(|s| s.rsplit(' ').next().is_some_and(|w| w.chars().count() >= 3))?;
            if is_stopword_only(stem) {
                return None;
            }
            lookup(stem).map(|t| (stem.to_string(), t))
        });
        if let Some((name, t)) = hit {
            found.push((i, j, name, t));
        }
    }
    let mut out: Vec<(String, T)> = Vec::new();
    for (k, (i, j, name, t)) in found.iter().enumerate() {
        let inside_longer = found.iter().enumerate().any(|(m, (a, b, other, _))| {
            m != k && a <= i && j <= b && (b - a) > (j - i) && other != name
        });
        // The probe drops a name occurring inside any longer linked name.
        let inside_name = found.iter().any(|(_, _, other, _)| {
            other != name && other.len() > name.len() && contains_words(other, name)
        });
        if !inside_longer && !inside_name && !out.iter().any(|(n, _)| n == name) {
            out.push((name.clone(), t.clone()));
        }
    }
    out
}

/// Whether `needle` occurs in `hay` on word boundaries (both normalised).
pub fn contains_words(hay: &str, needle: &str) -> bool {
    let hay = format!(" {hay} ");
    let needle = format!(" {needle} ");
    hay.contains(&needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diacritics_and_undecomposed_latin_letters_fold_and_other_scripts_stay() {
        assert_eq!(fold_diacritics("akinoshū kenji"), "akinoshu kenji");
        assert_eq!(
            fold_diacritics("tekezé zürich ñandú"),
            "tekeze zurich nandu"
        );
        assert_eq!(fold_diacritics("søren straße łódź"), "soren strasse lodz");
        assert_eq!(fold_diacritics("æsir þór"), "aesir thor");
        // Other scripts stay as they are, borrowed.
        assert!(matches!(
            fold_diacritics("東京"),
            std::borrow::Cow::Borrowed("東京")
        ));
        assert!(matches!(
            fold_diacritics("plain"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    fn names(v: &[ExtractedEntity]) -> Vec<&str> {
        v.iter().map(|e| e.name.as_str()).collect()
    }

    #[test]
    fn normalize_folds_punctuation_and_case() {
        assert_eq!(normalize("  St. Maurice's  Abbey! "), "st maurice s abbey");
        assert_eq!(normalize("Émile"), "émile");
        assert_eq!(normalize("..."), "");
    }

    #[test]
    fn title_without_parenthetical_is_home() {
        let e = extract("Theodred II (Bishop of Elmham)", "He was a bishop.");
        assert_eq!(e[0].name, "theodred ii");
        assert!(e[0].is_home);
        assert_eq!(e.iter().filter(|e| e.is_home).count(), 1);
    }

    #[test]
    fn capitalised_spans_with_connectors_and_splits() {
        let e = extract(
            "Teutberga",
            "Teutberga( died 11 November 875) was a queen of Lotharingia by marriage to \
             Lothair II. She was a daughter of Bosonid Boso the Elder and sister of Hucbert, \
             the lay- abbot of St. Maurice's Abbey. Theodred II was a medieval Bishop of Elmham.",
        );
        let n = names(&e);
        assert!(n.contains(&"teutberga"));
        assert!(n.contains(&"lotharingia"));
        assert!(n.contains(&"lothair ii"));
        assert!(n.contains(&"bosonid boso the elder"), "{n:?}");
        assert!(n.contains(&"hucbert"));
        assert!(n.contains(&"maurice s abbey"), "{n:?}");
        assert!(n.contains(&"bishop of elmham"), "{n:?}");
        // "She" is a sentence-initial stopword: never an entity.
        assert!(!n.contains(&"she"));
        // Deduplicated, home flag kept.
        assert_eq!(n.iter().filter(|x| **x == "teutberga").count(), 1);
        assert!(e[0].is_home);
    }

    #[test]
    fn and_splits_spans_and_sentence_initial_stopwords_go() {
        let e = extract(
            "",
            "The Beatles were here. In Paris And London they played.",
        );
        let n = names(&e);
        assert!(n.contains(&"beatles"), "{n:?}");
        assert!(n.contains(&"paris"), "{n:?}");
        assert!(n.contains(&"london"), "{n:?}");
        assert!(!n.iter().any(|x| x.contains(" and ")), "{n:?}");
        // Mid-sentence articles stay part of the name.
        let e = extract("", "He moved to The Hague.");
        assert!(names(&e).contains(&"the hague"), "{:?}", names(&e));
    }

    #[test]
    fn quoted_names_numbers_and_years() {
        let e = extract(
            "",
            "the song \u{201c}let it be\u{201d} ran 3 million copies in 1970 over 5 km.",
        );
        let n = names(&e);
        assert!(n.contains(&"let it be"), "{n:?}");
        assert!(n.contains(&"3 million"), "{n:?}");
        assert!(n.contains(&"1970"), "{n:?}");
        assert!(n.contains(&"5 km"), "{n:?}");
        // Plain small numbers are not entities.
        assert!(!n.contains(&"3"));
    }

    #[test]
    fn stopword_only_and_tiny_spans_are_dropped() {
        let e = extract("", "So The And. It is OK. Of The");
        assert!(e.is_empty(), "{:?}", names(&e));
        assert!(is_stopword("the"));
        assert!(!is_stopword("paris"));
        assert!(is_stopword_only("of the"));
        assert!(!is_stopword_only("bank of america"));
    }

    #[test]
    fn synonym_keys_ignore_parentheticals() {
        assert_eq!(synonym_key("Foo (film)"), synonym_key("foo"));
        assert_eq!(strip_parentheticals("A (b) c [d]"), "A  c");
    }

    #[test]
    fn linking_prefers_longer_matches() {
        let dict: HashSet<&str> = ["john smith", "smith", "paris", "the", "american"]
            .into_iter()
            .collect();
        let got = link(
            "Did John Smith visit Paris, the Americans?",
            QUERY_MAX_NGRAM,
            |g| dict.get(g).map(|s| s.to_string()),
        );
        let n: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(n, vec!["john smith", "paris", "american"]);
    }

    #[test]
    fn ngrams_borrow_word_ranges() {
        let mut seen = Vec::new();
        for_each_ngram("a b c", 2, |g| seen.push(g.to_string()));
        assert_eq!(seen, vec!["a", "a b", "b", "b c", "c"]);
        let spans = ngram_spans("a b c", 8);
        assert_eq!(spans.len(), 6);
        assert_eq!(spans[2], (0, 3, "a b c"));
    }
}
