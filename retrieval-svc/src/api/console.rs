//! The memory console (issue 50 item 4): one page on the gateway's HTTP
//! port to browse a tenant's memories and see why an answer was chosen.
//! Plain HTML, CSS and JavaScript embedded in the binary (`console/`), no
//! front-end build step.
//!
//! The page holds no data and needs no key; everything it shows comes from
//! the REST routes (rest.rs) with the key the person types, so the console
//! sees exactly what that key may read through the API and nothing more.
//! The key lives in the page's memory only (gone on reload or close), and
//! every HTTP answer carries `Cache-Control: no-store` ([`no_store`]), so
//! no memory text outlives the browser session. The page's own answers
//! forbid inline scripts, framing and third-party requests.

use axum::Router;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// Where the console is served.
pub const CONSOLE_PATH: &str = "/console";
const SCRIPT_PATH: &str = "/console/console.js";
const STYLE_PATH: &str = "/console/console.css";

const PAGE: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// Scripts and styles from this origin only, requests to it only, never in
/// a frame: memory text drawn by the page cannot run or call out.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self'; form-action 'none'; frame-ancestors 'none'; \
    base-uri 'none'";

/// The console's three files.
pub fn router<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    router
        .route(CONSOLE_PATH, get(|| async { file(PAGE, "text/html") }))
        .route(
            SCRIPT_PATH,
            get(|| async { file(SCRIPT, "text/javascript") }),
        )
        .route(STYLE_PATH, get(|| async { file(STYLE, "text/css") }))
}

/// The route a console path belongs to, for span names.
pub fn route_name(path: &str) -> Option<&'static str> {
    [CONSOLE_PATH, SCRIPT_PATH, STYLE_PATH]
        .into_iter()
        .find(|p| *p == path)
}

fn file(body: &'static str, kind: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ];
    (headers, body).into_response()
}

/// Every HTTP answer: not to be stored by the browser or a proxy. API
/// answers hold memory text, which must not outlive the session in a
/// cache; the console's files are small and change with the binary.
pub async fn no_store(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        HeaderName::from_static("pragma"),
        HeaderValue::from_static("no-cache"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_files() {
        assert!(PAGE.contains(SCRIPT_PATH) && PAGE.contains(STYLE_PATH));
        // No inline script or handler: the policy would refuse them.
        assert!(!PAGE.contains("<script>") && !PAGE.contains("onclick="));
        // Memory text is drawn as text, never parsed as HTML.
        assert!(!SCRIPT.contains("innerHTML") && !SCRIPT.contains("outerHTML"));
        assert!(!SCRIPT.contains("localStorage") && !SCRIPT.contains("sessionStorage"));
    }
}
