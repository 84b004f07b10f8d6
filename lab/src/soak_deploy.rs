//! Where `engram soak` runs: one child process per service (bench's
//! [`SplitStack`], so a kill is a real `kill -9` of one process and RSS is
//! per service), or, for the tests, each service as its own in-process
//! [`Stack`] on a fixed loopback port (a kill is then an abrupt shutdown of
//! that service alone; the test binary is not `engram`, so it cannot spawn
//! `engram serve`). Either way every service listens on a port of its own
//! that a restart binds again, so the gateway finds it where it was.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use engram_common::Settings;
use engram_common::settings::ApiKeySettings;
use engram_stack::client::Client;
use engram_stack::stack::{Service, Stack, StackOptions, health_status, random_token, sha256_hex};

use super::pg::{self, PrivatePostgres};
use crate::split::SplitStack;

/// The two tenants of the noisy-neighbour scenario: (api key, tenant).
#[derive(Debug, Clone)]
pub struct Tenants {
    pub attacker: (String, String),
    pub steady: (String, String),
}

impl Tenants {
    /// Fresh keys; tenant names tagged with `run` (fixed names let repeated
    /// `engram soak` runs reuse the seeded corpus).
    pub fn new(run: &str) -> Self {
        Self {
            attacker: (random_token(), format!("soak-a-{run}")),
            steady: (random_token(), format!("soak-b-{run}")),
        }
    }
}

enum Runner {
    Processes {
        split: Box<SplitStack>,
        exe: PathBuf,
        dir: PathBuf,
        /// Services started again after a kill (their first process is gone).
        replaced: BTreeMap<Service, tokio::process::Child>,
    },
    InProcess {
        stacks: BTreeMap<Service, Stack>,
    },
}

/// A running deployment the scenarios can kill, restart and re-route.
pub struct Deployment {
    /// Shared by every service: listen and downstream addresses, keys, token.
    pub settings: Settings,
    pub tenants: Tenants,
    runner: Runner,
    /// The soak's own embedded Postgres, which `faults` may kill (processes
    /// mode with no external database only).
    pg_opt: Option<PrivatePostgres>,
}

/// Whether `e` is a bind that found its port taken.
fn addr_in_use(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse)
    })
}

/// A free loopback port: bind port 0 and release it.
fn free_addr() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

fn listen_of(s: &Settings, svc: Service) -> &str {
    match svc {
        Service::Retrieval => &s.listen.retrieval,
        Service::Search => &s.listen.search,
        Service::Graph => &s.listen.graph,
        Service::Rerank => &s.listen.rerank,
    }
}

impl Deployment {
    /// One process per service (`<current exe> serve --services <one>`):
    /// call it from the `engram` binary. With no external database URL the
    /// services share a private embedded server (`soak-pgdata` under the
    /// home, on a port fixed for the run), never the home's shared one.
    pub async fn processes(mut settings: Settings, tenants: Tenants) -> anyhow::Result<Self> {
        let (key, tenant) = &tenants.steady;
        push_key(&mut settings, &tenants.attacker);
        let private = settings.database.url_opt.is_none();
        if private {
            pg::make_private(&mut settings)?;
        }
        let pg_settings = settings.clone();
        let split = SplitStack::start(settings, key, tenant).await?;
        let pg_opt = match (private, pg::port_of_url(split.database_url())) {
            (true, Some(port)) => Some(PrivatePostgres::new(pg_settings, port)),
            (true, None) => {
                tracing::warn!("cannot read the private postgres port; it will not be killed");
                None
            }
            (false, _) => None,
        };
        let dir = split.settings.home.join("soak");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self {
            settings: split.settings.clone(),
            tenants,
            pg_opt,
            runner: Runner::Processes {
                split: Box::new(split),
                exe: crate::split::engram_exe()?,
                dir,
                replaced: BTreeMap::new(),
            },
        })
    }

    /// Each service its own in-process stack on a fixed free port.
    pub async fn in_process(mut settings: Settings, tenants: Tenants) -> anyhow::Result<Self> {
        settings.auth.internal_token_opt = Some(random_token());
        push_key(&mut settings, &tenants.attacker);
        push_key(&mut settings, &tenants.steady);
        for svc in Service::ALL {
            crate::split::set_address(&mut settings, svc, free_addr()?);
        }
        let mut dep = Self {
            settings,
            tenants,
            runner: Runner::InProcess {
                stacks: BTreeMap::new(),
            },
            pg_opt: None,
        };
        for svc in Service::ALL {
            if let Err(e) = dep.start_on_a_free_port(svc).await {
                dep.shutdown().await;
                return Err(e);
            }
        }
        Ok(dep)
    }

    /// Starts `svc` on its address, or on another free one when something
    /// took that port between choosing it and binding it (an outgoing
    /// connection of a test running beside this one gets its local port
    /// from the same range: a failed CI run). Only at the first start:
    /// nothing points at the service yet, and the gateway starts last.
    async fn start_on_a_free_port(&mut self, svc: Service) -> anyhow::Result<()> {
        const ATTEMPTS: usize = 5;
        let mut attempt = 1;
        loop {
            match self.restart(svc).await {
                Err(e) if attempt < ATTEMPTS && addr_in_use(&e) => {
                    tracing::warn!(service = svc.name(), error = %e, "port taken before bind; another");
                    crate::split::set_address(&mut self.settings, svc, free_addr()?);
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    pub fn gateway_uri(&self) -> String {
        format!("http://{}", self.settings.listen.retrieval)
    }

    /// A client of the public API as the steady (`false`) or attacking tenant.
    pub async fn client(&self, attacker: bool) -> anyhow::Result<Client> {
        let (key, _) = match attacker {
            true => &self.tenants.attacker,
            false => &self.tenants.steady,
        };
        Client::connect(&self.gateway_uri(), key).await
    }

    pub fn database_url(&self) -> Option<String> {
        match &self.runner {
            Runner::Processes { split, .. } => Some(split.database_url().to_string()),
            Runner::InProcess { .. } => self.settings.database.url_opt.clone(),
        }
    }

    /// Why Postgres cannot be killed here (`None`: it can, it is ours).
    pub fn postgres_unkillable(&self) -> Option<&'static str> {
        match (&self.runner, &self.pg_opt) {
            (_, Some(_)) => None,
            (Runner::InProcess { .. }, None) => Some(
                "not killed: the in-process deployment runs on the shared test Postgres, which other test processes use",
            ),
            (Runner::Processes { .. }, None) => Some(
                "not killed: an external database (DATABASE_URL / database.url_opt) is configured, which the soak does not own",
            ),
        }
    }

    /// SIGKILL of the private Postgres's postmaster; its pid.
    pub async fn kill_postgres(&mut self) -> anyhow::Result<u32> {
        match &mut self.pg_opt {
            Some(pg) => pg.kill().await,
            None => bail!("no private postgres to kill"),
        }
    }

    /// Starts the private Postgres again on its data dir and port; the
    /// number of attempts it took.
    pub async fn restart_postgres(&mut self) -> anyhow::Result<u32> {
        match &mut self.pg_opt {
            Some(pg) => pg.restart().await,
            None => bail!("no private postgres to restart"),
        }
    }

    /// The private Postgres's data dir, when the soak runs one.
    pub fn postgres_data_dir(&self) -> Option<PathBuf> {
        self.pg_opt.as_ref().map(|p| p.data_dir().to_path_buf())
    }

    /// The process of each service (one shared pid in process).
    pub fn pids(&self) -> Vec<(String, u32)> {
        match &self.runner {
            Runner::Processes { replaced, .. } => Service::ALL
                .into_iter()
                .filter_map(|svc| {
                    let pid = match replaced.get(&svc) {
                        Some(c) => c.id(),
                        None => child_pid(svc),
                    }?;
                    Some((svc.name().to_string(), pid))
                })
                .collect(),
            Runner::InProcess { .. } => vec![("all_in_process".into(), std::process::id())],
        }
    }

    /// Stops `svc` without warning: SIGKILL of its process, or (in process)
    /// an immediate shutdown with no drain.
    pub async fn kill(&mut self, svc: Service) -> anyhow::Result<()> {
        match &mut self.runner {
            Runner::Processes { replaced, .. } => {
                if let Some(mut c) = replaced.remove(&svc) {
                    c.kill().await.context("killing a restarted service")?;
                    return Ok(());
                }
                let pid = child_pid(svc).with_context(|| format!("no {} process", svc.name()))?;
                signal(pid, "-KILL").await
            }
            Runner::InProcess { stacks } => {
                if let Some(s) = stacks.remove(&svc) {
                    s.shutdown().await;
                }
                Ok(())
            }
        }
    }

    /// Starts `svc` again on its address with the current settings and
    /// waits until it reports SERVING (rerank: until it answers at all).
    pub async fn restart(&mut self, svc: Service) -> anyhow::Result<()> {
        let mut s = self.settings.clone();
        s.listen.admin = free_addr()?.to_string();
        s.listen.http = free_addr()?.to_string();
        match &mut self.runner {
            Runner::Processes {
                exe, dir, replaced, ..
            } => {
                let child = spawn_service(exe, dir, &s, svc)?;
                replaced.insert(svc, child);
            }
            Runner::InProcess { stacks } => {
                let opts = StackOptions {
                    services: [svc].into_iter().collect(),
                    ephemeral_ports: false,
                    dev_api_key: false,
                    extra_keys: Vec::new(),
                };
                stacks.insert(svc, Stack::start(s, opts).await?);
            }
        }
        self.wait_serving(svc, Duration::from_secs(180)).await
    }

    /// Points the gateway's client of `svc` at `addr` (a proxy), restarting
    /// the gateway; `svc` itself keeps listening where it was.
    pub async fn reroute(&mut self, routes: &[(Service, SocketAddr)]) -> anyhow::Result<()> {
        for (svc, addr) in routes {
            let uri = engram_common::tls::uri(*addr, &self.settings.tls);
            match svc {
                Service::Search => self.settings.downstream.search = uri,
                Service::Graph => self.settings.downstream.graph = uri,
                Service::Rerank => self.settings.downstream.rerank = uri,
                Service::Retrieval => bail!("the gateway has no downstream of itself"),
            }
        }
        self.kill(Service::Retrieval).await?;
        self.restart(Service::Retrieval).await
    }

    /// The address `svc` listens on.
    pub fn addr(&self, svc: Service) -> anyhow::Result<SocketAddr> {
        listen_of(&self.settings, svc)
            .parse()
            .with_context(|| format!("{} address", svc.name()))
    }

    async fn wait_serving(&self, svc: Service, within: Duration) -> anyhow::Result<()> {
        let addr = self.addr(svc)?;
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match health_status(addr, svc, &self.settings.tls).await {
                Some(1) => return Ok(()),
                Some(2) if svc == Service::Rerank => return Ok(()),
                _ => {}
            }
            if tokio::time::Instant::now() > deadline {
                bail!("{} did not report SERVING within {within:?}", svc.name());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops every service, then the soak's own Postgres: the split stack's
    /// handle first, so that the handle of a restarted server is the last
    /// holder and stops it (pg.rs stops a server only for its last user).
    pub async fn shutdown(self) {
        match self.runner {
            Runner::Processes {
                split, replaced, ..
            } => {
                for (svc, mut c) in replaced {
                    if let Some(pid) = c.id() {
                        let _ = signal(pid, "-TERM").await;
                    }
                    if tokio::time::timeout(Duration::from_secs(15), c.wait())
                        .await
                        .is_err()
                    {
                        tracing::warn!(service = svc.name(), "restarted service did not stop");
                        let _ = c.kill().await;
                    }
                }
                split.shutdown().await;
            }
            Runner::InProcess { mut stacks } => {
                // The gateway first, so nothing calls a stopped downstream.
                if let Some(gw) = stacks.remove(&Service::Retrieval) {
                    gw.shutdown().await;
                }
                for (_, s) in stacks {
                    s.shutdown().await;
                }
            }
        }
        if let Some(pg) = self.pg_opt {
            pg.stop().await;
        }
    }
}

fn push_key(settings: &mut Settings, (key, tenant): &(String, String)) {
    settings.auth.api_keys.push(ApiKeySettings {
        sha256: sha256_hex(key),
        tenant: tenant.clone(),
        agent_id: "soak".into(),
        trust: "sensitive".into(),
    });
}

/// `exe --config <dir>/<svc>.toml serve --services <svc>`, log beside it.
fn spawn_service(
    exe: &std::path::Path,
    dir: &std::path::Path,
    s: &Settings,
    svc: Service,
) -> anyhow::Result<tokio::process::Child> {
    let config = dir.join(format!("{}.toml", svc.name()));
    crate::split::write_private(
        &config,
        &toml::to_string(s).context("serialising settings")?,
    )?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{}.log", svc.name())))?;
    tokio::process::Command::new(exe)
        .arg("--config")
        .arg(&config)
        .args(["serve", "--services", svc.name()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("restarting {}", svc.name()))
}

async fn signal(pid: u32, sig: &str) -> anyhow::Result<()> {
    let st = tokio::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .await?;
    anyhow::ensure!(st.success(), "kill {sig} {pid} failed");
    Ok(())
}

/// The pid of this process's live child running `serve --services <svc>`
/// (SplitStack keeps its children private; /proc names them exactly: our
/// pid as parent and the service in the command line).
fn child_pid(svc: Service) -> Option<u32> {
    let me = std::process::id();
    let want = ["serve", "--services", svc.name()];
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // "pid (comm) state ppid ...": comm may hold spaces; split after ')'.
        let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
        let (state, ppid) = (rest.next()?, rest.next()?.parse::<u32>().ok()?);
        if ppid != me || state == "Z" {
            return None;
        }
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        args.windows(3)
            .any(|w| w.iter().zip(want).all(|(a, b)| *a == b.as_bytes()))
            .then_some(pid)
    })
}

/// CPU seconds (user + system) each live process has used so far.
pub fn cpu_seconds(pids: &[(String, u32)]) -> BTreeMap<String, f64> {
    pids.iter()
        .filter_map(|(name, pid)| {
            let secs = crate::profile::process_cpu_seconds_opt(&pid.to_string())?;
            Some((name.clone(), secs))
        })
        .collect()
}

/// Resident set, open fds and Postgres connections of one process.
pub fn process_usage(pid: u32, pg_port: u16) -> serde_json::Value {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_mb = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| (kb / 1024.0 * 10.0).round() / 10.0);
    let sockets = socket_inodes(pid);
    serde_json::json!({
        "rss_mb": rss_mb,
        "fds": std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0),
        "pg_connections": established_to(pid, pg_port, &sockets),
    })
}

fn socket_inodes(pid: u32) -> std::collections::HashSet<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Default::default();
    };
    dir.flatten()
        .filter_map(|e| {
            let link = std::fs::read_link(e.path()).ok()?;
            let s = link.to_str()?;
            s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// Established TCP connections of `pid` (by socket inode) to `port`.
fn established_to(pid: u32, port: u16, inodes: &std::collections::HashSet<u64>) -> usize {
    let port_hex = format!(":{port:04X}");
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter(|l| {
                    let c: Vec<&str> = l.split_whitespace().collect();
                    c.len() > 9
                        && c[2].ends_with(&port_hex)
                        && c[3] == "01"
                        && c[9].parse::<u64>().is_ok_and(|i| inodes.contains(&i))
                })
                .map(|_| ())
                .collect::<Vec<_>>()
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_taken_port_is_told_apart_from_other_start_failures() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = held.local_addr().expect("addr").to_string();
        let e = engram_common::server::bind(&addr, "retrieval")
            .await
            .expect_err("the port is held");
        assert!(addr_in_use(&e), "{e:#}");
        assert!(e.to_string().contains("already in use"), "{e}");
        assert!(!addr_in_use(&anyhow::anyhow!("retrieval: cannot listen")));
    }
}
