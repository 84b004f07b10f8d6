//! Connecting to Postgres (embedded or `DATABASE_URL`) and migrating it.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::pg::{EmbeddedPostgres, PgError};
use crate::settings::Settings;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("embedded postgres: {0}")]
    Embedded(#[from] PgError),
    #[error(
        "DATABASE_URL is not a valid postgres URL ({0}); expected postgres://user:pass@host:port/db"
    )]
    BadUrl(String),
    #[error(
        "cannot connect to postgres at {target}: {source}; check DATABASE_URL or unset it to use the embedded server"
    )]
    Connect { target: String, source: sqlx::Error },
    #[error(
        "migrations failed: {0} (the server needs the pgvector extension: CREATE EXTENSION vector)"
    )]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// The schema, embedded at compile time from `migrations/`.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// A pool plus, when we started it, the embedded server behind it.
pub struct Database {
    pub pool: PgPool,
    pub url: String,
    pub embedded_opt: Option<EmbeddedPostgres>,
}

impl Database {
    /// Connects (starting the embedded server when no URL is configured) and
    /// applies migrations. Safe to call from several processes at once.
    pub async fn open(settings: &Settings) -> Result<Self, DbError> {
        let (url, embedded_opt) = match &settings.database.url_opt {
            Some(url) => (url.clone(), None),
            None => {
                let s = settings.clone();
                let pg = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&s))
                    .await
                    .map_err(|e| PgError::Step {
                        step: "embedded postgres",
                        detail: e.to_string(),
                    })??;
                (pg.url(), Some(pg))
            }
        };
        let pool = connect_with(
            &url,
            settings.database.max_connections,
            settings.search.hnsw_ef_search,
        )
        .await?;
        MIGRATOR.run(&pool).await?;
        Ok(Self {
            pool,
            url,
            embedded_opt,
        })
    }

    /// Closes the pool, then stops the embedded server if we own one.
    pub async fn close(mut self) {
        self.pool.close().await;
        if let Some(mut pg) = self.embedded_opt.take() {
            let _ = tokio::task::spawn_blocking(move || pg.stop()).await;
        }
    }
}

pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    connect_with(
        url,
        max_connections,
        crate::settings::SearchSettings::default().hnsw_ef_search,
    )
    .await
}

/// [`connect`] with the HNSW scan settings fixed per connection (startup
/// options), so a dense query is one round trip: no transaction and no
/// `SET LOCAL` statements in front of it. Iterative scans (relaxed order)
/// keep filtered HNSW queries from coming back short.
pub async fn connect_with(
    url: &str,
    max_connections: u32,
    hnsw_ef_search: u32,
) -> Result<PgPool, DbError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(DbError::BadUrl(format!(
            "{:?} does not start with postgres://",
            url.split('@').next_back().unwrap_or("")
        )));
    }
    let opts: PgConnectOptions = url
        .parse()
        .map_err(|e: sqlx::Error| DbError::BadUrl(e.to_string()))?;
    let target = format!("{}:{}", opts.get_host(), opts.get_port());
    let ef = hnsw_ef_search.clamp(1, 1000).to_string();
    let opts = opts.options([
        ("hnsw.ef_search", ef.as_str()),
        ("hnsw.iterative_scan", "relaxed_order"),
    ]);
    PgPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(opts)
        .await
        .map_err(|source| DbError::Connect { target, source })
}

/// For tests: one Postgres shared by every test process of a run. Uses
/// `ENGRAM_TEST_DATABASE_URL` when set, else starts or adopts the embedded
/// server in `<workspace>/.engram/test-pgdata` (left running for the other
/// test binaries; scripts/test stops it at the end). Isolation between
/// tests comes from unique tenant ids, never from separate databases.
pub async fn test_database() -> Result<PgPool, DbError> {
    let url = test_database_url().await?;
    let pool = connect(&url, 8).await?;
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// The URL of the shared test database (see [`test_database`]).
pub async fn test_database_url() -> Result<String, DbError> {
    Ok(match std::env::var("ENGRAM_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            let settings = test_settings();
            let start = move || {
                // Parallel test processes race to start it; the losers adopt.
                let mut last = None;
                for _ in 0..20 {
                    match EmbeddedPostgres::start(&settings) {
                        Ok(mut pg) => {
                            let url = pg.url();
                            // Leave it running for the other test processes;
                            // scripts/test stops it at the end.
                            pg.detach();
                            return Ok(url);
                        }
                        Err(e) => {
                            last = Some(e);
                            std::thread::sleep(Duration::from_millis(500));
                        }
                    }
                }
                Err(last.unwrap_or(PgError::Step {
                    step: "start",
                    detail: "gave up".into(),
                }))
            };
            tokio::task::spawn_blocking(start)
                .await
                .map_err(|e| PgError::Step {
                    step: "embedded postgres",
                    detail: e.to_string(),
                })??
        }
    })
}

/// Settings for tests: home = `<workspace>/.engram`, data dir `test-pgdata`.
pub fn test_settings() -> Settings {
    let mut s = Settings {
        home: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.engram"),
        ..Settings::default()
    };
    s.database.embedded_data_dir = "test-pgdata".into();
    // Tests cover every stage, the optional cross-encoder included when it
    // is there: a clone without the shared/ folder beside it has no model,
    // and Stage 3 would then degrade every answer of every test.
    s.pipeline.cross_encoder = crate::bootstrap::ensure_cross_encoder(&s.home).is_some();
    s
}

/// [`test_settings`] for tests that assert what an answer holds, not how a
/// stage degrades: the gateway waits up to 10 s for each downstream (30 s in
/// all). On a loaded 2-core CI machine a debug build's search, graph or
/// cross-encoder call can outlast the production bounds (200-1500 ms); the
/// answer then came back degraded, uncached and ranked without a channel,
/// and assertions about ranking or caching failed at random. Tests of
/// degradation inject their own refusal or bound (search_bounds.rs,
/// graph_bounds.rs, retrieval-svc/tests/resilience.rs, soak.rs).
pub fn patient_test_settings() -> Settings {
    let mut s = test_settings();
    let p = &mut s.pipeline;
    p.ceiling_ms = 30_000;
    p.vector_timeout_ms = 10_000;
    p.keyword_timeout_ms = 10_000;
    p.graph_timeout_ms = 10_000;
    p.rerank_timeout_ms = 10_000;
    s
}

#[cfg(test)]
mod tests {
    use std::str::FromStr as _;

    use sqlx::Connection as _;
    use sqlx::postgres::{PgConnection, PgSslMode};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A Postgres that requires TLS is reachable: with `sslmode=require` or
    /// `verify-full`, the client asks for TLS and, when the server agrees,
    /// starts a TLS handshake. Built with sqlx's `tls-none`, it failed before
    /// sending a byte ("SQLx was built without TLS support"). The fake
    /// server here answers the SSLRequest with `S` and reads the first byte
    /// that follows: a TLS handshake record (0x16).
    #[tokio::test]
    async fn sslmode_require_and_verify_full_start_a_tls_handshake() {
        for (mode, want) in [
            ("require", PgSslMode::Require),
            ("verify-full", PgSslMode::VerifyFull),
        ] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let port = listener.local_addr().expect("addr").port();
            let server = tokio::spawn(async move {
                let (mut sock, _) = listener.accept().await.expect("accept");
                let mut request = [0u8; 8];
                sock.read_exact(&mut request).await.expect("ssl request");
                sock.write_all(b"S").await.expect("answer S");
                let mut first = [0u8; 1];
                sock.read_exact(&mut first)
                    .await
                    .map(|_| (request, first[0]))
            });
            let url = format!("postgres://engram:x@127.0.0.1:{port}/engram?sslmode={mode}");
            let opts = super::PgConnectOptions::from_str(&url).expect("url parses");
            // PgSslMode has no PartialEq.
            let got = format!("{:?}", opts.get_ssl_mode());
            assert_eq!(got, format!("{want:?}"), "{mode}");
            let client = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                PgConnection::connect_with(&opts),
            )
            .await
            .expect("the connect attempt ends");
            let err = client.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(!err.contains("without TLS support"), "{mode}: {err}");
            let (request, first) = server
                .await
                .expect("join")
                .unwrap_or_else(|e| panic!("{mode}: no handshake after S ({e}); client: {err}"));
            // SSLRequest: length 8, code 80877103.
            assert_eq!(request, [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f], "{mode}");
            assert_eq!(first, 0x16, "{mode}: a TLS handshake record");
        }
    }
}
