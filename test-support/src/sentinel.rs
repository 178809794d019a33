//! A Redis Sentinel deployment: a master, its replicas and three sentinels (`redis-server --sentinel`),
//! each a child process on a free loopback port, killed on drop.
//!
//! The sentinels use short timings (a master is down after 1 s without an answer, a failover times out
//! after 5 s) so that tests can fail over in seconds: [`RedisSentinels::failover`] asks a sentinel for
//! `SENTINEL FAILOVER` and waits until every sentinel names the new master, which says `ROLE` master,
//! and the old one replicates from it again.

use std::fmt;
use std::fs;
use std::io;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::cluster::cli_binary;
use crate::{free_port, RedisServer, TempDir, STARTUP_TIMEOUT};

/// The name the sentinels monitor the master by.
pub const MASTER_NAME: &str = "sl-master";

/// How long [`RedisSentinels::start`] and [`RedisSentinels::failover`] wait for the deployment to
/// settle.
pub const SENTINEL_TIMEOUT: Duration = Duration::from_secs(60);

/// A master, its replicas and three sentinels.
pub struct RedisSentinels {
    /// The data nodes; the first one started as the master.
    nodes: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
    /// With TLS: the certificates, and each node's `(plain port, TLS port)` (the sentinels and
    /// replication speak TLS; the plain ports stay open for this crate's own commands).
    tls: Option<(TempDir, Vec<(u16, u16)>)>,
}

impl fmt::Debug for RedisSentinels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSentinels")
            .field("nodes", &self.node_ports())
            .field("sentinels", &self.sentinel_ports())
            .finish()
    }
}

struct SentinelProcess {
    port: u16,
    tls_port: Option<u16>,
    dir: TempDir,
    child: Option<Child>,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl RedisSentinels {
    /// A master with `replicas` replicas and three sentinels (quorum 2), once every sentinel sees the
    /// others and every replica, and every replica has synced.
    ///
    /// # Panics
    /// If a process does not start or the deployment does not settle within [`SENTINEL_TIMEOUT`].
    pub fn start(replicas: usize) -> RedisSentinels {
        Self::start_with(replicas, &[])
    }

    /// [`start`](Self::start) with extra arguments for every data node (`["--min-replicas-to-write",
    /// "1"]`).
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_with(replicas: usize, node_args: &[&str]) -> RedisSentinels {
        Self::try_start(replicas, node_args, false)
            .unwrap_or_else(|e| panic!("could not start the sentinels: {e}"))
    }

    /// [`start`](Self::start) over TLS ([`certificates`](crate::tls::certificates); client certificates
    /// optional): the sentinels and the nodes listen on TLS ports too, replicate and monitor over TLS,
    /// and the sentinels name the nodes' TLS ports. `None` (skipped) without `openssl` outside `CI`.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_tls(replicas: usize) -> Option<RedisSentinels> {
        if !crate::tls::openssl_available() {
            return None;
        }
        Some(
            Self::try_start(replicas, &[], true)
                .unwrap_or_else(|e| panic!("could not start the TLS sentinels: {e}")),
        )
    }

    fn try_start(replicas: usize, extra: &[&str], tls: bool) -> io::Result<RedisSentinels> {
        let certs = if tls {
            let dir = TempDir::new()?;
            crate::tls::certificates(&dir.path);
            Some(dir)
        } else {
            None
        };
        // `--name value` pairs, for the nodes' command lines and (without the dashes) the sentinels'
        // configuration files.
        let tls_args = |port: u16| -> Vec<String> {
            let Some(dir) = &certs else {
                return Vec::new();
            };
            let file = |name: &str| dir.path.join(name).display().to_string();
            vec![
                "--tls-port".into(),
                port.to_string(),
                "--tls-replication".into(),
                "yes".into(),
                "--tls-cert-file".into(),
                file("server.pem"),
                "--tls-key-file".into(),
                file("server.key"),
                // Replication and the sentinels connect out with the client certificate.
                "--tls-client-cert-file".into(),
                file("client.pem"),
                "--tls-client-key-file".into(),
                file("client.key"),
                "--tls-ca-cert-file".into(),
                file("ca.pem"),
                "--tls-auth-clients".into(),
                "optional".into(),
            ]
        };
        let start_node = |replica_of: Option<u16>| -> io::Result<(RedisServer, u16)> {
            let tls_port = free_port()?;
            // No delay before a full sync (Redis 7 waits 5 s by default for more replicas to join).
            let mut args: Vec<String> = vec!["--repl-diskless-sync-delay".into(), "0".into()];
            args.extend(extra.iter().map(|a| a.to_string()));
            args.extend(tls_args(tls_port));
            if let Some(master) = replica_of {
                args.extend(["--replicaof".into(), "127.0.0.1".into(), master.to_string()]);
            }
            Ok((RedisServer::try_start_with_args(args, None)?, tls_port))
        };
        let (master, master_tls_port) = start_node(None)?;
        let master_port = master.port();
        let mut ports = vec![(master_port, master_tls_port)];
        // Replicas and sentinels reach the master where it speaks their protocol.
        let announced = if tls { master_tls_port } else { master_port };
        let mut nodes = vec![master];
        for _ in 0..replicas {
            let (node, tls_port) = start_node(Some(announced))?;
            ports.push((node.port(), tls_port));
            nodes.push(node);
        }
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let tls_port = if tls { Some(free_port()?) } else { None };
            let config: String = tls_port
                .map(|port| {
                    tls_args(port)
                        .chunks(2)
                        .map(|pair| format!("{} {}\n", pair[0].trim_start_matches('-'), pair[1]))
                        .collect()
                })
                .unwrap_or_default();
            sentinels.push(SentinelProcess::start(announced, tls_port, &config)?);
        }
        let deployment = RedisSentinels {
            nodes,
            sentinels,
            tls: certs.map(|dir| (dir, ports)),
        };
        deployment.wait_settled(master_port)?;
        Ok(deployment)
    }

    /// `redis+sentinel://` naming the three sentinels and [`MASTER_NAME`]; with
    /// [`start_tls`](Self::start_tls), `rediss+sentinel://` and the sentinels' TLS ports.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.tls_port.unwrap_or(s.port)))
            .collect();
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// A file of a TLS deployment's certificates: `ca.pem`, `client.pem`, `client.key`.
    pub fn tls_file(&self, name: &str) -> Option<std::path::PathBuf> {
        self.tls.as_ref().map(|(dir, _)| dir.path.join(name))
    }

    /// The plain port of the node a sentinel names by `port` (its TLS port, with TLS).
    fn plain(&self, port: u16) -> u16 {
        self.tls
            .as_ref()
            .and_then(|(_, ports)| ports.iter().find(|(_, tls)| *tls == port))
            .map_or(port, |(plain, _)| *plain)
    }

    /// The port replicas and sentinels know the node on plain `port` by.
    fn announced(&self, port: u16) -> u16 {
        self.tls
            .as_ref()
            .and_then(|(_, ports)| ports.iter().find(|(plain, _)| *plain == port))
            .map_or(port, |(_, tls)| *tls)
    }

    /// The data nodes' ports; the first one started as the master.
    pub fn node_ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The data node on `port`.
    ///
    /// # Panics
    /// If no data node listens there.
    pub fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|node| node.port() == port)
            .unwrap_or_else(|| panic!("no data node on port {port}"))
    }

    /// The sentinel process on `port` (for SIGSTOP / SIGCONT).
    pub fn sentinel_pid(&self, index: usize) -> Option<u32> {
        self.sentinels[index].child.as_ref().map(Child::id)
    }

    /// Kills sentinel `index` (SIGKILL).
    pub fn kill_sentinel(&mut self, index: usize) {
        if let Some(mut child) = self.sentinels[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The master's (plain) port as sentinel `index` names it (`None`: no answer).
    pub fn master_port_by(&self, index: usize) -> Option<u16> {
        let out = cli(
            self.sentinels[index].port,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
        )
        .ok()?;
        Some(self.plain(out.lines().nth(1)?.trim().parse().ok()?))
    }

    /// The master's port, as the first sentinel that answers names it.
    ///
    /// # Panics
    /// If no sentinel answers.
    pub fn master_port(&self) -> u16 {
        (0..self.sentinels.len())
            .find_map(|i| self.master_port_by(i))
            .expect("no sentinel names a master")
    }

    /// Runs `redis-cli` with `args` against the data node on `port` (trimmed output).
    pub fn node_cli(&self, port: u16, args: &[&str]) -> io::Result<String> {
        cli(port, args)
    }

    /// `SENTINEL FAILOVER` through the first sentinel that accepts it, then waits until every running
    /// sentinel names a new master that says `ROLE` master, and every other running data node replicates
    /// from it with its link up. Returns the new master's port.
    pub fn failover(&self) -> io::Result<u16> {
        let old = self.master_port();
        let deadline = Instant::now() + SENTINEL_TIMEOUT;
        // A sentinel refuses (`-INPROG`, `-NOGOODSLAVE`) while an earlier failover or a replica's sync
        // is still going on: ask again until one accepts.
        loop {
            let accepted = (0..self.sentinels.len()).any(|i| {
                self.sentinels[i].child.is_some()
                    && cli(
                        self.sentinels[i].port,
                        &["SENTINEL", "FAILOVER", MASTER_NAME],
                    )
                    .is_ok_and(|out| out == "OK")
            });
            if accepted {
                break;
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no sentinel accepted SENTINEL FAILOVER",
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
        loop {
            let named: Vec<Option<u16>> = (0..self.sentinels.len())
                .filter(|&i| self.sentinels[i].child.is_some())
                .map(|i| self.master_port_by(i))
                .collect();
            if let Some(Some(new)) = named.first().copied() {
                if new != old && named.iter().all(|n| *n == Some(new)) && self.settled(new) {
                    return Ok(new);
                }
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the failover from {old} did not settle; sentinels name {named:?}"),
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Freezes the master (SIGSTOP) until the sentinels have failed over to its replica and every
    /// running sentinel names the new master, which says `ROLE` master; then thaws the old one (SIGCONT),
    /// which comes back as a second master until a sentinel converts it, and waits for that. Returns the
    /// new master's port.
    pub fn freeze_master_until_failed_over(&self) -> io::Result<u16> {
        let old = self.master_port();
        let pid = self
            .nodes
            .iter()
            .find(|n| n.port() == old)
            .and_then(RedisServer::pid)
            .ok_or_else(|| io::Error::other("the master is not running"))?;
        let signal = |name: &str| -> io::Result<()> {
            let status = Command::new("kill")
                .arg(format!("-{name}"))
                .arg(pid.to_string())
                .status()?;
            if status.success() {
                Ok(())
            } else {
                Err(io::Error::other(format!("kill -{name} {pid} failed")))
            }
        };
        signal("STOP")?;
        let deadline = Instant::now() + SENTINEL_TIMEOUT;
        let promoted = loop {
            let named: Vec<Option<u16>> = (0..self.sentinels.len())
                .filter(|&i| self.sentinels[i].child.is_some())
                .map(|i| self.master_port_by(i))
                .collect();
            if let Some(Some(new)) = named.first().copied() {
                let is_master = cli(new, &["ROLE"]).is_ok_and(|r| r.starts_with("master"));
                if new != old && is_master && named.iter().all(|n| *n == Some(new)) {
                    break Ok(new);
                }
            }
            if Instant::now() >= deadline {
                break Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no failover from the frozen {old}; sentinels name {named:?}"),
                ));
            }
            thread::sleep(Duration::from_millis(50));
        };
        signal("CONT")?;
        let new = promoted?;
        while !self.settled(new) {
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the thawed {old} did not become a replica of {new}"),
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(new)
    }

    /// Whether the node on `master` says `ROLE` master and every other running data node is its replica
    /// with the link up.
    fn settled(&self, master: u16) -> bool {
        let role = |port: u16| cli(port, &["ROLE"]).ok();
        if !role(master).is_some_and(|r| r.starts_with("master")) {
            return false;
        }
        self.nodes
            .iter()
            .filter(|n| n.port() != master)
            .all(|node| {
                cli(node.port(), &["INFO", "replication"]).is_ok_and(|info| {
                    info.contains(&format!("master_port:{}", self.announced(master)))
                        && info.contains("master_link_status:up")
                })
            })
    }

    /// Waits until the master's replicas have synced, and every sentinel names `master`, knows every
    /// replica and the other two sentinels.
    fn wait_settled(&self, master: u16) -> io::Result<()> {
        let deadline = Instant::now() + SENTINEL_TIMEOUT;
        let replicas = self.nodes.len() - 1;
        loop {
            let sentinels_ready = self.sentinels.iter().all(|s| {
                let count = |what: &str| {
                    cli(s.port, &["SENTINEL", what, MASTER_NAME])
                        .map(|out| out.lines().filter(|l| l.trim() == "name").count())
                        .unwrap_or(0)
                };
                count("REPLICAS") == replicas && count("SENTINELS") == 2
            });
            if sentinels_ready && self.settled(master) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let logs: Vec<String> = self.sentinels.iter().map(SentinelProcess::log).collect();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the sentinels did not settle; logs:\n{}",
                        logs.join("\n---\n")
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl SentinelProcess {
    fn start(
        master_port: u16,
        tls_port: Option<u16>,
        tls_config: &str,
    ) -> io::Result<SentinelProcess> {
        let dir = TempDir::new()?;
        let port = free_port()?;
        let config = dir.path.join("sentinel.conf");
        fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                 sentinel failover-timeout {MASTER_NAME} 5000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n{tls_config}",
                dir = dir.path.display()
            ),
        )?;
        let log = fs::File::create(dir.path.join("sentinel.log"))?;
        let child = Command::new(crate::default_binary())
            .arg(&config)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .current_dir(&dir.path)
            .spawn()?;
        let process = SentinelProcess {
            port,
            tls_port,
            dir,
            child: Some(child),
        };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while !cli(port, &["PING"]).is_ok_and(|out| out == "PONG") {
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("sentinel on {port} did not answer; log:\n{}", process.log()),
                ));
            }
            thread::sleep(Duration::from_millis(10));
        }
        Ok(process)
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path.join("sentinel.log")).unwrap_or_default()
    }
}

/// `redis-cli -p port args...`, trimmed; an error if it cannot run, exits non-zero, or takes over 5 s (a
/// stopped process never answers, and `redis-cli` would wait for good).
fn cli(port: u16, args: &[&str]) -> io::Result<String> {
    let output = Command::new("timeout")
        .arg("5")
        .arg(cli_binary())
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    if !output.status.success() {
        return Err(io::Error::other(
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
