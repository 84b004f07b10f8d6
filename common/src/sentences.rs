//! Sentence splitting for the fact index: search-svc embeds each sentence of
//! a memory at write time, and the query is matched against them so the
//! entities of the best-matching sentences seed the graph walk (HippoRAG 2's
//! query-to-fact linking, with sentences standing in for its LLM triples, as
//! LinearRAG does). Rules, not a model: split after `.`, `!` or `?` followed
//! by white space and a capital, digit or quote, or at a line break; never
//! after an initial ("J. R. R.") or a common abbreviation ("Dr.", "St.").
//! Fragments too short to state a fact join the sentence before them.

/// At most this many sentences per memory are indexed: a 40 KB memory must
/// not cost hundreds of embeddings on one write.
pub const MAX_SENTENCES: usize = 24;
/// A fragment shorter than this (in characters) joins its neighbour.
const MIN_CHARS: usize = 20;
/// A sentence longer than this is cut (at a character boundary).
const MAX_CHARS: usize = 600;

const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "no", "inc", "co", "ltd", "gen", "col",
    "lt", "sgt", "capt", "prof", "rev", "mt", "ft", "fig", "vol", "approx", "e.g", "i.e",
];

/// The sentences of `text`, trimmed, at most [`MAX_SENTENCES`].
pub fn split(text: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    let mut start = 0usize;
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    for (i, &(pos, c)) in chars.iter().enumerate() {
        let end = pos + c.len_utf8();
        let boundary = match c {
            '\n' => true,
            '.' | '!' | '?' => ends_sentence(text, start, pos, &chars[i + 1..]),
            _ => false,
        };
        if boundary {
            push(&mut out, text, start, end);
            start = end;
        }
    }
    push(&mut out, text, start, text.len());
    out.truncate(MAX_SENTENCES);
    out
}

/// Whether the mark at `pos` ends a sentence: white space then a capital,
/// digit or quote follows, and the word before it is no abbreviation.
fn ends_sentence(text: &str, start: usize, pos: usize, rest: &[(usize, char)]) -> bool {
    let mut after = rest
        .iter()
        .map(|&(_, c)| c)
        .skip_while(|c| matches!(c, '"' | '\'' | ')' | '”'));
    let Some(space) = after.next() else {
        return false;
    };
    let next_ok = after
        .find(|c| !c.is_whitespace())
        .is_some_and(|n| n.is_uppercase() || n.is_ascii_digit() || matches!(n, '"' | '“' | '\''));
    if !space.is_whitespace() || !next_ok {
        return false;
    }
    let before = &text[start..pos];
    let word = before
        .rsplit(|c: char| c.is_whitespace() || c == '(')
        .next()
        .unwrap_or("");
    let is_initial = word.chars().count() == 1 && word.chars().all(char::is_uppercase);
    !is_initial && !ABBREVIATIONS.contains(&word.to_lowercase().as_str())
}

fn push<'a>(out: &mut Vec<&'a str>, text: &'a str, start: usize, end: usize) {
    let s = text[start..end].trim();
    if s.is_empty() {
        return;
    }
    match out.last_mut() {
        // A short fragment joins the sentence before it (same source span).
        Some(prev) if s.chars().count() < MIN_CHARS || prev.chars().count() < MIN_CHARS => {
            let prev_start = prev.as_ptr() as usize - text.as_ptr() as usize;
            let joined = text[prev_start..end].trim();
            *prev = cut(joined);
        }
        _ => out.push(cut(s)),
    }
}

fn cut(s: &str) -> &str {
    match s.char_indices().nth(MAX_CHARS) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_sentence_ends() {
        let s = split(
            "Paris is the capital of France. It has 2.1 million people! Is it large? Yes, quite large indeed.",
        );
        assert_eq!(
            s,
            vec![
                "Paris is the capital of France.",
                // A fragment under 20 characters joins the one before.
                "It has 2.1 million people! Is it large?",
                "Yes, quite large indeed."
            ]
        );
    }

    #[test]
    fn initials_and_abbreviations_do_not_split() {
        let s =
            split("J. R. R. Tolkien met Dr. Smith in St. Louis in 1937. They talked for hours.");
        assert_eq!(
            s,
            vec![
                "J. R. R. Tolkien met Dr. Smith in St. Louis in 1937.",
                "They talked for hours."
            ]
        );
    }

    #[test]
    fn line_breaks_split_and_blank_text_has_none() {
        assert_eq!(
            split("First line about things\nSecond line about more things"),
            vec!["First line about things", "Second line about more things"]
        );
        assert!(split("  \n ").is_empty());
    }

    #[test]
    fn long_text_is_bounded() {
        let text = "This sentence states one fact. ".repeat(100);
        let s = split(&text);
        assert_eq!(s.len(), MAX_SENTENCES);
        let long = "a".repeat(5000);
        assert_eq!(split(&long)[0].chars().count(), MAX_CHARS);
    }

    #[test]
    fn never_panics_on_odd_text() {
        for t in [
            "...",
            "?!",
            "é. É. ü",
            ". A",
            "a.\u{2028}B",
            "x. \"Y\" z. 1",
        ] {
            let _ = split(t);
        }
    }
}
