//! Shared harness for the integration tests: the whole stack (or a subset)
//! on port 0 against the shared test Postgres, with an API key per tenant.

use engram::client::Client;
use engram::stack::{Service, Stack, StackOptions};
use engram_common::Settings;

/// Settings for a test stack: workspace `.engram` home, shared test database.
pub async fn settings() -> anyhow::Result<Settings> {
    let mut s = engram_common::db::test_settings();
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
