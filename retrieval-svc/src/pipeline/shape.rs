//! The shape of an answer. Some questions say what their answer looks like
//! — a phone number, an e-mail or web address, an amount of money, a
//! percentage, an age, a height or weight, a date — and a memory that
//! answers them holds something of that shape. "What's Lena's blood
//! type?" has no such shape, but "What's Kai's phone number?" does, and
//! when none of the memories about Kai holds a number, the tenant knows
//! Kai but not his number: `nothing_relevant` (abstain.rs).
//!
//! The shapes are read off closed-class question forms ("how much", "how
//! old", "phone", "when is"), not fitted: a question form that could be
//! answered in words ("how many kids" → "Iris and Leo", "when did she …" →
//! the memory's own event time) expects no shape. Pure, with unit tests.

use std::sync::LazyLock;

use regex::Regex;

/// What an answer looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Phone,
    Email,
    Web,
    Money,
    Percent,
    Age,
    Measure,
    /// A day of the calendar: "what date", "date of birth".
    Calendar,
    /// Any time: a day, a weekday, an hour, "next month".
    Date,
}

/// A case-insensitive pattern, compiled once. The patterns are constants
/// of this file; a unit test checks that every one compiles.
fn pattern(source: &str) -> Option<Regex> {
    Regex::new(&format!("(?i){source}")).ok()
}

/// Question forms, most specific first ("how much does Pepper weigh" asks a
/// weight, not a price).
static ASKS: LazyLock<Vec<(Shape, Regex)>> = LazyLock::new(|| {
    [
        (Shape::Phone, r"\b(phone|cell|mobile)\b"),
        (Shape::Email, r"\be-?mail\b"),
        (Shape::Web, r"\b(url|website|web site|homepage)\b"),
        (
            Shape::Measure,
            r"\bhow (tall|heavy|short)\b|\bweigh|\bheight\b",
        ),
        (Shape::Percent, r"\bpercent(age)?\b"),
        (Shape::Age, r"\bhow old\b|\bwhat age\b"),
        (
            Shape::Money,
            r"\bhow much (does|do|did|is|was|will|would)\b|\b(price|budget|fee|fees|salary)\b",
        ),
        (Shape::Calendar, r"\b(what|which) date\b|\bdate of birth\b"),
        (
            Shape::Date,
            r"^\s*when (is|are|will|'s)\b|\bdeadline\b|\bdue date\b",
        ),
    ]
    .into_iter()
    .filter_map(|(s, p)| Some((s, pattern(p)?)))
    .collect()
});

const MONTHS: &str = "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec|january|february|march|april|may|june|july|august|september|october|november|december";
const DAYS: &str = "mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun|monday|tuesday|wednesday|thursday|friday|saturday|sunday";

/// What each shape looks like in a memory.
static HOLDS: LazyLock<Vec<(Shape, Regex)>> = LazyLock::new(|| {
    let calendar = format!(
        r"\b({MONTHS})\b|\b\d{{1,2}}[/.-]\d{{1,2}}\b|\b(19|20)\d\d\b|\b\d{{1,2}}(st|nd|rd|th)\b"
    );
    let date = format!(
        r"{calendar}|\b({DAYS})s?\b|\b\d{{1,2}}(:\d\d)?\s?(am|pm)\b|\b\d{{1,2}}:\d\d\b|\b(today|tomorrow|tonight|yesterday|soon|noon|midnight|weekly|daily|monthly|yearly|annually|weekend|weekends)\b|\b(next|last|this|every|each) (week|month|year|spring|summer|fall|autumn|winter|morning|evening|night)\b|\bin \d+ (days|weeks|months|years)\b|\b(spring|summer|autumn|winter|christmas|thanksgiving|easter|halloween|holidays?)\b"
    );
    [
        (Shape::Phone, r"\+?\d[\d\s().-]{5,}\d|\bending (in )?\d{3,}".to_string()),
        (Shape::Email, r"[\w.+-]+@[\w-]+\.\w+".to_string()),
        (
            Shape::Web,
            r"https?://|\bwww\.|\b[\w-]+\.(com|org|net|io|dev|app|co|me|site|art|photo|photography)\b"
                .to_string(),
        ),
        (
            Shape::Measure,
            r#"\d+(\.\d+)?\s?(cm|mm|m|km|ft|feet|foot|inch|inches|kg|kgs|g|lb|lbs|pounds?|kilos?|stone|oz|ounces?)\b|\d+\s?('|")"#
                .to_string(),
        ),
        (Shape::Percent, r"\d\s?(%|percent|pct\b)".to_string()),
        (
            Shape::Age,
            r"\d+[- ]?(years?|yrs?|months?|weeks?)[- ]?old\b|\b(age|aged|turns?|turned|is) \d+\b|\bborn\b|\b(19|20)\d\d\b"
                .to_string(),
        ),
        (
            Shape::Money,
            r"[$€£¥]\s?\d|\d\s?(usd|eur|gbp|dollars?|bucks|euros?|k)\b|\bfree\b".to_string(),
        ),
        (Shape::Calendar, calendar.clone()),
        (Shape::Date, date),
    ]
    .into_iter()
    .filter_map(|(s, p)| Some((s, pattern(&p)?)))
    .collect()
});

/// The shape `question` asks for, if its form says one.
pub fn expected(question: &str) -> Option<Shape> {
    ASKS.iter()
        .find(|(_, p)| p.is_match(question))
        .map(|(s, _)| *s)
}

/// Whether `text` holds something of `shape`.
pub fn holds(shape: Shape, text: &str) -> bool {
    (HOLDS.iter()).any(|(s, p)| *s == shape && p.is_match(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pattern_compiles() {
        assert_eq!(ASKS.len(), 9);
        assert_eq!(HOLDS.len(), 9);
    }

    #[test]
    fn question_forms_say_their_shape() {
        let cases = [
            ("What's Kai's phone number?", Some(Shape::Phone)),
            ("What's Anita Shah's email address?", Some(Shape::Email)),
            ("What's the URL of her portfolio website?", Some(Shape::Web)),
            ("How much does Pepper weigh?", Some(Shape::Measure)),
            ("How much does the plan cost?", Some(Shape::Money)),
            ("What's the budget for the offsite?", Some(Shape::Money)),
            ("How old is Pepper?", Some(Shape::Age)),
            // "today" answers it in a chat turn.
            ("When is Tom's birthday?", Some(Shape::Date)),
            ("Whose birthday did Melanie celebrate recently?", None),
            ("How long ago was Caroline's 18th birthday?", None),
            (
                "What date does she leave for Mexico?",
                Some(Shape::Calendar),
            ),
            ("When is the standup?", Some(Shape::Date)),
            ("What's the deadline for the migration?", Some(Shape::Date)),
            // Forms answered in words expect no shape.
            ("When did Caroline go to the support group?", None),
            ("How many kids does she have?", None),
            ("What's Lena's blood type?", None),
            ("What's the per-key request limit?", None),
        ];
        for (q, want) in cases {
            assert_eq!(expected(q), want, "{q}");
        }
    }

    #[test]
    fn memories_hold_shapes() {
        assert!(holds(Shape::Phone, "Text him, (312) 555-0147."));
        assert!(holds(Shape::Phone, "Google Pixel 7, number ending 0193."));
        assert!(!holds(Shape::Phone, "Kai is out Mar 17-21 on vacation."));
        assert!(holds(Shape::Email, "dana.w@brightlinefreight.com"));
        assert!(holds(Shape::Money, "Grocery budget is $600/month"));
        assert!(!holds(
            Shape::Money,
            "Northpass renewed Heron for another year."
        ));
        assert!(holds(Shape::Age, "Biscuit is a 5-year-old beagle mix"));
        assert!(holds(Shape::Age, "Older kid is Iris, turns 8 in May"));
        assert!(!holds(
            Shape::Age,
            "Pepper is their dog, a border collie mix."
        ));
        assert!(holds(Shape::Date, "Kestrel launch target: March 28."));
        assert!(holds(
            Shape::Date,
            "Check-ins happen Thursday afternoons at 2"
        ));
        assert!(holds(Shape::Date, "going to a conference this month"));
        // A date is a day of the calendar, not "next month".
        assert!(!holds(
            Shape::Calendar,
            "Tom wants a cooking class next month."
        ));
        assert!(holds(
            Shape::Calendar,
            "Flights are Oct 9 out, Oct 14 back."
        ));
        // "Mar" in "Marsh" and "May" in "Maya" are no dates.
        assert!(!holds(
            Shape::Date,
            "Husband: Tom Marsh, teaches chemistry."
        ));
        assert!(!holds(
            Shape::Date,
            "Maya co-owns Lantern with the data team."
        ));
        assert!(holds(Shape::Measure, "Leo is 104 cm tall"));
        assert!(!holds(Shape::Measure, "turns 8 in May"));
    }
}
