//! Query text scrubbing for logs: agents paste e-mail addresses, phone
//! numbers, account numbers and API keys into their questions, and none of
//! that may reach a log pipeline. Each match becomes a typed placeholder so a
//! scrubbed line still reads ("ask [email] about [digits]").

use std::sync::LazyLock;

use regex::Regex;

/// Order matters: keys before digits (a key may hold digit runs), e-mails
/// before long tokens and phones (an address may hold either).
static RULES: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    [
        // Bearer tokens, sk-/ghp_/engram_dev_ style keys, JWTs and long
        // mixed alphanumeric runs (hex digests, base64 secrets).
        (r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]+", "[key]"),
        (
            r"\beyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*",
            "[key]",
        ),
        (
            r"\b(?:sk|pk|rk|ghp|gho|ghs|xox[abps]|AKIA|engram_dev)[-_]?[A-Za-z0-9_-]{8,}",
            "[key]",
        ),
        (r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}", "[email]"),
        // Tokens of 20+ characters mixing letters and digits are secrets.
        (r"[A-Za-z0-9_+/=-]{20,}", "@mixed"),
        (
            r"\+?\(?\d{1,4}\)?[\s.-]?\(?\d{2,4}\)?[\s.-]\d{3,4}[\s.-]?\d{3,4}\b",
            "[phone]",
        ),
        (r"\d{6,}", "[digits]"),
    ]
    .into_iter()
    .filter_map(|(pattern, label)| match Regex::new(pattern) {
        Ok(re) => Some((re, label)),
        // A bad pattern is a build bug caught by the tests below; skipping it
        // keeps logging alive rather than panicking in the request path.
        Err(e) => {
            tracing::error!(error = %e, "scrub pattern does not compile");
            None
        }
    })
    .collect()
});

/// `text` with e-mails, phone numbers, digit runs of six or more and
/// key-like tokens replaced by placeholders.
pub fn scrub(text: &str) -> String {
    let mut out = text.to_string();
    for (re, label) in RULES.iter() {
        if *label == "@mixed" {
            out = re
                .replace_all(&out, |c: &regex::Captures<'_>| {
                    let tok = &c[0];
                    let digits = tok.bytes().any(|b| b.is_ascii_digit());
                    let letters = tok.bytes().any(|b| b.is_ascii_alphabetic());
                    if digits && letters {
                        "[key]".to_string()
                    } else {
                        tok.to_string()
                    }
                })
                .into_owned();
        } else {
            out = re.replace_all(&out, *label).into_owned();
        }
    }
    out
}

/// What a log line may carry for the query: the scrubbed text, or nothing
/// when `settings.log.query_text` is off.
pub fn query_for_log(text: &str, enabled: bool) -> Option<String> {
    enabled.then(|| scrub(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pattern_compiles() {
        assert_eq!(RULES.len(), 7);
    }

    #[test]
    fn emails_phones_digits_and_keys_are_replaced() {
        let s = scrub(
            "mail alice.chen@example.com or call +1 (415) 555-0132 about account 12345678 with key sk-abcdef1234567890XYZ",
        );
        assert!(!s.contains("alice"), "{s}");
        assert!(!s.contains("555"), "{s}");
        assert!(!s.contains("12345678"), "{s}");
        assert!(!s.contains("abcdef"), "{s}");
        assert!(s.contains("[email]") && s.contains("[phone]"), "{s}");
        assert!(s.contains("[digits]") && s.contains("[key]"), "{s}");
        assert!(s.starts_with("mail "), "{s}");
    }

    #[test]
    fn tokens_and_digests_are_keys() {
        let s =
            scrub("Authorization: Bearer abc.def.ghi and 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b");
        assert!(!s.contains("abc.def"), "{s}");
        assert!(!s.contains("9f86d08"), "{s}");
        let jwt = scrub("token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig_part");
        assert_eq!(jwt, "token [key]");
    }

    #[test]
    fn ordinary_questions_pass_through() {
        let q = "Who leads the project that migrates the billing system in Q3 2024?";
        assert_eq!(scrub(q), q);
        assert_eq!(query_for_log(q, false), None);
        assert_eq!(query_for_log(q, true).as_deref(), Some(q));
    }
}
