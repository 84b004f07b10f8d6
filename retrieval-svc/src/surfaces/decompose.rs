//! Rule-based query decomposition for agentic retrieval: no LLM, so it is
//! free, deterministic and always available. Two shapes cover most
//! multi-hop questions: comparisons ("X or Y", "both X and Y") split per
//! entity and run in parallel; bridges ("the director of X", "X's
//! director") retrieve the inner entity first and ask the outer question
//! about the entity found in the best hit.

/// Lowercase words that may sit inside a name ("John von Neumann").
const CONNECTORS: &[&str] = &[
    "von", "van", "de", "der", "la", "le", "du", "of", "the", "and",
];

/// Capitalised words that start sentences rather than name things.
const NOT_NAMES: &[&str] = &[
    "The", "A", "An", "He", "She", "It", "They", "We", "I", "You", "This", "That", "These",
    "Those", "In", "On", "At", "By", "For", "His", "Her", "Its", "Their", "Our", "My", "After",
    "Before", "When", "Where", "Who", "Whom", "Whose", "What", "Which", "Why", "How", "Is", "Are",
    "Was", "Were", "Did", "Do", "Does", "And", "But", "Or", "If", "As", "From", "With", "There",
    "Both", "Between", "Compare",
];

/// The placeholder the bridge entity replaces in a follow-up.
pub const SLOT: &str = "{}";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Single(String),
    /// Independent sub-queries, run in parallel.
    Parallel(Vec<String>),
    /// Retrieve `first`, then `follow_up` with [`SLOT`] replaced by the
    /// entity found in the best hit.
    Bridge {
        first: String,
        follow_up: String,
    },
}

impl Plan {
    pub fn sub_queries(&self) -> Vec<String> {
        match self {
            Self::Single(q) => vec![q.clone()],
            Self::Parallel(qs) => qs.clone(),
            Self::Bridge { first, follow_up } => vec![first.clone(), follow_up.clone()],
        }
    }
}

fn trim_punct(w: &str) -> &str {
    w.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'' && c != '-')
}

/// What follows `trimmed` (= `trim_punct(w)`) inside `w`: its trailing
/// punctuation. Counted from where `trimmed` starts, since leading
/// punctuation shifts it, and never inside a character.
fn after_trimmed<'a>(w: &'a str, trimmed: &str) -> &'a str {
    let lead = w.len()
        - w.trim_start_matches(|c: char| !c.is_alphanumeric() && c != '\'' && c != '-')
            .len();
    w.get(lead + trimmed.len()..).unwrap_or("")
}

fn is_cap(w: &str) -> bool {
    trim_punct(w).chars().next().is_some_and(char::is_uppercase)
}

fn ends_clause(w: &str) -> bool {
    w.ends_with([',', ';', ':', '?', '!', '.'])
}

/// The name ending at the end of `left`: the trailing run of capitalised
/// words and connectors, without leading connectors; else the words after
/// the last comma (at most four).
fn trailing_entity(left: &str) -> Option<String> {
    let words: Vec<&str> = left.split_whitespace().collect();
    let mut start = words.len();
    while start > 0 {
        let w = words[start - 1];
        let bare = trim_punct(w);
        if start < words.len() && ends_clause(w) {
            break;
        }
        if is_cap(w) || CONNECTORS.contains(&bare) {
            start -= 1;
        } else {
            break;
        }
    }
    while start < words.len()
        && (!is_cap(words[start]) || NOT_NAMES.contains(&trim_punct(words[start])))
    {
        start += 1;
    }
    if start < words.len() {
        let name: Vec<&str> = words[start..].iter().map(|w| trim_punct(w)).collect();
        return Some(name.join(" "));
    }
    let tail = left.rsplit([',', ':']).next()?.trim();
    let n = tail.split_whitespace().count();
    (tail.len() < left.trim().len() && (1..=4).contains(&n)).then(|| tail.to_string())
}

/// The name starting `right`: capitalised words and connectors up to the
/// clause end; else up to four words before punctuation.
fn leading_entity(right: &str) -> Option<String> {
    let mut out = Vec::new();
    let mut any_cap = false;
    for w in right.split_whitespace() {
        let bare = trim_punct(w);
        if is_cap(w) {
            any_cap = true;
        } else if !(CONNECTORS.contains(&bare) && (any_cap || out.is_empty())) {
            break;
        }
        out.push(bare);
        if ends_clause(w) {
            break;
        }
    }
    while out.last().is_some_and(|w| !is_cap(w)) {
        out.pop();
    }
    while out.first().is_some_and(|w| !is_cap(w)) {
        out.remove(0);
    }
    if !out.is_empty() {
        return Some(out.join(" "));
    }
    let head = right.split([',', ';', '?', '!', '.']).next()?.trim();
    let n = head.split_whitespace().count();
    (1..=4).contains(&n).then(|| head.to_string())
}

/// Byte offset in `hay` of the first occurrence of `needle` (a lowercase
/// ASCII cue such as " and "), ignoring ASCII case. Compared in place
/// rather than on `hay.to_lowercase()`: lowercasing changes the byte length
/// of some characters (U+212A KELVIN SIGN shrinks, U+0130 grows), so an
/// offset into the lowercased copy may fall inside a character of `hay` and
/// slicing there panics. Every offset returned is a char boundary of `hay`,
/// and so is the offset plus `needle.len()`.
fn find_word(hay: &str, needle: &str) -> Option<usize> {
    hay.char_indices().map(|(i, _)| i).find(|&i| {
        hay.get(i..i + needle.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(needle))
    })
}

fn replace_span(q: &str, from: usize, to: usize, with: &str) -> String {
    format!("{}{with}{}", &q[..from], &q[to..])
}

/// "X or Y", "X vs Y", "both X and Y", "between X and Y", "compare X and/with Y".
fn comparison(q: &str) -> Option<Vec<String>> {
    for (cue, sep) in [
        ("both ", " and "),
        ("between ", " and "),
        ("compare ", " with "),
        ("compare ", " and "),
    ] {
        if let Some(c) = find_word(q, cue)
            && (c == 0 || q.as_bytes()[c - 1] == b' ')
        {
            let after = c + cue.len();
            if let Some(s) = find_word(&q[after..], sep) {
                let x = q[after..after + s].trim();
                let rest = &q[after + s + sep.len()..];
                let y = leading_entity(rest)?;
                if x.is_empty() || x.split_whitespace().count() > 6 {
                    continue;
                }
                let end = after + s + sep.len() + rest.find(y.as_str()).unwrap_or(0) + y.len();
                return Some(
                    [x.to_string(), y]
                        .iter()
                        .map(|e| replace_span(q, c, end.min(q.len()), e))
                        .collect(),
                );
            }
        }
    }
    for sep in [" or ", " vs ", " vs. ", " versus "] {
        let Some(s) = find_word(q, sep) else { continue };
        let left = &q[..s];
        let right = &q[s + sep.len()..];
        let (Some(x), Some(y)) = (trailing_entity(left), leading_entity(right)) else {
            continue;
        };
        let start = left.rfind(x.as_str()).unwrap_or(s);
        let end = s + sep.len() + right.find(y.as_str()).unwrap_or(0) + y.len();
        return Some(
            [x, y]
                .iter()
                .map(|e| replace_span(q, start, end.min(q.len()), e))
                .collect(),
        );
    }
    None
}

/// The capitalised object of "... of <descriptor?> <Name>".
fn object_after_of(rest: &str) -> Option<String> {
    let mut out = Vec::new();
    let mut lower_prefix = 0;
    let mut any_cap = false;
    for w in rest.split_whitespace() {
        let bare = trim_punct(w);
        if is_cap(w) {
            any_cap = true;
        } else if any_cap && CONNECTORS.contains(&bare) {
            // Part of the name only if a capitalised word follows.
        } else if !any_cap && lower_prefix < 2 && bare != "the" {
            lower_prefix += 1;
        } else if !any_cap && bare == "the" && out.is_empty() {
            continue;
        } else {
            break;
        }
        out.push(bare);
        if ends_clause(w) {
            break;
        }
    }
    while out.last().is_some_and(|w| !is_cap(w)) {
        out.pop();
    }
    any_cap.then(|| out.join(" ")).filter(|s| !s.is_empty())
}

/// "the <relation> of <Name>" (innermost) or "<Name>'s <relation>".
fn bridge(q: &str) -> Option<(String, String)> {
    let words: Vec<&str> = q.split_whitespace().collect();
    // Innermost "the R of N": the last one whose object is a name.
    for i in (0..words.len().saturating_sub(2)).rev() {
        let the = trim_punct(words[i]).to_lowercase();
        if !(the == "the" || the == "a") || trim_punct(words[i + 2]) != "of" {
            continue;
        }
        let relation = trim_punct(words[i + 1]);
        if relation.is_empty() || is_cap(relation) {
            continue;
        }
        let rest = words[i + 3..].join(" ");
        let Some(object) = object_after_of(&rest) else {
            continue;
        };
        let prefix = words[..i].join(" ");
        let phrase = format!("{} {} of {}", words[i], words[i + 1], object);
        let rebuilt = words.join(" ");
        let at = prefix.len() + usize::from(!prefix.is_empty());
        let follow_up = rebuilt.get(at..).and_then(|tail| {
            tail.starts_with(&phrase)
                .then(|| format!("{}{SLOT}{}", &rebuilt[..at], &tail[phrase.len()..]))
        })?;
        return Some((format!("{relation} of {object}"), follow_up));
    }
    // "N's R"
    for (i, w) in words.iter().enumerate() {
        let Some(owner_last) = w.strip_suffix("'s") else {
            continue;
        };
        if i + 1 >= words.len() || !is_cap(owner_last) {
            continue;
        }
        let mut start = i;
        while start > 0 && is_cap(words[start - 1]) && !ends_clause(words[start - 1]) {
            start -= 1;
        }
        let mut owner: Vec<&str> = words[start..i].to_vec();
        owner.push(owner_last);
        // The question word is not part of the name ("Who is ...").
        while owner
            .first()
            .is_some_and(|w| NOT_NAMES.contains(&trim_punct(w)))
        {
            owner.remove(0);
            start += 1;
        }
        if owner.is_empty() {
            continue;
        }
        let relation = trim_punct(words[i + 1]);
        if relation.is_empty() {
            continue;
        }
        let owner = owner.join(" ");
        let mut follow = words[..start].to_vec();
        let suffix = after_trimmed(words[i + 1], relation);
        let slot = format!("{SLOT}{suffix}");
        follow.push(&slot);
        follow.extend(&words[i + 2..]);
        return Some((format!("{relation} of {owner}"), follow.join(" ")));
    }
    relative_clause(&words)
}

/// "the <noun> that|which|who <clause>": the description names the bridge
/// ("Who leads the project that migrates billing?"), so it is asked first
/// and the outer question is asked about whatever it finds.
fn relative_clause(words: &[&str]) -> Option<(String, String)> {
    for i in 1..words.len().saturating_sub(3) {
        let the = trim_punct(words[i]).to_lowercase();
        let noun = words[i + 1];
        let rel = words[i + 2].to_lowercase();
        if !(the == "the" || the == "a")
            || is_cap(noun)
            || ends_clause(noun)
            || !["that", "which", "who"].contains(&rel.as_str())
        {
            continue;
        }
        let end = (i + 3..words.len())
            .find(|&j| ends_clause(words[j]))
            .unwrap_or(words.len() - 1);
        if end < i + 4 {
            continue;
        }
        let last = words[end];
        let bare_last = last.trim_end_matches([',', ';', ':', '?', '!', '.']);
        let mut clause: Vec<&str> = words[i + 3..end].to_vec();
        clause.push(bare_last);
        let first = format!("{} {} {}", trim_punct(noun), rel, clause.join(" "));
        let slot = format!("{SLOT}{}", &last[bare_last.len()..]);
        let mut follow: Vec<&str> = words[..i].to_vec();
        follow.push(&slot);
        follow.extend(&words[end + 1..]);
        return Some((first, follow.join(" ")));
    }
    None
}

/// Capitalised spans (names), sentence-initial function words excluded.
pub fn named_spans(text: &str) -> Vec<String> {
    let mut spans: Vec<String> = Vec::new();
    let mut cur: Vec<&str> = Vec::new();
    let flush = |cur: &mut Vec<&str>, spans: &mut Vec<String>| {
        while cur.last().is_some_and(|w| !is_cap(w)) {
            cur.pop();
        }
        while cur.first().is_some_and(|w| NOT_NAMES.contains(w)) {
            cur.remove(0);
        }
        if !cur.is_empty() {
            let s = cur.join(" ");
            if !spans.contains(&s) {
                spans.push(s);
            }
        }
        cur.clear();
    };
    for w in text.split_whitespace() {
        let bare = trim_punct(w);
        let bare = bare.strip_suffix("'s").unwrap_or(bare);
        if bare.is_empty() {
            flush(&mut cur, &mut spans);
            continue;
        }
        if is_cap(bare) || (!cur.is_empty() && CONNECTORS.contains(&bare)) {
            cur.push(bare);
        } else {
            flush(&mut cur, &mut spans);
        }
        if ends_clause(w) || w.ends_with("'s") {
            flush(&mut cur, &mut spans);
        }
    }
    flush(&mut cur, &mut spans);
    spans
}

/// Splits `query` into a plan; `max_parts` (2..=4) bounds the sub-queries.
pub fn decompose(query: &str, max_parts: usize) -> Plan {
    let q = query.trim();
    let max_parts = max_parts.clamp(2, 4);
    if let Some(parts) = comparison(q) {
        return Plan::Parallel(parts.into_iter().take(max_parts).collect());
    }
    if let Some((first, follow_up)) = bridge(q) {
        return Plan::Bridge { first, follow_up };
    }
    // No known shape: the question itself plus each name it mentions, so
    // every entity gets its own neighbourhood.
    let mut parts = vec![q.to_string()];
    parts.extend(named_spans(q).into_iter().take(max_parts - 1));
    if parts.len() == 1 {
        Plan::Single(q.to_string())
    } else {
        Plan::Parallel(parts)
    }
}

/// The entity a bridge's hits contribute: a name the question does not
/// already mention. A name carrying the description's head noun wins from
/// any of the top hits ("the project that ..." -> "Project Atlas"), since
/// the best-scoring hit often only shares the description's words; else
/// the best hit's first fresh name (its stored entities first).
pub fn bridge_entity(hits: &[(&str, &[String])], asked: &str) -> Option<String> {
    let q = asked.to_lowercase();
    let fresh = |e: &String| {
        let l = e.to_lowercase();
        !l.is_empty() && !q.contains(&l) && !l.split(' ').all(|w| q.contains(w))
    };
    let names = |(text, entities): &(&str, &[String])| -> Vec<String> {
        let mut v: Vec<String> = entities
            .iter()
            .filter(|e| fresh(e) && e.chars().next().is_some_and(char::is_uppercase))
            .cloned()
            .collect();
        v.extend(named_spans(text).into_iter().filter(|e| fresh(e)));
        v
    };
    let head = q.split_whitespace().next().unwrap_or_default().to_string();
    let with_head = |e: &String| head.len() > 2 && e.to_lowercase().split(' ').any(|w| w == head);
    let all: Vec<String> = hits.iter().flat_map(&names).collect();
    let chosen = all
        .iter()
        .find(|e| with_head(e))
        .cloned()
        .or_else(|| hits.first().and_then(|h| names(h).into_iter().next()))?;
    // Later mentions shorten names ("Nolan"); a fuller form in another top
    // hit ("Christopher Nolan") retrieves better.
    let words: Vec<&str> = chosen.split(' ').collect();
    let fuller = all
        .iter()
        .filter(|e| {
            let w: Vec<&str> = e.split(' ').collect();
            w.len() > words.len() && w.windows(words.len()).any(|x| x == words.as_slice())
        })
        .max_by_key(|e| e.len());
    Some(fuller.cloned().unwrap_or(chosen))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn or_comparisons_split_per_entity() {
        assert_eq!(
            decompose("Who was born first, Alan Turing or John von Neumann?", 4),
            Plan::Parallel(vec![
                "Who was born first, Alan Turing?".into(),
                "Who was born first, John von Neumann?".into(),
            ])
        );
        assert_eq!(
            decompose("Which is older, the Eiffel Tower or Big Ben?", 4),
            Plan::Parallel(vec![
                "Which is older, the Eiffel Tower?".into(),
                "Which is older, the Big Ben?".into(),
            ])
        );
        assert_eq!(
            decompose("Is Rust vs Go faster for services?", 4).sub_queries(),
            vec!["Is Rust faster for services?", "Is Go faster for services?"]
        );
    }

    #[test]
    fn both_and_between_comparisons_split_per_entity() {
        assert_eq!(
            decompose("Are both Inception and Interstellar directed by Nolan?", 4),
            Plan::Parallel(vec![
                "Are Inception directed by Nolan?".into(),
                "Are Interstellar directed by Nolan?".into(),
            ])
        );
        assert_eq!(
            decompose("What is the difference between Postgres and MySQL?", 4).sub_queries(),
            vec![
                "What is the difference Postgres?",
                "What is the difference MySQL?"
            ]
        );
    }

    #[test]
    fn bridges_ask_the_inner_question_first() {
        assert_eq!(
            decompose("Where was the director of film Inception born?", 4),
            Plan::Bridge {
                first: "director of film Inception".into(),
                follow_up: "Where was {} born?".into(),
            }
        );
        assert_eq!(
            decompose("Who is the spouse of the founder of Acme Corp?", 4),
            Plan::Bridge {
                first: "founder of Acme Corp".into(),
                follow_up: "Who is the spouse of {}?".into(),
            }
        );
        assert_eq!(
            decompose("Who leads the project that migrates the billing system?", 4),
            Plan::Bridge {
                first: "project that migrates the billing system".into(),
                follow_up: "Who leads {}?".into(),
            }
        );
        assert_eq!(
            decompose(
                "What is the name of the company which bought Globex, and why?",
                4
            ),
            Plan::Bridge {
                first: "company which bought Globex".into(),
                follow_up: "What is the name of {}, and why?".into(),
            }
        );
        // A clause of one word is no description.
        assert_eq!(
            decompose("who is the one that left", 4),
            Plan::Single("who is the one that left".into())
        );
        assert_eq!(
            decompose("When was Inception's director born?", 4),
            Plan::Bridge {
                first: "director of Inception".into(),
                follow_up: "When was {} born?".into(),
            }
        );
    }

    #[test]
    fn other_questions_add_their_names() {
        assert_eq!(
            decompose("what is my favourite colour", 4),
            Plan::Single("what is my favourite colour".into())
        );
        assert_eq!(
            decompose("What did Alice Chen say about Project Atlas?", 2),
            Plan::Parallel(vec![
                "What did Alice Chen say about Project Atlas?".into(),
                "Alice Chen".into(),
            ])
        );
        assert_eq!(
            decompose("What did Alice Chen say about Project Atlas?", 4)
                .sub_queries()
                .len(),
            3
        );
    }

    #[test]
    fn bridge_entity_is_a_new_name_from_the_hits() {
        let hit = "Inception is a 2010 film written and directed by Christopher Nolan.";
        let none: &[String] = &[];
        assert_eq!(
            bridge_entity(&[(hit, none)], "director of film Inception").as_deref(),
            Some("Christopher Nolan")
        );
        let stored = ["inception".to_string(), "Christopher Nolan".to_string()];
        assert_eq!(
            bridge_entity(&[(hit, &stored)], "director of film Inception").as_deref(),
            Some("Christopher Nolan")
        );
        assert_eq!(bridge_entity(&[("nothing named here", none)], "q"), None);
        assert_eq!(bridge_entity(&[], "q"), None);
    }

    #[test]
    fn a_name_with_the_head_noun_wins_from_a_lower_hit() {
        let none: &[String] = &[];
        let hits = [
            ("The billing system invoices Acme Corp.", none),
            ("Project Atlas migrates the billing system.", none),
        ];
        let asked = "project that migrates the billing system";
        assert_eq!(
            bridge_entity(&hits, asked).as_deref(),
            Some("Project Atlas")
        );
        // Without the head noun in any name, the best hit decides.
        assert_eq!(
            bridge_entity(&hits, "owner of the billing system").as_deref(),
            Some("Acme Corp")
        );
        // A surname is widened to the full name another hit gives.
        let hits = [
            ("Nolan's films use IMAX cameras.", none),
            ("Inception was directed by Christopher Nolan.", none),
        ];
        assert_eq!(
            bridge_entity(&hits, "director of film Inception").as_deref(),
            Some("Christopher Nolan")
        );
    }

    #[test]
    fn named_spans_skip_function_words() {
        assert_eq!(
            named_spans("The meeting with Alice Chen. She moved to Acme Corp's Berlin office."),
            vec!["Alice Chen", "Acme Corp", "Berlin"]
        );
    }

    #[test]
    fn case_changes_that_resize_characters_never_split_one() {
        // K = U+212A (3 bytes, lowercases to 1), İ = U+0130 (2 bytes,
        // lowercases to 3): the same total length, shifted offsets.
        let q = "\u{212A}\u{212A}\u{212A} aaaa\u{e9}both \u{130}\u{130}\u{130}\u{130}\u{130}\u{130} and Y";
        let plan = decompose(q, 4);
        assert!(!plan.sub_queries().is_empty());
        for max_parts in 1..=4 {
            decompose("\u{130}\u{130} or \u{212A}X vs Y both A and B", max_parts);
        }
        assert_eq!(find_word("\u{212A}\u{212A} BOTH x", "both "), Some(7));
        assert_eq!(find_word("\u{e9}", "and"), None);
        // Leading punctuation before a multi-byte relation word.
        decompose("Where was Bob's \"\u{e9}\" born?", 4);
        assert_eq!(after_trimmed("\"\u{e9}\"?", "\u{e9}"), "\"?");
    }

    proptest::proptest! {
        #[test]
        fn decomposition_never_panics(q in "\\PC{0,80}", n in 1usize..6) {
            let plan = decompose(&q, n);
            let _ = plan.sub_queries();
            let names: Vec<String> = named_spans(&q);
            let hits: Vec<(&str, &[String])> = vec![(q.as_str(), names.as_slice())];
            let _ = bridge_entity(&hits, &q);
        }
    }
}
