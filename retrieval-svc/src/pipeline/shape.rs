//! The shape of an answer. Some questions say what their answer looks like
//! — a phone number, an e-mail or web address, a handle, an identifying
//! number or code, a street address, an amount of money, a percentage, an
//! age, a height or weight, a blood group, a clothes size, a date, a
//! birthday, a colour, a time zone — and a memory that answers them holds
//! something of that shape. "What does Jess do for a living?" has no such
//! shape (a job is any noun), but "What's Kai's phone number?"
//! does, and when none of the memories about Kai holds a number, the
//! tenant knows Kai but not his number: `nothing_relevant` (abstain.rs).
//!
//! The shapes are read off closed-class question forms ("how much", "how
//! old", "phone", "when is") and answered by closed classes (digits, month
//! and colour names, time-zone abbreviations), not fitted: a question form that could be
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
    /// A handle on a chat or social service: "@mira.k".
    Handle,
    /// An identifying number or code: a microchip, passport, policy or
    /// booking number; digits, or letters and digits together.
    Number,
    /// A street address: a house number before a street word.
    Address,
    /// A blood group: "O+", "AB negative".
    BloodType,
    /// A size of clothes or shoes: "size 8", "XL", "39 EU".
    Size,
    /// A birthday or an anniversary: a day of the year ("Sept 3", "3/9"),
    /// or the day a turn was said ("today").
    DayOfYear,
    /// A colour word.
    Colour,
    /// A time zone ("CET", "UTC+2", "Pacific time"), or the place it is
    /// read from ("in Gdansk").
    TimeZone,
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
        (Shape::Web, r"\b(url|website|web site|web address|homepage)\b"),
        // "How did her son handle the accident?" asks no handle.
        (Shape::Handle, r"\bhandle\s*($|[?.,!;])|\buser ?name\b"),
        (Shape::BloodType, r"\bblood (type|group)\b"),
        (Shape::TimeZone, r"\btime ?zone\b"),
        // "Why did she choose those colours?" asks a reason.
        (
            Shape::Colour,
            r"^\s*(what|which)\b[^?]*\bcolou?rs?\b|\bfavou?rite colou?rs?\b",
        ),
        // The day itself, not a party or a gift for it.
        (
            Shape::DayOfYear,
            r"^\s*when\b[^?]*\b(birthday|anniversary)\s*($|[?.,!;])|^\s*what('s|\s+is|\s+was)\s[^?]{0,40}\b(birthday|anniversary)\s*($|[?.,!;])|\bbirth ?date\b",
        ),
        (
            Shape::Size,
            r"\b(shoe|dress|shirt|t-shirt|jacket|coat|pants|jeans|ring|glove|hat|clothing|clothes) size\b|\bwhat size\b",
        ),
        // "The number of people" is a count, and "the dress code" is
        // answered in words: a number or a code that opens something.
        (
            Shape::Number,
            r"\bnumber\s*($|[?.,!;]|(for|on|is|was|to|in)\b)|\bserial\b|\bip address\b|\b(gate|door|zip|postal|post|access|alarm|lock|promo|discount|confirmation|booking|wifi|wi-fi|entry|garage|locker) code\b",
        ),
        (Shape::Address, r"\baddress\b"),
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
        (
            Shape::DayOfYear,
            format!(r"{calendar}|\b(today|tomorrow|yesterday|tonight)\b"),
        ),
        (
            Shape::Colour,
            r"\b(red|orange|yellow|green|blue|purple|violet|pink|brown|black|white|gr[ae]y|silver|gold|golden|beige|teal|turquoise|navy|maroon|lilac|lavender|magenta|cyan|crimson|scarlet|indigo|olive|cream|ivory|tan|burgundy|coral|mint|peach|aqua|khaki|charcoal|rainbow)\b"
                .to_string(),
        ),
        (
            Shape::TimeZone,
            r"\b(utc|gmt|cet|cest|eet|eest|wet|west|pst|pdt|est|edt|cst|cdt|mst|mdt|bst|ist|jst|kst|aest|aedt|nzst|hst|akst)\b|\b(pacific|eastern|central|mountain|atlantic|alaska|hawaii) (standard |daylight )?time\b|\btime ?zone\b|(?-i:\b(in|from|near|based in|lives in)\s+[A-Z][a-z]+)"
                .to_string(),
        ),
        (Shape::Date, date),
        (Shape::Handle, r"(^|[\s(:,])@[\w.-]{2,}".to_string()),
        (Shape::Number, r"\d{2,}|\b[a-z]*\d+[a-z]+\w*\b|\b[a-z]+\d+\w*\b".to_string()),
        (
            Shape::Address,
            r"\b(apt|apartment|unit|suite|flat)\s?#?\d+|\b\d{1,6}[a-z]?\s+(\w+\.?\s+){0,4}(st|street|ave|avenue|rd|road|blvd|boulevard|dr|drive|ln|lane|way|ct|court|pl|place|pkwy|parkway|ter|terrace|hwy|highway|sq|square|row)\b|\b(rue|via|calle|avenida|straße|strasse|weg|laan|gatan)\b|\bp\.?\s?o\.? box\b"
                .to_string(),
        ),
        (
            Shape::BloodType,
            r"\b(ab|a|b|o)[+-](\s|$|[.,;)])|\b(ab|a|b|o) (positive|negative|pos|neg)\b".to_string(),
        ),
        (
            Shape::Size,
            r"\bsize\b|\b(xxs|xs|xl|xxl|xxxl)\b|\b\d{1,2}(\.5)?\s?(us|uk|eu)\b".to_string(),
        ),
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
        assert_eq!(ASKS.len(), 17);
        assert_eq!(HOLDS.len(), 17);
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
            // A day of the year, or "today" in a chat turn.
            ("When is Tom's birthday?", Some(Shape::DayOfYear)),
            ("What's Kai's birth date?", Some(Shape::DayOfYear)),
            ("When is their wedding anniversary?", Some(Shape::DayOfYear)),
            ("When is Iris's birthday party?", Some(Shape::Date)),
            ("What's Iris's favorite color?", Some(Shape::Colour)),
            ("What colour is the new car?", Some(Shape::Colour)),
            (
                "Why did Melanie use colors and patterns in her pottery?",
                None,
            ),
            ("What time zone is Tomasz based in?", Some(Shape::TimeZone)),
            ("Whose birthday did Melanie celebrate recently?", None),
            ("How long ago was Caroline's 18th birthday?", None),
            ("What did Caroline do on her birthday?", None),
            (
                "What date does she leave for Mexico?",
                Some(Shape::Calendar),
            ),
            ("When is the standup?", Some(Shape::Date)),
            ("What's the deadline for the migration?", Some(Shape::Date)),
            // Forms answered in words expect no shape.
            ("When did Caroline go to the support group?", None),
            ("How many kids does she have?", None),
            ("What's Lena's blood type?", Some(Shape::BloodType)),
            ("What's Jonas Eriksen's Slack handle?", Some(Shape::Handle)),
            ("How did Melanie's son handle the accident?", None),
            ("What's her shoe size?", Some(Shape::Size)),
            ("What size shoes does Leo wear now?", Some(Shape::Size)),
            ("What's Biscuit's microchip number?", Some(Shape::Number)),
            ("What's the gate code at the cabin?", Some(Shape::Number)),
            (
                "What's Carmen's address in San Antonio?",
                Some(Shape::Address),
            ),
            (
                "What was her street address back in Portland?",
                Some(Shape::Address),
            ),
            // A count, and a code answered in words.
            ("What's the number of people on the team?", None),
            ("What's the dress code for the wedding?", None),
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
        assert!(holds(Shape::DayOfYear, "Ruben's birthday is Sept 3."));
        assert!(holds(Shape::DayOfYear, "It's my birthday today!"));
        let tulips = "Valentine's: Tom brought tulips. A cooking class next month.";
        assert!(!holds(Shape::DayOfYear, tulips));
        assert!(holds(Shape::Colour, "Drives a green 2017 Subaru Outback."));
        assert!(!holds(Shape::Colour, "Iris wants to be a narwhal."));
        assert!(holds(Shape::TimeZone, "Kai works CET hours."));
        assert!(holds(Shape::TimeZone, "Tomasz works remotely from Gdansk."));
        assert!(!holds(
            Shape::TimeZone,
            "Tomasz joined Maya's team as a backend dev."
        ));
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
        assert!(holds(Shape::Handle, "Jonas is @jonas.e on Slack"));
        assert!(!holds(Shape::Handle, "dana.w@brightlinefreight.com"));
        assert!(holds(Shape::Number, "Biscuit's chip: 985112004519873"));
        assert!(holds(Shape::Number, "Booking ref XK42B for the cabin"));
        assert!(holds(Shape::Number, "She's in room 12 this week."));
        assert!(!holds(Shape::Number, "Biscuit sees Dr. Lin at Hawthorne."));
        assert!(holds(
            Shape::Address,
            "rents at 2418 SE Division St, Portland"
        ));
        assert!(holds(Shape::Address, "Carmen: 77 Calle Ocho, apt 3"));
        assert!(!holds(Shape::Address, "Carmen lives in San Antonio."));
        assert!(holds(Shape::BloodType, "Blood type O+, on her donor card."));
        assert!(holds(Shape::BloodType, "She's AB negative."));
        assert!(!holds(Shape::BloodType, "Plan A - the early train."));
        assert!(holds(Shape::Size, "Wears a size 8 in boots."));
        assert!(holds(Shape::Size, "Shirt: XL, shoes 42 EU."));
        assert!(!holds(Shape::Size, "Lena's on an iPhone 15 now."));
        assert!(!holds(Shape::Measure, "turns 8 in May"));
    }
}
