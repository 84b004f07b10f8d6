//! Rules every boundary applies to caller text and times, so a value that
//! Postgres would refuse (a NUL byte, the year 300000) is rejected as the
//! caller's mistake with the field named, and never reaches the database as
//! a server error that counts against a downstream's health.

use prost_types::value::Kind;
use prost_types::{Struct, Timestamp};

/// The English month names, lowercase, January first: how the gateway
/// reads dates in questions (retrieval-svc pipeline/when.rs) and search-svc
/// the dates a fact states (values.rs).
pub const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// The English weekday names, lowercase, Monday first: search-svc's
/// weekday values (values.rs) and the dates a chain never follows
/// (retrieval-svc pipeline/chain.rs).
pub const WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// The rule [`check_text`] enforces, as it is reported.
pub const TEXT_RULE: &str =
    "must not contain control characters (tab, newline and carriage return are allowed)";
/// The rule [`check_timestamp`] enforces, as it is reported.
pub const TIMESTAMP_RULE: &str = "must be between 0001-01-01 and 9999-12-31 (UTC)";

/// 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z in Unix seconds: well inside
/// both Postgres' and chrono's ranges.
const MIN_SECONDS: i64 = -62_135_596_800;
const MAX_SECONDS: i64 = 253_402_300_799;

/// No control character but tab, newline and carriage return (NUL is what
/// Postgres refuses; the rest has no place in memory text either).
pub fn check_text(s: &str) -> Result<(), &'static str> {
    match s
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
    {
        true => Err(TEXT_RULE),
        false => Ok(()),
    }
}

/// The longest namespace, in characters: what search-svc stores on a write,
/// and so the most any read, listing or filter may name.
pub const MAX_NAMESPACE_CHARS: usize = 128;

/// [`check_text`], and at most `max_chars` characters: the rule for short
/// fields (names, ids, captions), the same words in every service.
pub fn check_short_text(s: &str, max_chars: usize) -> Result<(), String> {
    check_text(s).map_err(str::to_string)?;
    match s.chars().count() > max_chars {
        true => Err(format!("must be at most {max_chars} characters")),
        false => Ok(()),
    }
}

/// A label (memory type): what search-svc stores, so a filter on anything
/// else could never match and is the caller's mistake.
pub fn check_label(s: &str) -> Result<(), &'static str> {
    let ok = !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    match ok {
        true => Ok(()),
        false => Err(LABEL_RULE),
    }
}

pub const LABEL_RULE: &str = "must match [a-z0-9_]{1,32}";

pub fn check_timestamp(ts: &Timestamp) -> Result<(), &'static str> {
    let in_range =
        (MIN_SECONDS..=MAX_SECONDS).contains(&ts.seconds) && (0..1_000_000_000).contains(&ts.nanos);
    match in_range {
        true => Ok(()),
        false => Err(TIMESTAMP_RULE),
    }
}

/// How deep a caller's struct (a metadata filter, Foundry `filters`) may
/// nest objects and lists, the struct itself being the first level. Deeper
/// ones are refused at the boundary: every later step (text checks, JSON
/// conversion, the SQL containment test) walks them recursively.
pub const MAX_NESTING: usize = 8;
/// The rule [`check_struct_depth`] and [`json_within_depth`] enforce, as it
/// is reported.
pub const NESTING_RULE: &str = "must nest objects and lists at most 8 levels deep";

/// A struct nested at most [`MAX_NESTING`] levels, or [`NESTING_RULE`].
/// Never recurses deeper than that, however deep the input.
pub fn check_struct_depth(s: &Struct) -> Result<(), &'static str> {
    if struct_within(s, MAX_NESTING) {
        Ok(())
    } else {
        Err(NESTING_RULE)
    }
}

fn struct_within(s: &Struct, levels: usize) -> bool {
    levels > 0 && (s.fields.values()).all(|v| kind_within(v.kind.as_ref(), levels - 1))
}

fn kind_within(kind_opt: Option<&Kind>, levels: usize) -> bool {
    match kind_opt {
        Some(Kind::StructValue(s)) => struct_within(s, levels),
        Some(Kind::ListValue(l)) => {
            levels > 0 && (l.values.iter()).all(|v| kind_within(v.kind.as_ref(), levels - 1))
        }
        _ => true,
    }
}

/// [`check_struct_depth`] for JSON, before it is converted: objects and
/// arrays nested at most `levels` deep.
pub fn json_within_depth(v: &serde_json::Value, levels: usize) -> bool {
    match v {
        serde_json::Value::Object(m) => {
            levels > 0 && m.values().all(|v| json_within_depth(v, levels - 1))
        }
        serde_json::Value::Array(a) => {
            levels > 0 && a.iter().all(|v| json_within_depth(v, levels - 1))
        }
        _ => true,
    }
}

/// [`check_text`] for every key and string value of a metadata struct,
/// nested ones included.
pub fn check_struct_text(s: &Struct) -> Result<(), &'static str> {
    for (key, value) in &s.fields {
        check_text(key)?;
        check_kind_text(value.kind.as_ref())?;
    }
    Ok(())
}

fn check_kind_text(kind_opt: Option<&Kind>) -> Result<(), &'static str> {
    match kind_opt {
        Some(Kind::StringValue(s)) => check_text(s),
        Some(Kind::StructValue(s)) => check_struct_text(s),
        Some(Kind::ListValue(l)) => l
            .values
            .iter()
            .try_for_each(|v| check_kind_text(v.kind.as_ref())),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use prost_types::{ListValue, Value};

    use super::*;

    #[test]
    fn control_characters_are_refused_but_whitespace_is_not() {
        assert!(check_text("a\tb\nc\r\nd é ✓ \u{301}").is_ok());
        assert!(check_text("a\0b").is_err());
        assert!(check_text("\u{1b}[31m").is_err());
        assert!(check_text("\u{85}").is_err());
    }

    #[test]
    fn short_text_counts_characters_not_bytes() {
        assert!(check_short_text("ééé", 3).is_ok());
        assert_eq!(
            check_short_text("éééé", 3),
            Err("must be at most 3 characters".to_string())
        );
        assert_eq!(check_short_text("a\0", 9), Err(TEXT_RULE.to_string()));
    }

    #[test]
    fn timestamps_stay_within_four_digit_years() {
        assert!(
            check_timestamp(&Timestamp {
                seconds: 0,
                nanos: 0
            })
            .is_ok()
        );
        assert!(
            check_timestamp(&Timestamp {
                seconds: MAX_SECONDS,
                nanos: 999_999_999
            })
            .is_ok()
        );
        assert!(
            check_timestamp(&Timestamp {
                seconds: -1_000_000_000_000,
                nanos: 0
            })
            .is_err()
        );
        assert!(
            check_timestamp(&Timestamp {
                seconds: MAX_SECONDS + 1,
                nanos: 0
            })
            .is_err()
        );
        assert!(
            check_timestamp(&Timestamp {
                seconds: 0,
                nanos: -1
            })
            .is_err()
        );
    }

    /// `levels` levels, objects at odd ones (the outermost is the first)
    /// and lists at even ones: `{"k": [{"k": [... {"leaf": "x"}]}]}`.
    fn nested_json(levels: usize) -> serde_json::Value {
        (1..levels).fold(serde_json::json!({"leaf": "x"}), |inner, i| {
            if (levels - i) % 2 == 1 {
                serde_json::json!({ "k": inner })
            } else {
                serde_json::json!([inner])
            }
        })
    }

    #[test]
    fn nesting_is_bounded_for_structs_and_json() {
        assert!(NESTING_RULE.contains(&MAX_NESTING.to_string()));
        for (levels, fine) in [(1, true), (8, true), (9, false), (40, false)] {
            let json = nested_json(levels);
            assert!(json.is_object());
            assert_eq!(json_within_depth(&json, MAX_NESTING), fine, "{levels}");
            let r = check_struct_depth(&crate::convert::json_to_struct(&json));
            assert_eq!(r.is_ok(), fine, "{levels}: {r:?}");
        }
    }

    #[test]
    fn metadata_is_checked_all_the_way_down() {
        let nested = |s: &str| Struct {
            fields: [(
                "k".to_string(),
                Value {
                    kind: Some(Kind::ListValue(ListValue {
                        values: vec![Value {
                            kind: Some(Kind::StringValue(s.into())),
                        }],
                    })),
                },
            )]
            .into(),
        };
        assert!(check_struct_text(&nested("fine")).is_ok());
        assert!(check_struct_text(&nested("no\0")).is_err());
    }
}
