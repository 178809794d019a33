//! The base member id of this process, and the logical member ids derived from it.
//!
//! Every listener of a process runs `concurrency` logical members named `{base}-m0 .. {base}-m{n-1}`
//! ([`member_ids`]). The base is resolved in this order ([`resolve_base_member_id`]):
//!
//! 1. an explicit override (the macro's `id = "..."` or the builder's), used as given (sanitized);
//! 2. the pod IP from the environment: `POD_IP`, `MY_POD_IP`, `KUBERNETES_POD_IP`, `STATUS_POD_IP`
//!    ([`POD_IP_ENV_VARS`], the names Kubernetes manifests commonly give the downward-API `status.podIP`);
//! 3. a local non-loopback IP address of this host ([`local_ip`]), plus the process id;
//! 4. `HOSTNAME`, plus the process id;
//! 5. `member-{pid}-{random}` as a last resort.
//!
//! Every id is sanitized to `[A-Za-z0-9._-]` ([`sanitize`]), so it is safe in Redis consumer names, logs
//! and heartbeat JSON.
//!
//! # Static membership
//!
//! A pod IP changes on every restart, so a restarted pod is a new member and its shards move twice in a
//! rolling deploy. With static membership ([`stable_base_member_id`]) the base is what survives a restart:
//! the override, else `POD_NAME` (the downward API's `metadata.name`), else `HOSTNAME` (a StatefulSet
//! pod's name), never with the process id; a graceful leave then announces the restart, and the group
//! keeps the member's shards for it for one session timeout.
//!
//! # Why the process id is appended only sometimes
//!
//! A pod IP names exactly one pod, so two members with the same pod-IP-based id are the same pod, and a
//! restarted pod rejoining under its old id is what the protocol expects. A host address or host name does
//! not name one process: two processes on one machine (a developer laptop, a VM running several copies)
//! resolve the same value. Without the process id they would heartbeat as the *same* member ids, each
//! believing it owns the other's shards, which defeats fencing. So ids from a local address or `HOSTNAME`
//! get `-p{pid}`; pod-IP ids and explicit overrides do not.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// Environment variables read for the pod IP, in order of preference.
pub const POD_IP_ENV_VARS: [&str; 4] =
    ["POD_IP", "MY_POD_IP", "KUBERNETES_POD_IP", "STATUS_POD_IP"];

/// Environment variable read for the host name when no pod IP or local address is found.
pub const HOSTNAME_ENV_VAR: &str = "HOSTNAME";

/// Environment variables read for a name that survives restarts under static membership, in order.
pub const STABLE_ENV_VARS: [&str; 2] = ["POD_NAME", HOSTNAME_ENV_VAR];

/// Where a base member id came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentitySource {
    /// An explicit override from configuration.
    Override,
    /// The named pod-IP environment variable.
    PodIp(&'static str),
    /// A local non-loopback address of this host (process id appended).
    LocalAddress(IpAddr),
    /// The `HOSTNAME` environment variable (process id appended).
    Hostname,
    /// The named variable of [`STABLE_ENV_VARS`], as given: static membership.
    PodName(&'static str),
    /// Nothing usable was found: process id plus a random suffix.
    Fallback,
}

/// A resolved base member id and its origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseMemberId {
    /// The sanitized base id, e.g. `10.1.2.3` or `build-host-p4711`.
    pub id: String,
    /// Where it came from.
    pub source: IdentitySource,
}

impl BaseMemberId {
    /// The logical member ids `{id}-m0 .. {id}-m{concurrency-1}`.
    pub fn member_ids(&self, concurrency: usize) -> Vec<String> {
        member_ids(&self.id, concurrency)
    }
}

impl fmt::Display for BaseMemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

/// The base member id of this process, from the real environment and network configuration.
///
/// `override_id` (from the macro's `id` argument or the builder) wins when given and non-empty.
pub fn base_member_id(override_id: Option<&str>) -> BaseMemberId {
    resolve_base_member_id(
        override_id,
        |name| std::env::var(name).ok(),
        local_ip,
        std::process::id(),
    )
}

/// The base member id from injected sources: `env` looks up an environment variable, `local_ip` finds a
/// local address, `pid` is the process id. See the [module docs](self) for the order.
pub fn resolve_base_member_id(
    override_id: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
    local_ip: impl FnOnce() -> Option<IpAddr>,
    pid: u32,
) -> BaseMemberId {
    if let Some(id) = override_id.and_then(usable) {
        return BaseMemberId {
            id,
            source: IdentitySource::Override,
        };
    }
    for name in POD_IP_ENV_VARS {
        if let Some(id) = env(name).as_deref().and_then(usable) {
            return BaseMemberId {
                id,
                source: IdentitySource::PodIp(name),
            };
        }
    }
    if let Some(ip) = local_ip().filter(|ip| is_usable_ip(*ip)) {
        return BaseMemberId {
            id: format!("{}-p{pid}", sanitize(&ip.to_string())),
            source: IdentitySource::LocalAddress(ip),
        };
    }
    if let Some(host) = env(HOSTNAME_ENV_VAR).as_deref().and_then(usable) {
        return BaseMemberId {
            id: format!("{host}-p{pid}"),
            source: IdentitySource::Hostname,
        };
    }
    BaseMemberId {
        id: format!("member-p{pid}-{:08x}", crate::util::random_u64() as u32),
        source: IdentitySource::Fallback,
    }
}

/// The base member id under static membership: one that names the same member after a restart, from
/// `override_id`, else the first usable variable of [`STABLE_ENV_VARS`] (no process id). `None` when
/// there is none: a pod IP, a local address or a random fallback would not survive the restart.
pub fn stable_base_member_id(
    override_id: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Option<BaseMemberId> {
    if let Some(id) = override_id.and_then(usable) {
        return Some(BaseMemberId {
            id,
            source: IdentitySource::Override,
        });
    }
    STABLE_ENV_VARS.into_iter().find_map(|name| {
        env(name)
            .as_deref()
            .and_then(usable)
            .map(|id| BaseMemberId {
                id,
                source: IdentitySource::PodName(name),
            })
    })
}

/// The logical member ids `{base}-m0 .. {base}-m{concurrency-1}`.
pub fn member_ids(base: &str, concurrency: usize) -> Vec<String> {
    (0..concurrency).map(|i| format!("{base}-m{i}")).collect()
}

/// Replace every character outside `[A-Za-z0-9._-]` by `-`, after trimming surrounding whitespace.
///
/// IPv6 addresses keep their shape (`fe80::1` becomes `fe80--1`).
pub fn sanitize(raw: &str) -> String {
    raw.trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// A local non-loopback IP address of this host, if there is one.
///
/// Connects a UDP socket towards a TEST-NET address (RFC 5737 / RFC 3849) and reads the local address
/// the kernel picked for that route. Connecting a UDP socket sends no packet; it only selects a route.
/// Returns `None` when there is no route, or the address is loopback or unspecified.
pub fn local_ip() -> Option<IpAddr> {
    let probes: [(SocketAddr, SocketAddr); 2] = [
        (
            (Ipv4Addr::UNSPECIFIED, 0).into(),
            (Ipv4Addr::new(192, 0, 2, 1), 9).into(),
        ),
        (
            (Ipv6Addr::UNSPECIFIED, 0).into(),
            (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1), 9).into(),
        ),
    ];
    probes.into_iter().find_map(|(bind, target)| {
        let socket = UdpSocket::bind(bind).ok()?;
        socket.connect(target).ok()?;
        let ip = socket.local_addr().ok()?.ip();
        is_usable_ip(ip).then_some(ip)
    })
}

fn is_usable_ip(ip: IpAddr) -> bool {
    !ip.is_loopback() && !ip.is_unspecified()
}

/// The sanitized value, if it still names something (at least one alphanumeric character).
fn usable(raw: &str) -> Option<String> {
    let id = sanitize(raw);
    id.chars().any(|c| c.is_ascii_alphanumeric()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn lan() -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(192, 168, 1, 20)))
    }

    #[test]
    fn static_membership_takes_a_name_that_survives_restarts_and_never_the_pid_or_the_ip() {
        let stable = |o, vars| stable_base_member_id(o, env(vars));
        let id = stable(
            None,
            &[
                ("POD_IP", "10.0.0.1"),
                ("POD_NAME", "orders-2"),
                ("HOSTNAME", "h"),
            ],
        )
        .expect("a pod name");
        assert_eq!(id.id, "orders-2");
        assert_eq!(id.source, IdentitySource::PodName("POD_NAME"));
        let id = stable(None, &[("POD_IP", "10.0.0.1"), ("HOSTNAME", "orders-0")]).expect("host");
        assert_eq!(
            id.id, "orders-0",
            "no process id: it must survive the restart"
        );
        assert_eq!(id.source, IdentitySource::PodName("HOSTNAME"));
        assert_eq!(
            stable(Some("billing-1"), &[("POD_NAME", "p")]).map(|b| b.source),
            Some(IdentitySource::Override)
        );
        assert_eq!(
            stable(None, &[("POD_IP", "10.0.0.1")]),
            None,
            "an IP changes"
        );
        assert_eq!(stable(Some(" "), &[("POD_NAME", "--")]), None);
    }

    #[test]
    fn override_wins_over_everything() {
        let id = resolve_base_member_id(Some("billing-1"), env(&[("POD_IP", "10.0.0.1")]), lan, 7);
        assert_eq!(id.id, "billing-1");
        assert_eq!(id.source, IdentitySource::Override);
    }

    #[test]
    fn blank_override_is_ignored() {
        let id = resolve_base_member_id(Some("  "), env(&[("POD_IP", "10.0.0.1")]), lan, 7);
        assert_eq!(id.id, "10.0.0.1");
    }

    #[test]
    fn pod_ip_variables_in_order_without_pid() {
        let vars = [("STATUS_POD_IP", "10.0.0.4"), ("MY_POD_IP", "10.0.0.2")];
        let id = resolve_base_member_id(None, env(&vars), lan, 7);
        assert_eq!(id.id, "10.0.0.2");
        assert_eq!(id.source, IdentitySource::PodIp("MY_POD_IP"));

        let vars = [("POD_IP", "10.0.0.1"), ("MY_POD_IP", "10.0.0.2")];
        assert_eq!(
            resolve_base_member_id(None, env(&vars), lan, 7).id,
            "10.0.0.1"
        );

        let vars = [("KUBERNETES_POD_IP", " 10.0.0.3\n")];
        assert_eq!(
            resolve_base_member_id(None, env(&vars), lan, 7).id,
            "10.0.0.3"
        );
    }

    #[test]
    fn empty_pod_ip_falls_through() {
        let vars = [("POD_IP", ""), ("MY_POD_IP", "10.0.0.2")];
        assert_eq!(
            resolve_base_member_id(None, env(&vars), lan, 7).id,
            "10.0.0.2"
        );
    }

    #[test]
    fn local_address_gets_the_pid() {
        let id = resolve_base_member_id(None, env(&[("HOSTNAME", "box")]), lan, 4711);
        assert_eq!(id.id, "192.168.1.20-p4711");
        assert!(matches!(id.source, IdentitySource::LocalAddress(_)));
    }

    #[test]
    fn loopback_local_address_is_skipped() {
        let loopback = || Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let id = resolve_base_member_id(None, env(&[("HOSTNAME", "box")]), loopback, 4711);
        assert_eq!(id.id, "box-p4711");
        assert_eq!(id.source, IdentitySource::Hostname);
    }

    #[test]
    fn two_processes_on_one_host_do_not_collide() {
        let a = resolve_base_member_id(None, env(&[]), lan, 100);
        let b = resolve_base_member_id(None, env(&[]), lan, 101);
        assert_ne!(a.id, b.id);
        let a = resolve_base_member_id(None, env(&[("HOSTNAME", "h")]), || None, 100);
        let b = resolve_base_member_id(None, env(&[("HOSTNAME", "h")]), || None, 101);
        assert_ne!(a.id, b.id);
    }

    #[test]
    fn hostname_is_sanitized() {
        let id = resolve_base_member_id(None, env(&[("HOSTNAME", "my host/1")]), || None, 9);
        assert_eq!(id.id, "my-host-1-p9");
    }

    #[test]
    fn fallback_when_nothing_is_known() {
        let id = resolve_base_member_id(None, env(&[]), || None, 9);
        assert!(id.id.starts_with("member-p9-"), "{}", id.id);
        assert_eq!(id.source, IdentitySource::Fallback);
        assert!(id.id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }

    #[test]
    fn sanitize_keeps_the_allowed_set() {
        assert_eq!(sanitize("a.B_c-9"), "a.B_c-9");
        assert_eq!(sanitize("fe80::1%eth0"), "fe80--1-eth0");
        assert_eq!(sanitize(" {x} "), "-x-");
    }

    #[test]
    fn member_ids_are_numbered_from_zero() {
        assert_eq!(
            member_ids("10.0.0.1", 3),
            ["10.0.0.1-m0", "10.0.0.1-m1", "10.0.0.1-m2"]
        );
        assert!(member_ids("x", 0).is_empty());
        let base = BaseMemberId {
            id: "b".into(),
            source: IdentitySource::Override,
        };
        assert_eq!(base.member_ids(2), ["b-m0", "b-m1"]);
        assert_eq!(base.to_string(), "b");
    }

    #[test]
    fn local_ip_is_never_loopback() {
        if let Some(ip) = local_ip() {
            assert!(!ip.is_loopback() && !ip.is_unspecified());
        }
    }
}
