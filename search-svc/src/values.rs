//! What kind of value a short fact states: a clock time, a weekday, a date,
//! a duration, an amount of money, a bare number or a name. Update
//! detection (updates.rs) compares the kinds of the values two facts do not
//! share: "the 1:1 moved to Tuesdays" against "the 1:1 is at 10:15" changes
//! a day where the old fact gave a time, so the two fill different slots of
//! the same subject and neither replaces the other. Plain English
//! structure, no lexicon of any domain.

use std::collections::BTreeSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Time,
    Weekday,
    Date,
    Duration,
    Money,
    Number,
    Name,
}

impl Kind {
    fn numeric(self) -> bool {
        matches!(
            self,
            Kind::Time | Kind::Date | Kind::Duration | Kind::Money | Kind::Number
        )
    }

    /// Whether a value of one kind could replace a value of the other: the
    /// same kind, or a bare number beside any numeric kind ("1,200" may be
    /// the euros "1,100 euros" was).
    fn compatible(self, other: Kind) -> bool {
        self == other
            || (self == Kind::Number && other.numeric())
            || (other == Kind::Number && self.numeric())
    }
}

/// Words for days of the week beside [`engram_common::text::WEEKDAYS`].
const WEEK_PARTS: &[&str] = &["weekend", "weekday"];
const DAY_PARTS: &[&str] = &[
    "morning",
    "afternoon",
    "evening",
    "night",
    "noon",
    "midnight",
    "lunchtime",
];
const UNITS: &[&str] = &[
    "second", "minute", "min", "hour", "hr", "day", "week", "month", "year",
];
const CURRENCIES: &[&str] = &["euro", "dollar", "usd", "eur", "gbp", "pound", "chf", "yen"];
const CURRENCY_SIGNS: &[char] = &['$', '€', '£', '¥'];

/// The word without a plural "s" ("tuesdays", "minutes", "euros").
fn singular(w: &str) -> &str {
    w.strip_suffix('s').filter(|s| s.len() >= 2).unwrap_or(w)
}

fn in_list(list: &[&str], w: &str) -> bool {
    list.contains(&w) || list.contains(&singular(w))
}

fn is_number(w: &str) -> bool {
    w.chars().next().is_some_and(|c| c.is_ascii_digit())
        && w.chars()
            .all(|c| c.is_ascii_digit() || c == '.' || c == ',')
}

fn is_clock(w: &str) -> bool {
    let (h, m) = match w.split_once(':') {
        Some(hm) => hm,
        None => (w.trim_end_matches("am").trim_end_matches("pm"), "00"),
    };
    let clock_suffix = w.contains(':') || w.ends_with("am") || w.ends_with("pm");
    clock_suffix
        && !h.is_empty()
        && h.chars().all(|c| c.is_ascii_digit())
        && m.chars().all(|c| c.is_ascii_digit())
}

/// One value of `words` at `i` (lowercased, punctuation trimmed), with the
/// words it spans.
fn value_at(words: &[(String, bool)], i: usize) -> Option<(Kind, String, usize)> {
    let (w, capital) = (&words[i].0, words[i].1);
    let next = words.get(i + 1).map(|(n, _)| n.as_str()).unwrap_or("");
    let whole = |k: Kind| Some((k, singular(w).to_string(), 1));
    if is_clock(w) || in_list(DAY_PARTS, w) {
        return whole(Kind::Time);
    }
    if in_list(&engram_common::text::WEEKDAYS, w) || in_list(WEEK_PARTS, w) {
        return whole(Kind::Weekday);
    }
    if engram_common::text::MONTHS.contains(&w.as_str()) && (capital || is_number(next)) {
        return whole(Kind::Date);
    }
    if let Some(amount) = w.strip_prefix(CURRENCY_SIGNS).filter(|a| is_number(a)) {
        return Some((Kind::Money, amount.to_string(), 1));
    }
    if !is_number(w) {
        return (capital && w.len() > 1).then(|| (Kind::Name, w.clone(), 1));
    }
    if next == "am" || next == "pm" {
        return Some((Kind::Time, format!("{w}{next}"), 2));
    }
    if in_list(UNITS, next) {
        return Some((Kind::Duration, format!("{w} {}", singular(next)), 2));
    }
    if in_list(CURRENCIES, next) {
        return Some((Kind::Money, w.clone(), 2));
    }
    let year = w.len() == 4 && (w.starts_with("19") || w.starts_with("20"));
    Some((if year { Kind::Date } else { Kind::Number }, w.clone(), 1))
}

/// The values a text states, as (kind, value). A capitalised first word is
/// not a name unless it is one elsewhere in the sentence's terms (`names`
/// decides that; here it is left out), so "The", "Starting" are not.
pub fn values(text: &str, is_name: impl Fn(&str) -> bool) -> BTreeSet<(Kind, String)> {
    let words: Vec<(String, bool)> = (text.split_whitespace())
        .map(|raw| {
            let w =
                raw.trim_matches(|c: char| !(c.is_alphanumeric() || CURRENCY_SIGNS.contains(&c)));
            let w = w.trim_end_matches("'s").trim_end_matches('’');
            (w.to_lowercase(), is_name(w))
        })
        .filter(|(w, _)| !w.is_empty())
        .collect();
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < words.len() {
        match value_at(&words, i) {
            Some((kind, value, span)) => {
                out.insert((kind, value));
                i += span;
            }
            None => i += 1,
        }
    }
    out
}

/// Whether the values only one side states are of kinds that cannot
/// replace each other: each side changed something, and no value the old
/// text loses is of a kind compatible with one the new text gains.
pub fn kinds_differ(old: &BTreeSet<(Kind, String)>, new: &BTreeSet<(Kind, String)>) -> bool {
    let lost: Vec<Kind> = old.difference(new).map(|(k, _)| *k).collect();
    let gained: Vec<Kind> = new.difference(old).map(|(k, _)| *k).collect();
    !lost.is_empty()
        && !gained.is_empty()
        && !lost.iter().any(|a| gained.iter().any(|b| a.compatible(*b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(w: &str) -> bool {
        w.chars().next().is_some_and(char::is_uppercase) && w != "The"
    }

    fn differ(old: &str, new: &str) -> bool {
        kinds_differ(&values(old, caps), &values(new, caps))
    }

    #[test]
    fn values_are_read_with_their_kind() {
        let v = values(
            "The 1:1 is at 10:15 on Tuesdays for 30 minutes, 40 euros, $12",
            caps,
        );
        let kinds: Vec<Kind> = v.iter().map(|(k, _)| *k).collect();
        for k in [Kind::Time, Kind::Weekday, Kind::Duration, Kind::Money] {
            assert!(kinds.contains(&k), "{k:?} in {v:?}");
        }
        let v = values("The launch is planned for July 8, 2025 with Samuel", caps);
        assert!(v.contains(&(Kind::Date, "july".into())), "{v:?}");
        assert!(v.contains(&(Kind::Date, "2025".into())), "{v:?}");
        assert!(v.contains(&(Kind::Name, "samuel".into())), "{v:?}");
        assert!(values("we may join in may", caps).is_empty());
    }

    #[test]
    fn another_slot_of_the_same_subject_has_another_kind() {
        assert!(differ(
            "The 1:1 with Marco is at 10:15.",
            "The 1:1 with Marco switched to Tuesdays."
        ));
        assert!(differ(
            "The sprint planning is at 11:00.",
            "The sprint planning now lasts 90 minutes."
        ));
        assert!(differ(
            "The Juniper launch is planned for July 8.",
            "Project Juniper is now owned by Samuel."
        ));
    }

    #[test]
    fn a_new_value_of_the_same_slot_has_the_same_kind() {
        assert!(!differ(
            "The team standup is at 9:30 every morning.",
            "The standup moved to 10:00."
        ));
        assert!(!differ(
            "Code reviews happen in the mornings.",
            "Code reviews are now at 15:00."
        ));
        assert!(!differ(
            "Priya lives in Berlin.",
            "Priya moved to Amsterdam."
        ));
        assert!(!differ(
            "Rent is 1,100 euros a month.",
            "Rent is now 1,200."
        ));
        assert!(!differ("The gym costs $40.", "The gym now costs 45 euros."));
        // Nothing to compare: one side states no value of its own.
        assert!(!differ("Priya likes tea.", "Priya likes tea and cake."));
    }

    proptest::proptest! {
        /// Any text a tenant writes is read without a panic: multi-byte
        /// characters, currency signs, lone colons and apostrophes.
        #[test]
        fn any_text_is_read(old in "\\PC{0,80}", new in "[0-9:$€£¥'’sS aAmpP.,]{0,40}") {
            let (a, b) = (values(&old, caps), values(&new, caps));
            let _ = kinds_differ(&a, &b);
            let _ = kinds_differ(&b, &a);
        }
    }
}
