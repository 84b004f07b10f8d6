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
    // Tests cover every stage, the optional cross-encoder included.
    s.pipeline.cross_encoder = true;
    s
}
