//! Shared harness for the integration tests: the whole stack (or a subset)
//! on port 0 against the shared test Postgres, with an API key per tenant.

use engram::client::Client;
use engram::stack::{Service, Stack, StackOptions};
use engram_common::Settings;

/// Settings for a test stack: workspace `.engram` home, shared test database.
pub async fn settings() -> anyhow::Result<Settings> {
    let mut s = engram_common::db::patient_test_settings();
    s.database.url_opt = Some(engram_common::db::test_database_url().await?);
    s.database.max_connections = 8;
    Ok(s)
}

pub struct TestStack {
    pub stack: Stack,
    pub tenant: String,
    pub key: String,
}

impl TestStack {
    /// All four services with a fresh tenant and a key for it at `trust`.
    pub async fn start(trust: &str) -> anyhow::Result<Self> {
        Self::start_with(settings().await?, Service::ALL.into_iter().collect(), trust).await
    }

    pub async fn start_with(
        settings: Settings,
        services: std::collections::BTreeSet<Service>,
        trust: &str,
    ) -> anyhow::Result<Self> {
        let tenant = format!("t-{}", uuid::Uuid::new_v4().simple());
        let key = format!("k-{}", uuid::Uuid::new_v4().simple());
        let opts = StackOptions {
            services,
            ephemeral_ports: true,
            dev_api_key: false,
            extra_keys: vec![(key.clone(), tenant.clone(), "agent-1".into(), trust.into())],
        };
        let stack = Stack::start(settings, opts).await?;
        Ok(Self { stack, tenant, key })
    }

    pub async fn client(&self) -> anyhow::Result<Client> {
        let uri = self
            .stack
            .gateway_uri()
            .ok_or_else(|| anyhow::anyhow!("no gateway in this stack"))?;
        Client::connect(&uri, &self.key).await
    }

    /// A key for another tenant/trust on the same stack is not possible
    /// after start; use a second TestStack for cross-identity tests.
    pub async fn shutdown(self) {
        self.stack.shutdown().await;
    }
}

/// The whole stack with one API key per (tenant tag, trust): keys with the
/// same tag share a tenant and the agent `agent-1`. Returns the stack, the
/// gateway's URI and the keys in order.
pub async fn stack_with_keys(
    settings: Settings,
    keys: &[(&str, &str)],
) -> anyhow::Result<(Stack, String, Vec<String>)> {
    let agents: Vec<(&str, &str, &str)> = keys.iter().map(|(t, l)| (*t, *l, "agent-1")).collect();
    stack_with_agents(settings, &agents).await
}

/// [`stack_with_keys`] with each key's agent id given: (tenant tag, trust,
/// agent).
pub async fn stack_with_agents(
    settings: Settings,
    keys: &[(&str, &str, &str)],
) -> anyhow::Result<(Stack, String, Vec<String>)> {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let extra_keys: Vec<_> = keys
        .iter()
        .map(|(tag, trust, agent)| {
            let key = format!("k-{tag}-{}", uuid::Uuid::new_v4().simple());
            (
                key,
                format!("t-{tag}-{run}"),
                agent.to_string(),
                trust.to_string(),
            )
        })
        .collect();
    let keys = extra_keys.iter().map(|k| k.0.clone()).collect();
    let opts = StackOptions {
        services: Service::ALL.into_iter().collect(),
        ephemeral_ports: true,
        dev_api_key: false,
        extra_keys,
    };
    let stack = Stack::start(settings, opts).await?;
    let uri = stack
        .gateway_uri()
        .ok_or_else(|| anyhow::anyhow!("no gateway"))?;
    Ok((stack, uri, keys))
}

/// A gateway of its own on `settings`' downstreams (a second replica, or one
/// with other pipeline settings), on port 0; its URI.
pub async fn spawn_gateway(settings: Settings) -> anyhow::Result<String> {
    let gw = retrieval_svc::Gateway::new(settings)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let heard = gw.clone();
    tokio::spawn(retrieval_svc::serve_gateway(
        listener,
        gw,
        std::future::pending(),
    ));
    heard.feed_heard(retrieval_svc::FEED_WAIT).await;
    Ok(format!("http://{addr}"))
}

/// A request with `key` as its bearer credential.
pub fn authed<T>(key: &str, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        "authorization",
        format!("Bearer {key}").parse().expect("ascii key"),
    );
    r
}

/// The gateway's `/metrics` lines (admin port) that start with `prefix`.
pub async fn metric_lines(stack: &Stack, prefix: &str) -> anyhow::Result<Vec<String>> {
    let body = reqwest::get(format!("http://{}/metrics", stack.admin_addr))
        .await?
        .text()
        .await?;
    Ok(body
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect())
}

/// Writes one memory with `content` (every other field default) through
/// the gateway: the first step of most end-to-end tests.
pub async fn remember(client: &mut Client, content: &str) -> anyhow::Result<()> {
    let memory = engram_proto::Memory {
        content: content.into(),
        ..Default::default()
    };
    client
        .memories
        .upsert(engram_proto::UpsertRequest {
            memories: vec![memory],
        })
        .await?;
    Ok(())
}

/// Runs `tests/py/install_pytools.py` into `<root>/.engram`, the script
/// `scripts/test` runs (a no-op when warm), so plain `cargo test` works on
/// a fresh checkout too; returns that home (`pytools/`, `schemathesis/`,
/// `selenium/`, `node/` when npm could provide buf).
pub async fn install_pytools(root: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    let home = root.join(".engram");
    let out = tokio::process::Command::new("python3")
        .arg(root.join("tests/py/install_pytools.py"))
        .arg(&home)
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "install_pytools.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(home)
}
