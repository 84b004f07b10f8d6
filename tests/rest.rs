//! Issue 50 item 2 on the real stack: REST/JSON for the public RPCs on the
//! gateway's HTTP port, through the gRPC handlers themselves (the same
//! keys, checks and answers), and the OpenAPI document it serves.

use engram_tests::TestStack;
use serde_json::{Value, json};

struct Rest {
    base: String,
    key: String,
    http: reqwest::Client,
}

impl Rest {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = (self.http)
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("send");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remember_search_get_and_forget_over_rest() -> anyhow::Result<()> {
    let ts = TestStack::start("internal").await?;
    let http = ts
        .stack
        .http_addr_opt
        .ok_or_else(|| anyhow::anyhow!("no http"))?;
    let rest = Rest {
        base: format!("http://{http}"),
        key: ts.key.clone(),
        http: reqwest::Client::new(),
    };
    let id = uuid::Uuid::new_v4().to_string();
    let (code, written) = rest
        .post(
            "/v1/memories",
            json!({"memories": [{
                "id": id,
                "content": "Mira's favourite tea is a smoky lapsang souchong.",
                "memory_type": "semantic",
                "event_time": "2026-03-01T09:00:00Z",
            }]}),
        )
        .await;
    assert_eq!(code, 200, "{written}");
    assert_eq!(written["results"][0]["id"], json!(id));
    assert_eq!(written["results"][0]["created"], json!(true));

    let (code, answer) = rest
        .post(
            "/v1/retrieve",
            json!({"text": "Which tea does Mira like?", "limit": 3}),
        )
        .await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["records"][0]["memory"]["id"], json!(id), "{answer}");
    assert_eq!(
        answer["nothing_relevant"],
        json!(false),
        "defaults are written"
    );

    let (code, one) = rest
        .send(reqwest::Method::GET, &format!("/v1/memories/{id}"), None)
        .await;
    assert_eq!(code, 200, "{one}");
    assert_eq!(
        one["memories"][0]["event_time"],
        json!("2026-03-01T09:00:00Z")
    );

    // Bad input names the field and the rule, as over gRPC.
    let (code, err) = rest
        .post("/v1/retrieve", json!({"text": "tea", "limit": 1000}))
        .await;
    assert_eq!(code, 400, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("limit: must be in 1..=100")),
        "{err}"
    );
    let (code, err) = rest
        .post("/v1/memories", json!({"memories": [{"contnt": "typo"}]}))
        .await;
    assert_eq!(code, 400, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("invalid argument body: ")),
        "{err}"
    );

    // A body over the size limit: HTTP 413 with the API's JSON error.
    let (code, err) = rest
        .post("/v1/retrieve", json!({"text": "x".repeat(3 << 20)}))
        .await;
    assert_eq!(code, 413, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m == "body: must be at most 2097152 bytes"),
        "{err}"
    );

    // That answer closes the connection and says so, so a keep-alive client
    // does not send its next request down a socket the server is closing.
    let resp = rest
        .http
        .post(format!("{}/v1/retrieve", rest.base))
        .bearer_auth(&rest.key)
        .json(&json!({"text": "x".repeat(3 << 20)}))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 413);
    assert_eq!(
        resp.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );

    // The same keys: none, or another, is refused.
    let stranger = Rest {
        key: "k-nobody".into(),
        ..rest
    };
    let (code, _) = stranger
        .send(reqwest::Method::GET, &format!("/v1/memories/{id}"), None)
        .await;
    assert_eq!(code, 401);
    let rest = Rest {
        key: ts.key.clone(),
        ..stranger
    };

    let (code, gone) = rest
        .send(reqwest::Method::DELETE, &format!("/v1/memories/{id}"), None)
        .await;
    assert_eq!((code, &gone["deleted"]), (200, &json!(1)), "{gone}");
    let (code, _) = rest
        .send(reqwest::Method::GET, &format!("/v1/memories/{id}"), None)
        .await;
    assert_eq!(code, 404);

    // The document served is the one committed, and names every route.
    let (code, doc) = rest.send(reqwest::Method::GET, "/openapi.json", None).await;
    assert_eq!(code, 200);
    let committed: Value = serde_json::from_str(&std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/openapi.json"
    ))?)?;
    assert_eq!(doc, committed);
    for path in [
        "/v1/retrieve",
        "/v1/memories",
        "/v1/feedback",
        "/v1/memories/list",
    ] {
        assert!(doc["paths"][path]["post"].is_object(), "{path}");
    }
    assert!(doc["paths"]["/v1/memories/{id}"]["delete"].is_object());
    ts.shutdown().await;
    Ok(())
}
