//! The soak's own embedded Postgres. With no external database configured,
//! `engram soak` runs on a private server (data dir `soak-pgdata` under the
//! home, a port fixed for the whole run) instead of the `.engram` home's
//! shared one, so the faults scenario can SIGKILL the postmaster without
//! taking other users of the home (tests, evals, `engram up`) down with it,
//! and start it again where every service expects it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use engram_common::Settings;
use engram_common::pg::{EmbeddedPostgres, postmaster_pid};

/// The private server's data dir, relative to the home.
pub const DATA_DIR: &str = "soak-pgdata";

/// How long a restart keeps trying: the orphaned backends of a killed
/// postmaster hold its shared memory until they notice and exit, and a new
/// postmaster refuses to start on a data dir whose segment is still in use.
const RESTART_WITHIN: Duration = Duration::from_secs(60);

/// Points `settings` at the private server: its data dir and a free port
/// chosen now, so that a restart listens where the services connect.
pub fn make_private(settings: &mut Settings) -> anyhow::Result<()> {
    settings.database.embedded_data_dir = DATA_DIR.into();
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a port for postgres")?;
    settings.database.embedded_port = l.local_addr()?.port();
    Ok(())
}

/// A private server the soak may kill and start again.
pub struct PrivatePostgres {
    /// Settings to start it with: no URL, the private data dir and port.
    settings: Settings,
    data: PathBuf,
    /// The handle of the server started after a kill (the first one is the
    /// split stack's, which stops it at the end unless this one still holds it).
    restarted_opt: Option<EmbeddedPostgres>,
}

impl PrivatePostgres {
    /// `settings` as given to [`make_private`]; `port` the one the server
    /// actually listens on (an orphan of a crashed run may have been adopted).
    pub fn new(mut settings: Settings, port: u16) -> Self {
        settings.database.url_opt = None;
        settings.database.embedded_port = port;
        let data = settings.home_path(&settings.database.embedded_data_dir);
        let data = if data.is_absolute() {
            data
        } else {
            std::env::current_dir()
                .map(|c| c.join(&data))
                .unwrap_or(data)
        };
        Self {
            settings,
            data,
            restarted_opt: None,
        }
    }

    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// SIGKILL of the postmaster (pid on the first line of
    /// `postmaster.pid`); returns once the process is gone.
    pub async fn kill(&mut self) -> anyhow::Result<u32> {
        let pid = postmaster_pid(&self.data)
            .with_context(|| format!("no postmaster.pid in {}", self.data.display()))?;
        anyhow::ensure!(alive(pid), "postmaster {pid} is not running");
        let st = tokio::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .await?;
        anyhow::ensure!(st.success(), "kill -KILL {pid} failed");
        // Not our child (pg_ctl daemonises it): whoever reaps orphans here
        // may be slow to, so a zombie counts as gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The handle of an earlier restart holds a server that is gone:
        // drop it without `pg_ctl stop` on the data dir a new server is about
        // to use (`detach` marks the dead pid, which no new server will have).
        if let Some(mut old) = self.restarted_opt.take() {
            old.detach();
        }
        Ok(pid)
    }

    /// Starts the server again on the same data dir and port, retrying
    /// while the killed one's backends still hold its shared memory; the
    /// number of attempts.
    pub async fn restart(&mut self) -> anyhow::Result<u32> {
        let deadline = Instant::now() + RESTART_WITHIN;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let s = self.settings.clone();
            let started = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&s))
                .await
                .context("postgres start task")?;
            match started {
                Ok(pg) => {
                    if pg.port() != self.settings.database.embedded_port {
                        bail!(
                            "postgres came back on port {} instead of {}",
                            pg.port(),
                            self.settings.database.embedded_port
                        );
                    }
                    self.restarted_opt = Some(pg);
                    return Ok(attempts);
                }
                Err(e) if Instant::now() < deadline => {
                    tracing::info!(error = %e, attempts, "postgres not restartable yet; retrying");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e).context(format!(
                        "postgres did not restart within {RESTART_WITHIN:?} ({attempts} attempts)"
                    )));
                }
            }
        }
    }

    /// Stops the restarted server, if any (call after the split stack has
    /// dropped its own handle, so that this one is the last holder).
    pub async fn stop(mut self) {
        if let Some(mut pg) = self.restarted_opt.take() {
            let _ = tokio::task::spawn_blocking(move || pg.stop()).await;
        }
    }
}

/// Whether `pid` runs (exists and is not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|st| {
            let state = st
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_string();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

/// The port of a `postgres://user@host:port/db` URL.
pub fn port_of_url(url: &str) -> Option<u16> {
    let host = url.rsplit_once('@').map_or(url, |(_, h)| h);
    let host = host.split('/').next()?;
    host.rsplit_once(':')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_port_and_the_postmaster_pid() {
        assert_eq!(
            port_of_url("postgres://postgres@127.0.0.1:39033/engram"),
            Some(39033)
        );
        assert_eq!(port_of_url("postgres://u:p@db:5432/x"), Some(5432));
        assert_eq!(port_of_url("postgres://db/x"), None);
        let dir = std::env::temp_dir().join(format!("soak-pg-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        assert_eq!(postmaster_pid(&dir), None);
        std::fs::write(dir.join("postmaster.pid"), "4242\n/x\n1\n5432\n").expect("pid");
        assert_eq!(postmaster_pid(&dir), Some(4242));
        assert!(alive(std::process::id()), "this process runs");
        let _ = std::fs::remove_dir_all(dir);
    }
}
