//! The four services as separate `engram serve --services <one>` child
//! processes, for `engram bench`: peak RSS per service is only measurable
//! when each service owns its process. The parent opens the database (and
//! the embedded server, when no URL is configured) and hands every child the
//! same settings through a generated config file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use engram_common::Settings;
use engram_common::db::Database;
use engram_common::settings::ApiKeySettings;
use engram_stack::stack::{Service, health_status, random_token, sha256_hex};

/// A running set of per-service child processes.
pub struct SplitStack {
    pub settings: Settings,
    pub addrs: Vec<(Service, SocketAddr)>,
    db: Database,
    children: Vec<(Service, tokio::process::Child)>,
}

/// The `engram` binary the services run from: `ENGRAM_BIN` (set by
/// `engram` when it hands a lab command to this binary), else the `engram`
/// beside this executable (both land in `target/release`).
pub fn engram_exe() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("ENGRAM_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let me = std::env::current_exe().context("locating this executable")?;
    let beside = me.with_file_name(format!("engram{}", std::env::consts::EXE_SUFFIX));
    if !beside.is_file() {
        bail!(
            "the services run from the `engram` binary, and there is none at {} \
             (build it: cargo build --release -p engram; or set ENGRAM_BIN)",
            beside.display()
        );
    }
    Ok(beside)
}

/// A free loopback port: bind port 0 and release it. The child binds it a
/// moment later; a collision in between fails the start loudly, not silently.
fn free_addr() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

impl SplitStack {
    /// Starts search, graph, rerank and the gateway, each in its own process,
    /// accepting `key` for `tenant` at trust sensitive.
    pub async fn start(mut settings: Settings, key: &str, tenant: &str) -> anyhow::Result<Self> {
        let db = Database::open(&settings).await.context("database")?;
        settings.database.url_opt = Some(db.url.clone());
        if settings.auth.internal_token_opt.is_none() {
            settings.auth.internal_token_opt = Some(random_token());
        }
        settings.auth.api_keys.push(ApiKeySettings {
            sha256: sha256_hex(key),
            tenant: tenant.into(),
            agent_id: "bench".into(),
            trust: "sensitive".into(),
        });
        let mut addrs = Vec::new();
        for svc in Service::ALL {
            let a = free_addr()?;
            addrs.push((svc, a));
            set_address(&mut settings, svc, a);
        }

        let dir = settings.home.join("bench-split");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let exe = engram_exe()?;
        let mut children = Vec::new();
        for (svc, _) in &addrs {
            // Each child needs its own admin (and, for the gateway, HTTP) port.
            let mut s = settings.clone();
            s.listen.admin = free_addr()?.to_string();
            s.listen.http = free_addr()?.to_string();
            let config: PathBuf = dir.join(format!("{}.toml", svc.name()));
            let text = toml::to_string(&s).context("serialising child settings")?;
            write_private(&config, &text)?;
            let log = std::fs::File::create(dir.join(format!("{}.log", svc.name())))?;
            let child = tokio::process::Command::new(&exe)
                .args(["--config"])
                .arg(&config)
                .args(["serve", "--services", svc.name()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {} process", svc.name()))?;
            children.push((*svc, child));
        }
        let mut stack = Self {
            settings,
            addrs,
            db,
            children,
        };
        if let Err(e) = stack.wait_serving(Duration::from_secs(180)).await {
            stack.shutdown().await;
            return Err(e.context(format!("see the logs in {}", dir.display())));
        }
        Ok(stack)
    }

    pub fn database_url(&self) -> &str {
        &self.db.url
    }

    async fn wait_serving(&mut self, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        for (svc, addr) in self.addrs.clone() {
            loop {
                if let Some((_, child)) = self.children.iter_mut().find(|(s, _)| *s == svc)
                    && let Ok(Some(status)) = child.try_wait()
                {
                    bail!("{} process exited during start-up ({status})", svc.name());
                }
                let status = health_status(addr, svc, &self.settings.tls).await;
                match status {
                    Some(1) => break,
                    Some(2) if svc == Service::Rerank => break,
                    _ => {}
                }
                if tokio::time::Instant::now() > deadline {
                    bail!("{} did not report SERVING within {within:?}", svc.name());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    /// Each service process's id.
    pub fn pids(&self) -> Vec<(Service, u32)> {
        (self.children.iter())
            .filter_map(|(svc, c)| Some((*svc, c.id()?)))
            .collect()
    }

    /// Peak resident set (VmHWM) of each service's process, in MB.
    pub fn peak_rss_mb(&self) -> Vec<(Service, f64)> {
        self.children
            .iter()
            .filter_map(|(svc, c)| {
                let pid = c.id()?;
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                Some((*svc, vm_hwm_mb(&status)?))
            })
            .collect()
    }

    /// SIGTERM (graceful drain), then a kill for whatever is still running.
    pub async fn shutdown(mut self) {
        for (_, c) in &self.children {
            if let Some(pid) = c.id() {
                let _ = tokio::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await;
            }
        }
        for (svc, c) in &mut self.children {
            if tokio::time::timeout(Duration::from_secs(15), c.wait())
                .await
                .is_err()
            {
                tracing::warn!(service = svc.name(), "child did not stop; killing it");
                let _ = c.kill().await;
            }
        }
        self.db.close().await;
    }
}

/// The config carries the internal token: readable by the owner only.
pub fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// `VmHWM` of a `/proc/<pid>/status` text, in MB (one decimal).
pub fn vm_hwm_mb(status: &str) -> Option<f64> {
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| (kb / 1024.0 * 10.0).round() / 10.0)
}

/// Points `svc`'s listener and the other services' downstream address for
/// it at `a` (bench's and soak's split deployments).
pub fn set_address(settings: &mut Settings, svc: Service, a: std::net::SocketAddr) {
    let uri = engram_common::tls::uri(a, &settings.tls);
    match svc {
        Service::Retrieval => settings.listen.retrieval = a.to_string(),
        Service::Search => {
            settings.listen.search = a.to_string();
            settings.downstream.search = uri;
        }
        Service::Graph => {
            settings.listen.graph = a.to_string();
            settings.downstream.graph = uri;
        }
        Service::Rerank => {
            settings.listen.rerank = a.to_string();
            settings.downstream.rerank = uri;
        }
    }
}
