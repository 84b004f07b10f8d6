//! The optional OpenAI-compatible chat endpoint (`[llm]` in settings). Every
//! caller treats it as a bonus: with no endpoint, or when a call fails or runs
//! out of time, the rule-based path answers instead. Prompts and answers hold
//! the caller's text, so neither is ever logged: errors carry only a kind.

use std::time::Duration;

use engram_common::settings::LlmSettings;
use serde::Deserialize;
use tokio::time::Instant;

use crate::metrics::{CallOutcome, Metrics};
use crate::query::{MAX_HYPOTHESES, MAX_TEXT_CHARS};

/// A reply body larger than this is not a chat completion worth parsing.
const MAX_BODY_BYTES: usize = 1 << 20;
/// Metrics label of the endpoint among the downstream stacks.
pub const STACK: &str = "llm";

const DECOMPOSE_SYSTEM: &str = "You split a question into simpler sub-questions for a search \
engine. Each sub-question must stand alone: name every entity explicitly, no pronouns. Together \
they must cover what the question needs. Reply with only a JSON array of strings.";

const SYNTHESIZE_SYSTEM: &str = "Answer the question using only the numbered sources. Cite the \
sources you use as [Source N] right after each claim. If the sources do not hold the answer, say \
so briefly. Be concise.";

const HYDE_SYSTEM: &str = "You write hypothetical memory entries for a retrieval system. Given \
the latest turns of a conversation, write short passages (one to three sentences each) that a \
memory store would hold if it knew the answer to what is being asked. State facts plainly, \
without hedging. Reply with only a JSON array of strings.";

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("llm call ran out of its time budget")]
    Timeout,
    #[error("llm endpoint answered http status {0}")]
    Status(u16),
    #[error("llm endpoint unreachable: {0}")]
    Transport(String),
    #[error("llm reply unusable: {0}")]
    Unusable(&'static str),
}

impl LlmError {
    /// A short label for step details and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Status(_) => "status",
            Self::Transport(_) => "transport",
            Self::Unusable(_) => "unusable",
        }
    }

    fn outcome(&self) -> CallOutcome {
        match self {
            Self::Timeout => CallOutcome::Timeout,
            Self::Status(_) | Self::Transport(_) | Self::Unusable(_) => CallOutcome::Error,
        }
    }
}

/// A parsed reply and the tokens the call cost (the endpoint's `usage`,
/// else an estimate of four characters a token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply<T> {
    pub value: T,
    pub tokens: u32,
}

/// A client for `POST {endpoint}/chat/completions`.
#[derive(Clone)]
pub struct LlmClient {
    settings: LlmSettings,
    url: String,
    bearer_opt: Option<String>,
    http: reqwest::Client,
}

/// By hand so the bearer key never reaches a log line.
impl std::fmt::Debug for LlmClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmClient")
            .field("url", &self.url)
            .field("model", &self.settings.model)
            .field("bearer", &self.bearer_opt.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl LlmClient {
    /// `None` when no endpoint is configured. An endpoint this build cannot
    /// reach (https: the HTTP client has no TLS) or a named key variable
    /// that is unset is an error, so start-up says why the LLM is off.
    pub fn from_settings(settings: &LlmSettings) -> anyhow::Result<Option<Self>> {
        let Some(endpoint) = settings
            .endpoint_opt
            .as_deref()
            .map(str::trim)
            .filter(|e| !e.is_empty())
        else {
            return Ok(None);
        };
        if !endpoint.starts_with("http://") {
            anyhow::bail!(
                "llm.endpoint_opt must be an http:// URL (this build has no TLS; put a local proxy in front of https endpoints)"
            );
        }
        let bearer_opt = match settings.api_key_env_opt.as_deref() {
            Some(var) if !var.is_empty() => match std::env::var(var) {
                Ok(k) if !k.is_empty() => Some(k),
                _ => anyhow::bail!("llm.api_key_env_opt names {var}, which is not set"),
            },
            _ => None,
        };
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(settings.timeout_ms.clamp(1, 5_000)))
            .build()?;
        Ok(Some(Self {
            settings: settings.clone(),
            url: format!("{}/chat/completions", endpoint.trim_end_matches('/')),
            bearer_opt,
            http,
        }))
    }

    pub fn settings(&self) -> &LlmSettings {
        &self.settings
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The configured per-call budget, capped by what the caller has left.
    pub fn budget(&self, left: Duration) -> Duration {
        Duration::from_millis(self.settings.timeout_ms).min(left)
    }

    /// HyDE's budget, capped by what the caller has left.
    pub fn hyde_budget(&self, left: Duration) -> Duration {
        Duration::from_millis(self.settings.hyde_timeout_ms).min(left)
    }

    /// Hypotheses per HyDE call, within what a `RetrieveRequest` accepts.
    pub fn hyde_count(&self) -> usize {
        self.settings.hyde_hypotheses.clamp(1, MAX_HYPOTHESES)
    }

    /// One chat completion at temperature 0 within `budget`.
    pub async fn chat(
        &self,
        system: &str,
        user: &str,
        max_tokens: u32,
        budget: Duration,
    ) -> Result<Reply<String>, LlmError> {
        let body = serde_json::json!({
            "model": self.settings.model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
            "temperature": 0.0,
            "max_tokens": max_tokens,
        });
        let mut req = self.http.post(&self.url).json(&body);
        if let Some(k) = &self.bearer_opt {
            req = req.bearer_auth(k);
        }
        let call = async {
            let mut resp = req
                .send()
                .await
                .map_err(|e| LlmError::Transport(transport_kind(&e)))?;
            let status = resp.status();
            if !status.is_success() {
                return Err(LlmError::Status(status.as_u16()));
            }
            let mut bytes = Vec::new();
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| LlmError::Transport(transport_kind(&e)))?
            {
                if bytes.len() + chunk.len() > MAX_BODY_BYTES {
                    return Err(LlmError::Unusable("reply body too large"));
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(bytes)
        };
        let bytes = tokio::time::timeout(budget, call)
            .await
            .map_err(|_| LlmError::Timeout)??;
        let (text, usage_opt) = parse_completion(&bytes)?;
        let tokens = usage_opt.unwrap_or_else(|| {
            estimate_tokens(system) + estimate_tokens(user) + estimate_tokens(&text)
        });
        Ok(Reply {
            value: text,
            tokens,
        })
    }

    /// Two to `max_parts` self-contained sub-questions; anything else is
    /// an error so the caller falls back to the rules.
    pub async fn decompose(
        &self,
        question: &str,
        max_parts: usize,
        budget: Duration,
    ) -> Result<Reply<Vec<String>>, LlmError> {
        let max_parts = max_parts.max(2);
        let user = format!(
            "Split this question into 2 to {max_parts} sub-questions.\n\nQuestion: {question}"
        );
        let r = self.chat(DECOMPOSE_SYSTEM, &user, 300, budget).await?;
        Ok(Reply {
            value: sub_questions(&r.value, question, max_parts)?,
            tokens: r.tokens,
        })
    }

    /// An answer grounded in `sources` (`[Source N]` entries), citing them.
    pub async fn synthesize(
        &self,
        question: &str,
        sources: &str,
        max_tokens: u32,
        budget: Duration,
    ) -> Result<Reply<String>, LlmError> {
        let user = format!("Sources:\n\n{sources}\nQuestion: {question}");
        let r = self
            .chat(SYNTHESIZE_SYSTEM, &user, max_tokens, budget)
            .await?;
        if r.value.trim().is_empty() {
            return Err(LlmError::Unusable("empty answer"));
        }
        Ok(Reply {
            value: r.value.trim().to_string(),
            tokens: r.tokens,
        })
    }

    /// HyDE: up to `n` short hypothetical passages answering the latest
    /// question of `conversation`.
    pub async fn hypotheses(
        &self,
        conversation: &str,
        n: usize,
        budget: Duration,
    ) -> Result<Reply<Vec<String>>, LlmError> {
        let n = n.clamp(1, MAX_HYPOTHESES);
        let user = format!("Write {n} passages.\n\nConversation:\n{conversation}");
        let r = self
            .chat(HYDE_SYSTEM, &user, 120 * n as u32, budget)
            .await?;
        Ok(Reply {
            value: hypothesis_list(&r.value, n)?,
            tokens: r.tokens,
        })
    }
}

/// Counts one call into the downstream metrics under the `llm` stack.
pub fn observe<T>(metrics: &Metrics, r: &Result<T, LlmError>, started: Instant) {
    let outcome = match r {
        Ok(_) => CallOutcome::Ok,
        Err(e) => e.outcome(),
    };
    metrics.stack(STACK).record(outcome, started.elapsed());
}

/// Connection-level failure kinds only: reqwest's messages carry the URL,
/// which is fine, but never the body.
fn transport_kind(e: &reqwest::Error) -> String {
    if e.is_connect() {
        "connect".into()
    } else if e.is_timeout() {
        "timeout".into()
    } else if e.is_body() || e.is_decode() {
        "body".into()
    } else {
        "request".into()
    }
}

pub fn estimate_tokens(s: &str) -> u32 {
    (s.chars().count() as u32).div_ceil(4)
}

#[derive(Deserialize)]
struct Completion {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    message: Option<Message>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize, Default)]
struct Usage {
    #[serde(default)]
    prompt_tokens: u32,
    #[serde(default)]
    completion_tokens: u32,
    #[serde(default)]
    total_tokens: u32,
}

/// The first choice's text without reasoning blocks, and the usage tokens
/// when the endpoint reported them.
fn parse_completion(body: &[u8]) -> Result<(String, Option<u32>), LlmError> {
    let c: Completion =
        serde_json::from_slice(body).map_err(|_| LlmError::Unusable("not a chat completion"))?;
    let text = c
        .choices
        .into_iter()
        .next()
        .and_then(|ch| ch.message)
        .and_then(|m| m.content)
        .ok_or(LlmError::Unusable("no message content"))?;
    let usage_opt = c.usage.and_then(|u| {
        let t = if u.total_tokens > 0 {
            u.total_tokens
        } else {
            u.prompt_tokens.saturating_add(u.completion_tokens)
        };
        (t > 0).then_some(t)
    });
    Ok((strip_reasoning(&text), usage_opt))
}

/// Drops `<think>…</think>` blocks some reasoning models put first.
fn strip_reasoning(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("<think>") {
        out.push_str(&rest[..open]);
        match rest[open..].find("</think>") {
            Some(close) => rest = &rest[open + close + "</think>".len()..],
            // An unclosed block is all reasoning.
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out.trim().to_string()
}

/// Items of a list reply: a JSON array of strings (possibly fenced, or
/// inside an object), else one item per line without bullets, numbers or
/// quotes, skipping lead-in lines that end with a colon.
pub fn parse_list(text: &str) -> Vec<String> {
    let text = strip_reasoning(text);
    if let Some(items) = json_list(&text) {
        return items;
    }
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("```"))
        .map(strip_marker)
        .filter(|l| !l.is_empty() && !l.ends_with(':') && !matches!(*l, "[" | "]" | "{" | "}"))
        .map(str::to_string)
        .collect()
}

fn json_list(text: &str) -> Option<Vec<String>> {
    let strings = |v: &[serde_json::Value]| -> Vec<String> {
        v.iter()
            .filter_map(serde_json::Value::as_str)
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    };
    let (open, close) = (text.find('[')?, text.rfind(']')?);
    if open < close
        && let Ok(v) = serde_json::from_str::<Vec<serde_json::Value>>(&text[open..=close])
    {
        let items = strings(&v);
        if !items.is_empty() {
            return Some(items);
        }
    }
    let (open, close) = (text.find('{')?, text.rfind('}')?);
    if open < close
        && let Ok(serde_json::Value::Object(m)) = serde_json::from_str(&text[open..=close])
    {
        return m
            .values()
            .filter_map(serde_json::Value::as_array)
            .map(|a| strings(a))
            .find(|items| !items.is_empty());
    }
    None
}

/// "1. x", "2) x", "- x", "* x", "• x", "Q1: x", "\"x\"," → "x".
fn strip_marker(line: &str) -> &str {
    let mut l = line.trim_start_matches(['-', '*', '•', '·']).trim_start();
    let lower = l.to_ascii_lowercase();
    for prefix in ["sub-question", "subquestion", "question", "q"] {
        if lower.starts_with(prefix) {
            let rest = &l[prefix.len()..];
            let digits = rest.trim_start_matches(|c: char| c.is_ascii_digit());
            if (digits.len() < rest.len() || prefix != "q")
                && let Some(after) = digits.trim_start().strip_prefix([':', '.', ')'])
            {
                l = after.trim_start();
                break;
            }
        }
    }
    let digits = l.trim_start_matches(|c: char| c.is_ascii_digit());
    if digits.len() < l.len()
        && let Some(after) = digits.strip_prefix(['.', ')', ':'])
    {
        l = after.trim_start();
    }
    l.trim_end_matches(',')
        .trim()
        .trim_matches(|c| c == '"' || c == '\'' || c == '`')
        .trim()
}

/// Distinct usable sub-questions, at most `max_parts`; fewer than two is
/// no decomposition at all.
pub fn sub_questions(
    text: &str,
    question: &str,
    max_parts: usize,
) -> Result<Vec<String>, LlmError> {
    let mut out: Vec<String> = Vec::new();
    let whole = question.trim().to_lowercase();
    for item in parse_list(text) {
        if item.chars().count() > MAX_TEXT_CHARS {
            continue;
        }
        let key = item.to_lowercase();
        if key == whole || out.iter().any(|o| o.to_lowercase() == key) {
            continue;
        }
        out.push(item);
    }
    out.truncate(max_parts);
    if out.len() < 2 {
        return Err(LlmError::Unusable("fewer than two sub-questions"));
    }
    Ok(out)
}

/// Up to `n` non-empty hypotheses, each within the request text limit.
pub fn hypothesis_list(text: &str, n: usize) -> Result<Vec<String>, LlmError> {
    let mut out: Vec<String> = Vec::new();
    for item in parse_list(text) {
        let item: String = item.chars().take(MAX_TEXT_CHARS).collect();
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out.truncate(n.min(MAX_HYPOTHESES));
    if out.is_empty() {
        return Err(LlmError::Unusable("no hypotheses"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(content: &str, usage: &str) -> Vec<u8> {
        format!(
            r#"{{"id":"x","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":{}}},"finish_reason":"stop"}}]{usage}}}"#,
            serde_json::Value::String(content.into())
        )
        .into_bytes()
    }

    #[test]
    fn completions_parse_with_and_without_usage() {
        let (t, u) = parse_completion(&completion(
            "hello",
            r#","usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}"#,
        ))
        .expect("valid");
        assert_eq!((t.as_str(), u), ("hello", Some(12)));
        let (_, u) = parse_completion(&completion(
            "hi",
            r#","usage":{"prompt_tokens":10,"completion_tokens":2}"#,
        ))
        .expect("valid");
        assert_eq!(u, Some(12));
        let (t, u) =
            parse_completion(&completion("<think>hmm</think>\n answer ", "")).expect("valid");
        assert_eq!((t.as_str(), u), ("answer", None));
    }

    #[test]
    fn garbage_is_unusable() {
        for body in [
            &b"<html>bad gateway</html>"[..],
            b"{}",
            br#"{"choices":[]}"#,
            br#"{"choices":[{"message":{"content":null}}]}"#,
            b"",
        ] {
            assert!(
                matches!(parse_completion(body), Err(LlmError::Unusable(_))),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn lists_parse_from_json_fences_objects_and_lines() {
        let want = vec![
            "When was Alan Turing born?",
            "When was John von Neumann born?",
        ];
        for text in [
            r#"["When was Alan Turing born?", "When was John von Neumann born?"]"#,
            "```json\n[\"When was Alan Turing born?\",\n \"When was John von Neumann born?\"]\n```",
            r#"{"sub_questions": ["When was Alan Turing born?", "When was John von Neumann born?"]}"#,
            "Here are the sub-questions:\n1. When was Alan Turing born?\n2) When was John von Neumann born?",
            "- \"When was Alan Turing born?\"\n* When was John von Neumann born?\n",
            "Q1: When was Alan Turing born?\nQ2: When was John von Neumann born?",
            "<think>two people</think>\nWhen was Alan Turing born?\nWhen was John von Neumann born?",
        ] {
            assert_eq!(parse_list(text), want, "{text}");
        }
    }

    #[test]
    fn sub_questions_need_two_distinct_parts() {
        let q = "Who was born first, Alan Turing or John von Neumann?";
        let ok = sub_questions(r#"["A?", "a?", "B?", "C?", "D?", "E?"]"#, q, 4).expect("ok");
        assert_eq!(ok, ["A?", "B?", "C?", "D?"]);
        assert_eq!(sub_questions("A?\nB?\nC?", q, 2).expect("ok"), ["A?", "B?"]);
        for bad in [
            "",
            "[]",
            "only one?",
            &format!("[\"{q}\", \"x?\"]"),
            "[1, 2]",
        ] {
            // The question itself is no sub-question.
            assert!(sub_questions(bad, q, 4).is_err(), "{bad}");
        }
        let long = "x".repeat(MAX_TEXT_CHARS + 1);
        assert!(sub_questions(&format!("{long}\nB?"), q, 4).is_err());
    }

    #[test]
    fn hypotheses_are_capped_and_bounded() {
        let h = hypothesis_list(r#"["Alice leads it.", "Alice leads it.", "Bob left."]"#, 1)
            .expect("ok");
        assert_eq!(h, ["Alice leads it."]);
        let long = "y".repeat(MAX_TEXT_CHARS + 10);
        let h = hypothesis_list(&long, 2).expect("ok");
        assert_eq!(h[0].chars().count(), MAX_TEXT_CHARS);
        assert!(hypothesis_list("  \n```\n", 2).is_err());
    }

    #[test]
    fn https_and_missing_keys_are_refused_and_keys_never_print() {
        let s = |e: &str, k: Option<&str>| LlmSettings {
            endpoint_opt: Some(e.into()),
            api_key_env_opt: k.map(Into::into),
            ..Default::default()
        };
        assert!(
            LlmClient::from_settings(&LlmSettings::default())
                .expect("ok")
                .is_none()
        );
        assert!(LlmClient::from_settings(&s("https://api.example.com/v1", None)).is_err());
        assert!(
            LlmClient::from_settings(&s("http://127.0.0.1:1/v1", Some("ENGRAM_NO_SUCH_VAR_X")))
                .is_err()
        );
        let c = LlmClient::from_settings(&s("http://127.0.0.1:1/v1/", None))
            .expect("ok")
            .expect("configured");
        assert_eq!(c.url, "http://127.0.0.1:1/v1/chat/completions");
        let with_key = LlmClient {
            bearer_opt: Some("sk-secret".into()),
            ..c
        };
        assert!(!format!("{with_key:?}").contains("sk-secret"));
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_a_transport_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        let c = LlmClient::from_settings(&LlmSettings {
            endpoint_opt: Some(format!("http://127.0.0.1:{port}/v1")),
            ..Default::default()
        })
        .expect("ok")
        .expect("configured");
        let r = c.chat("s", "u", 10, Duration::from_secs(2)).await;
        assert!(matches!(r, Err(LlmError::Transport(_))), "{r:?}");
    }
}
