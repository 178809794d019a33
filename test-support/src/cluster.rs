//! A Redis Cluster on loopback: 3 masters and 3 replicas, each a [`RedisServer`] on free ports, made
//! with `redis-cli --cluster create`. Helpers migrate a slot, fail a master over and restart a node.
//!
//! Cluster commands go through `redis-cli` (`$REDIS_CLI_BIN`, else `redis-cli` on `PATH`).

use std::io;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use crate::tls::ClientCerts;
use crate::{free_port, RedisServer, TempDir};

/// How long [`RedisCluster::start`] and the failover helpers wait for the cluster to settle.
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

/// Environment variable naming the `redis-cli` binary.
pub const REDIS_CLI_BIN_ENV: &str = "REDIS_CLI_BIN";

/// One `CLUSTER NODES` line: id, port, flags, master id, slots.
type NodeLine = (String, u16, String, String, String);

/// A running cluster; every node is killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    password: Option<String>,
    /// With TLS: the certificates' directory and each node's TLS port (the plain ports stay open for
    /// this crate's own commands).
    tls: Option<(TempDir, Vec<u16>)>,
}

pub(crate) fn cli_binary() -> String {
    std::env::var(REDIS_CLI_BIN_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-cli".into())
}

impl RedisCluster {
    /// Starts 3 masters + 3 replicas and waits until every node says `cluster_state:ok`.
    ///
    /// # Panics
    /// If a node cannot start or the cluster does not form within [`CLUSTER_TIMEOUT`].
    pub fn start() -> RedisCluster {
        Self::try_start(None, None).unwrap_or_else(|e| panic!("could not start a cluster: {e}"))
    }

    /// One cluster for the whole test process, started on first use: for test files whose tests share it
    /// (each with its own keys) instead of paying a cluster start each. Shared means read-only here: no
    /// killing, restarting or migrating (that takes `&mut` or a cluster of one's own).
    ///
    /// A static is never dropped, so the nodes are not killed by `Drop`: a reaper (`sh`) waits on a pipe
    /// whose only writer is this process, and when it reads end-of-file (this process exited, however)
    /// kills the nodes and removes their directories.
    ///
    /// # Panics
    /// If the cluster does not start (a later call tries again), or `sh` cannot be spawned.
    pub fn shared() -> &'static RedisCluster {
        static SHARED: OnceLock<(RedisCluster, Child)> = OnceLock::new();
        &SHARED
            .get_or_init(|| {
                let cluster = Self::start();
                let mut script = String::from("read _; kill -9");
                for node in &cluster.nodes {
                    script.push_str(&format!(" {}", node.pid().expect("a running node")));
                }
                script.push_str("; rm -rf");
                for node in &cluster.nodes {
                    script.push_str(&format!(" '{}'", node.dir().display()));
                }
                let reaper = Command::new("sh")
                    .args(["-c", &script])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap_or_else(|e| panic!("cannot spawn the cluster's reaper: {e}"));
                (cluster, reaper)
            })
            .0
    }

    /// Like [`start`](Self::start), every node with `requirepass` and `masterauth` set to `password`.
    pub fn start_with_password(password: &str) -> RedisCluster {
        Self::try_start(Some(password.to_owned()), None)
            .unwrap_or_else(|e| panic!("could not start a cluster: {e}"))
    }

    /// Like [`start`](Self::start), with TLS: every node also listens on a TLS port, and the cluster
    /// bus and replication run over TLS, with [`tls::certificates`](crate::tls::certificates) (clients
    /// may present a certificate; they need not). [`url`](Self::url) names the TLS ports
    /// (`rediss+cluster://`); trust [`ca_cert`](Self::ca_cert). `None` (skipped) without `openssl`.
    pub fn start_tls() -> Option<RedisCluster> {
        Self::start_tls_with(ClientCerts::Optional)
    }

    /// Like [`start_tls`](Self::start_tls), the TLS ports asking for client certificates as
    /// `client_certs` says ([`ClientCerts::Required`]: mutual TLS; present
    /// [`tls_file`](Self::tls_file)`("client.pem")` and `"client.key"`).
    pub fn start_tls_with(client_certs: ClientCerts) -> Option<RedisCluster> {
        if !crate::tls::openssl_available() {
            return None;
        }
        Some(
            Self::try_start(None, Some(client_certs))
                .unwrap_or_else(|e| panic!("could not start a TLS cluster: {e}")),
        )
    }

    /// A file of a TLS cluster's certificates: `ca.pem`, `client.pem`, `client.key` (see
    /// [`tls::certificates`](crate::tls::certificates)).
    pub fn tls_file(&self, name: &str) -> Option<std::path::PathBuf> {
        self.tls.as_ref().map(|(dir, _)| dir.path.join(name))
    }

    /// The certificate authority of a TLS cluster.
    pub fn ca_cert(&self) -> Option<std::path::PathBuf> {
        self.tls.as_ref().map(|(dir, _)| dir.path.join("ca.pem"))
    }

    fn try_start(
        password: Option<String>,
        client_certs: Option<ClientCerts>,
    ) -> io::Result<RedisCluster> {
        let mut tls = if client_certs.is_some() {
            let dir = TempDir::new()?;
            crate::tls::certificates(&dir.path);
            Some((dir, Vec::new()))
        } else {
            None
        };
        let mut nodes = Vec::new();
        for _ in 0..6 {
            nodes.push(Self::start_node(password.clone(), client_certs, &mut tls)?);
        }
        let cluster = RedisCluster {
            nodes,
            password,
            tls,
        };
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(
            cluster
                .nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port())),
        );
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        let out = cluster.cli_raw(&args)?;
        if !out.contains("[OK] All 16384 slots covered") {
            return Err(io::Error::other(format!("cluster create failed:\n{out}")));
        }
        cluster.wait_ok()?;
        Ok(cluster)
    }

    /// Starts one node on free ports (its own, its bus's, and with TLS its TLS port). A port found free
    /// can be taken before the server binds it (by another test's server or an outgoing connection):
    /// then it tries again with other ports.
    fn start_node(
        password: Option<String>,
        client_certs: Option<ClientCerts>,
        tls: &mut Option<(TempDir, Vec<u16>)>,
    ) -> io::Result<RedisServer> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            // The bus port must be free too; port + 10000 may be out of range, so pick it.
            let bus = free_port()?;
            let extra = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--cluster-port",
                &bus.to_string(),
                "--cluster-require-full-coverage",
                "no",
                // Replicas sync straight away, without an RDB file.
                "--repl-diskless-sync",
                "yes",
                "--repl-diskless-sync-delay",
                "0",
            ]
            .map(String::from)
            .to_vec();
            let mut extra = extra;
            let mut tls_port = None;
            if let Some((dir, _)) = tls.as_ref() {
                let port = free_port()?;
                tls_port = Some(port);
                let file = |name: &str| dir.path.join(name).display().to_string();
                extra.extend([
                    "--tls-port".into(),
                    port.to_string(),
                    "--tls-cluster".into(),
                    "yes".into(),
                    "--tls-replication".into(),
                    "yes".into(),
                    "--tls-cert-file".into(),
                    file("server.pem"),
                    "--tls-key-file".into(),
                    file("server.key"),
                    // The bus and replication connect out with the client certificate.
                    "--tls-client-cert-file".into(),
                    file("client.pem"),
                    "--tls-client-key-file".into(),
                    file("client.key"),
                    "--tls-ca-cert-file".into(),
                    file("ca.pem"),
                    "--tls-auth-clients".into(),
                    client_certs
                        .unwrap_or(ClientCerts::Optional)
                        .redis_value()
                        .into(),
                ]);
            }
            match RedisServer::try_start_with_args(extra, password.clone()) {
                Ok(node) => {
                    if let (Some((_, ports)), Some(port)) = (tls.as_mut(), tls_port) {
                        ports.push(port);
                    }
                    return Ok(node);
                }
                Err(error) if error.kind() == io::ErrorKind::AddrInUse && attempt < 5 => {}
                Err(error) => return Err(error),
            }
        }
    }

    /// `redis+cluster://[:password@]127.0.0.1:p1,...` with every node as a seed; with TLS,
    /// `rediss+cluster://` and the nodes' TLS ports.
    pub fn url(&self) -> String {
        let auth = self
            .password
            .as_ref()
            .map(|p| format!(":{p}@"))
            .unwrap_or_default();
        let (scheme, ports) = match &self.tls {
            Some((_, ports)) => ("rediss+cluster", ports.clone()),
            None => (
                "redis+cluster",
                self.nodes.iter().map(|n| n.port()).collect(),
            ),
        };
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("{scheme}://{auth}{}", hosts.join(","))
    }

    /// The nodes, in creation order (the first three start as masters).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// One node, to kill or restart it.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    fn cli_raw(&self, args: &[String]) -> io::Result<String> {
        let mut cmd = Command::new(cli_binary());
        if let Some(password) = &self.password {
            cmd.args(["-a", password, "--no-auth-warning"]);
        }
        let out = cmd.args(args).output()?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }

    /// Runs one command with `redis-cli` on the node at `port` and returns its output (trimmed).
    pub fn cli(&self, port: u16, args: &[&str]) -> io::Result<String> {
        let mut all: Vec<String> = vec!["-p".into(), port.to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        Ok(self.cli_raw(&all)?.trim().to_owned())
    }

    /// Waits until every running node says `cluster_state:ok` and sees all 16384 slots, and every
    /// running replica's link to its master is up (a replica that never synced cannot be promoted).
    pub fn wait_ok(&self) -> io::Result<()> {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let mut ok = true;
            for node in &self.nodes {
                if !node.ping() {
                    continue;
                }
                let info = self.cli(node.port(), &["CLUSTER", "INFO"])?;
                if !info.contains("cluster_state:ok") || !info.contains("cluster_slots_ok:16384") {
                    ok = false;
                }
                let replication = self.cli(node.port(), &["INFO", "replication"])?;
                if replication.contains("role:slave")
                    && !replication.contains("master_link_status:up")
                {
                    ok = false;
                }
            }
            if ok && !self.views_agree()? {
                ok = false;
            }
            if ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("cluster not ok within {CLUSTER_TIMEOUT:?}"),
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether every running node sees every running node with the role and master that node gives
    /// itself. Gossip spreads a replica's attachment late: until it has, a master looks replica-less
    /// to the others, and they would not vote its replica in.
    fn views_agree(&self) -> io::Result<bool> {
        let running: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| n.ping())
            .map(|n| n.port())
            .collect();
        let mut views = Vec::new();
        for &port in &running {
            views.push((port, self.topology_at(port)?));
        }
        let role = |flags: &str| flags.contains("slave");
        for (port, view) in &views {
            let Some(own) = view.iter().find(|l| l.2.contains("myself")) else {
                return Ok(false);
            };
            for (_, other) in &views {
                let seen = other.iter().find(|l| l.1 == *port);
                if !matches!(seen, Some(l) if role(&l.2) == role(&own.2) && l.3 == own.3) {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// `CLUSTER NODES` lines as seen by a running node: `(id, port, flags, master id, slots)`.
    fn topology(&self) -> io::Result<Vec<NodeLine>> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.ping())
            .ok_or_else(|| io::Error::other("no node runs"))?;
        self.topology_at(node.port())
    }

    /// `CLUSTER NODES` lines as the node at `port` sees them.
    fn topology_at(&self, port: u16) -> io::Result<Vec<NodeLine>> {
        let text = self.cli(port, &["CLUSTER", "NODES"])?;
        Ok(text
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let port = f.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
                Some((
                    f[0].to_owned(),
                    port,
                    f.get(2)?.to_string(),
                    f.get(3)?.to_string(),
                    f.get(8..).map(|s| s.join(" ")).unwrap_or_default(),
                ))
            })
            .collect())
    }

    fn id_of(&self, port: u16) -> io::Result<String> {
        self.cli(port, &["CLUSTER", "MYID"])
    }

    /// The index of the node that is master of `slot` now.
    pub fn master_of(&self, slot: u16) -> usize {
        let topology = self.topology().expect("CLUSTER NODES");
        for (_, port, flags, _, slots) in topology {
            if !flags.contains("master") || flags.contains("fail") {
                continue;
            }
            let serves = slots.split_whitespace().any(|range| {
                let mut ends = range.split('-');
                let a = ends.next().and_then(|s| s.parse::<u16>().ok());
                let b = ends.next().and_then(|s| s.parse::<u16>().ok()).or(a);
                matches!((a, b), (Some(a), Some(b)) if (a..=b).contains(&slot))
            });
            if serves {
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port() == port)
                    .expect("a node of ours");
            }
        }
        panic!("no master serves slot {slot}");
    }

    /// Moves `slot` from its master to the master at index `to`, the way `redis-cli --cluster reshard`
    /// does: `SETSLOT IMPORTING` / `MIGRATING`, `MIGRATE` the keys in batches, then `SETSLOT NODE` on
    /// both. Clients see `ASK` during and `MOVED` after.
    pub fn migrate_slot(&self, slot: u16, to: usize) -> io::Result<()> {
        let from = self.master_of(slot);
        if from == to {
            return Ok(());
        }
        let (src, dst) = (self.nodes[from].port(), self.nodes[to].port());
        let (src_id, dst_id) = (self.id_of(src)?, self.id_of(dst)?);
        let s = slot.to_string();
        self.cli(dst, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id])?;
        self.cli(src, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id])?;
        for _ in 0..100_000 {
            let keys = self.cli(src, &["CLUSTER", "GETKEYSINSLOT", &s, "10"])?;
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let d = dst.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &d, "", "0", "5000"];
            if let Some(password) = &self.password {
                args.extend(["AUTH", password]);
            }
            args.push("KEYS");
            args.extend(keys.iter().copied());
            let out = self.cli(src, &args)?;
            if !out.contains("OK") && !out.contains("NOKEY") {
                return Err(io::Error::other(format!("MIGRATE failed: {out}")));
            }
        }
        self.cli(dst, &["CLUSTER", "SETSLOT", &s, "NODE", &dst_id])?;
        self.cli(src, &["CLUSTER", "SETSLOT", &s, "NODE", &dst_id])?;
        for node in &self.nodes {
            if node.port() != src && node.port() != dst && node.ping() {
                let _ = self.cli(node.port(), &["CLUSTER", "SETSLOT", &s, "NODE", &dst_id]);
            }
        }
        Ok(())
    }

    /// Waits until every replica of the master at `index` has acknowledged all it has written so far.
    /// (`WAIT` cannot do this from `redis-cli`: it waits for the calling connection's own writes, and
    /// a fresh connection has none, so it returns at once.)
    pub fn wait_replicated(&self, index: usize) -> io::Result<()> {
        let port = self.nodes[index].port();
        let field = |line: &str, key: &str| -> Option<u64> {
            line.split([',', ':'])
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        };
        let info = self.cli(port, &["INFO", "replication"])?;
        let written = info
            .lines()
            .find_map(|l| {
                l.strip_prefix("master_repl_offset:")?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .ok_or_else(|| io::Error::other(format!("{port} is no master: {info}")))?;
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let info = self.cli(port, &["INFO", "replication"])?;
            let acked: Vec<u64> = info
                .lines()
                .filter(|l| l.starts_with("slave"))
                .map(|l| {
                    field(l, "offset")
                        .filter(|_| l.contains("state=online"))
                        .unwrap_or(0)
                })
                .collect();
            if !acked.is_empty() && acked.iter().all(|&o| o >= written && o > 0) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("replicas of {port} at {acked:?}, not {written}, within {CLUSTER_TIMEOUT:?}"),
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the master at `index` (SIGKILL) and waits until one of its replicas is master and the
    /// cluster is ok again. Returns the index of the promoted replica.
    pub fn fail_master(&mut self, index: usize) -> io::Result<usize> {
        let port = self.nodes[index].port();
        let id = self.id_of(port)?;
        let replicas: Vec<u16> = self
            .topology()?
            .into_iter()
            .filter(|(_, _, flags, master, _)| flags.contains("slave") && *master == id)
            .map(|(_, p, ..)| p)
            .collect();
        if replicas.is_empty() {
            return Err(io::Error::other(format!("{port} has no replica")));
        }
        self.nodes[index].kill();
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let promoted = self.topology()?.into_iter().find(|(_, p, flags, _, _)| {
                replicas.contains(p) && flags.contains("master") && !flags.contains("fail")
            });
            if let Some((_, p, ..)) = promoted {
                self.wait_ok()?;
                return Ok(self.nodes.iter().position(|n| n.port() == p).expect("ours"));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no replica of {port} ({replicas:?}) promoted within {CLUSTER_TIMEOUT:?}: {:?}\nreplica log:\n{}",
                        self.topology(),
                        self.nodes.iter().filter(|n| replicas.contains(&n.port())).map(|n| n.log()).collect::<String>()
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Restarts the node at `index` on its port and data directory (it rejoins with its `nodes.conf`,
    /// a failed-over master as a replica) and waits until the cluster is ok.
    pub fn restart_node(&mut self, index: usize) -> io::Result<()> {
        self.nodes[index].restart();
        self.wait_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_forms_migrates_a_slot_and_fails_over() {
        let mut cluster = RedisCluster::start();
        assert_eq!(cluster.nodes().len(), 6);
        // Slot 12182 is "foo"'s.
        let port_of = |c: &RedisCluster, slot| c.nodes()[c.master_of(slot)].port();
        let p = port_of(&cluster, 12182);
        assert_eq!(cluster.cli(p, &["SET", "foo", "bar"]).unwrap(), "OK");
        let from = cluster.master_of(12182);
        let to = (0..6)
            .find(|&i| i != from && cluster.nodes()[i].port() != p && i < 3)
            .unwrap();
        cluster.migrate_slot(12182, to).unwrap();
        assert_eq!(cluster.master_of(12182), to);
        assert_eq!(
            cluster
                .cli(cluster.nodes()[to].port(), &["GET", "foo"])
                .unwrap(),
            "bar"
        );
        // Replication is asynchronous and the failover a SIGKILL: the replica must have the key first.
        cluster.wait_replicated(to).unwrap();
        let promoted = cluster.fail_master(to).unwrap();
        assert_eq!(cluster.master_of(12182), promoted);
        assert_eq!(
            cluster
                .cli(cluster.nodes()[promoted].port(), &["GET", "foo"])
                .unwrap(),
            "bar"
        );
        cluster.restart_node(to).unwrap();
    }

    #[test]
    fn a_cluster_with_a_password_refuses_anonymous_clients() {
        let cluster = RedisCluster::start_with_password("s3cret");
        assert!(cluster
            .url()
            .starts_with("redis+cluster://:s3cret@127.0.0.1:"));
        let port = cluster.nodes()[0].port();
        let out = Command::new(cli_binary())
            .args(["-p", &port.to_string(), "PING"])
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).contains("NOAUTH"));
        assert_eq!(cluster.cli(port, &["PING"]).unwrap(), "PONG");
    }
}
