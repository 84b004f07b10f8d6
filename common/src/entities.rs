//! Entity normalisation and the built-in (no-LLM) extractor. Shared by the
//! write path (search-svc) and query linking (graph-svc) so both sides agree
//! on what a name is. (Owned by the graph-svc work; see its docs.)

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
