//! The runtime's settings from environment variables ([`Runtime::from_env`](super::Runtime::from_env)):
//! the Redis URL and its TLS files, the base member id, the timing of groups and the shard count of
//! streams this process creates. Listener settings have their own overrides
//! ([`ListenerSpec::apply_env`](super::ListenerSpec::apply_env)).
//!
//! Every `STREAM_LISTENER_*` variable is one of these or a listener's override: a name that is neither
//! (a typo such as `STREAM_LISTENER_ON_ORDR_GROUP`) would otherwise start the members with their defaults
//! without a word, so a runtime from the environment refuses it at start, naming the nearest valid name
//! ([`unknown_variables`]).

use std::fmt;

use crate::tls::TlsFiles;

use super::spec::ENV_SETTINGS;
use super::{ListenerSpec, Runtime};

/// What every variable stream-listener reads begins with.
const PREFIX: &str = "STREAM_LISTENER_";

/// The runtime's own `STREAM_LISTENER_<SETTING>`s, after [`PREFIX`]; everything else with the prefix is a
/// listener's override.
const RUNTIME_SETTINGS: &[&str] = &[
    "MEMBER_ID",
    "STATIC_MEMBERSHIP",
    "HEARTBEAT_INTERVAL_MS",
    "SESSION_TIMEOUT_MS",
    "REBALANCE_TIMEOUT_MS",
    "DEFAULT_SHARD_COUNT",
];

/// A `STREAM_LISTENER_*` variable stream-listener does not read, with the valid name nearest to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVariable {
    /// The variable as set.
    pub name: String,
    /// The valid name with the fewest edits from it.
    pub nearest: String,
}

impl fmt::Display for UnknownVariable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (did you mean {}?)", self.name, self.nearest)
    }
}

/// Every `STREAM_LISTENER_*` name a runtime with these listeners reads: its own settings, then each
/// listener's `<prefix><SETTING>`.
pub(super) fn valid_names(specs: &[ListenerSpec]) -> Vec<String> {
    let own = RUNTIME_SETTINGS.iter().map(|s| format!("{PREFIX}{s}"));
    let listeners = specs.iter().flat_map(|spec| {
        let prefix = spec.env_prefix();
        ENV_SETTINGS.iter().map(move |s| format!("{prefix}{s}"))
    });
    own.chain(listeners).collect()
}

/// The names in `present` that are not in `valid` (and start with `STREAM_LISTENER_`), each with its
/// nearest valid name (the fewest single-character edits; the first in `valid` on a tie), in name order.
pub(super) fn unknown_variables(present: &[String], valid: &[String]) -> Vec<UnknownVariable> {
    let mut unknown: Vec<UnknownVariable> = present
        .iter()
        .filter(|name| name.starts_with(PREFIX) && !valid.contains(name))
        .filter_map(|name| {
            let nearest = valid.iter().min_by_key(|v| edit_distance(name, v))?;
            Some(UnknownVariable {
                name: name.clone(),
                nearest: nearest.clone(),
            })
        })
        .collect();
    unknown.sort_by(|a, b| a.name.cmp(&b.name));
    unknown.dedup();
    unknown
}

/// Levenshtein distance: the fewest insertions, deletions and substitutions of one character that turn
/// `a` into `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = Vec::with_capacity(b.len() + 1);
        current.push(i + 1);
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != *cb);
            current.push(substitute.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

impl Runtime {
    #[cfg(test)]
    pub(super) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        Self::from_variables(lookup, Vec::new())
    }

    /// [`Runtime::new`] with the settings `lookup` finds (the process environment for `from_env`); a value
    /// that does not parse is kept in `env_errors`, which `start` refuses.
    /// `names` are the `STREAM_LISTENER_*` variables set, which `start` checks against the names it reads.
    pub(super) fn from_variables(
        lookup: impl Fn(&str) -> Option<String>,
        names: Vec<String>,
    ) -> Self {
        let mut runtime = match lookup("REDIS_URL") {
            Some(url) => Self {
                url_origin: "the environment variable REDIS_URL",
                ..Self::new(url)
            },
            None => Self::new("redis://127.0.0.1:6379"),
        };
        runtime.tls = TlsFiles::from_lookup(&lookup);
        runtime.base_member_id = lookup("STREAM_LISTENER_MEMBER_ID");
        if let Some(value) = lookup("STREAM_LISTENER_STATIC_MEMBERSHIP") {
            match value.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => runtime.static_membership = true,
                "false" | "0" | "no" => runtime.static_membership = false,
                _ => runtime.env_errors.push(format!(
                    "STREAM_LISTENER_STATIC_MEMBERSHIP={value:?} is not true or false"
                )),
            }
        }
        let mut number = |name: &str, set: &mut dyn FnMut(u32)| {
            if let Some(value) = lookup(name) {
                match value.trim().parse::<u32>() {
                    Ok(n) if n > 0 => set(n),
                    _ => runtime_env_error(&mut runtime.env_errors, name, &value),
                }
            }
        };
        let mut config = runtime.group_config;
        let mut shards = runtime.shard_count;
        number("STREAM_LISTENER_HEARTBEAT_INTERVAL_MS", &mut |n| {
            config.heartbeat_interval_ms = i64::from(n)
        });
        number("STREAM_LISTENER_SESSION_TIMEOUT_MS", &mut |n| {
            config.session_timeout_ms = i64::from(n)
        });
        number("STREAM_LISTENER_REBALANCE_TIMEOUT_MS", &mut |n| {
            config.rebalance_timeout_ms = i64::from(n)
        });
        number("STREAM_LISTENER_DEFAULT_SHARD_COUNT", &mut |n| shards = n);
        runtime.group_config = config;
        runtime.shard_count = shards;
        runtime.env_names = Some(names);
        runtime
    }

    /// Refuses the `STREAM_LISTENER_*` variables of [`from_env`](Self::from_env) that neither the runtime
    /// nor any of `specs` reads.
    pub(super) fn check_env_names(
        &self,
        specs: &[ListenerSpec],
    ) -> Result<(), super::RuntimeError> {
        let Some(present) = &self.env_names else {
            return Ok(());
        };
        let unknown = unknown_variables(present, &valid_names(specs));
        if unknown.is_empty() {
            return Ok(());
        }
        Err(super::RuntimeError::UnknownEnvironment {
            variables: unknown,
            listeners: specs.iter().map(|spec| spec.name.clone()).collect(),
        })
    }
}

fn runtime_env_error(errors: &mut Vec<String>, name: &str, value: &str) {
    errors.push(format!("{name}={value:?} is not a positive integer"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::metadata::GroupConfig;
    use crate::runtime::DEFAULT_SHARD_COUNT;

    #[test]
    fn group_timing_and_shard_count_come_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let runtime = Runtime::from_lookup(env(&[
            ("REDIS_URL", "redis://10.0.0.9:6380"),
            ("STREAM_LISTENER_MEMBER_ID", "pod-1"),
            ("STREAM_LISTENER_STATIC_MEMBERSHIP", "true"),
            ("STREAM_LISTENER_HEARTBEAT_INTERVAL_MS", "250"),
            ("STREAM_LISTENER_SESSION_TIMEOUT_MS", "4000"),
            ("STREAM_LISTENER_REBALANCE_TIMEOUT_MS", "9000"),
            ("STREAM_LISTENER_DEFAULT_SHARD_COUNT", "12"),
            ("REDIS_TLS_CA_CERT", "/etc/redis/ca.pem"),
            ("REDIS_TLS_CERT", "/etc/redis/client.pem"),
            ("REDIS_TLS_KEY", "/etc/redis/client.key"),
        ]));
        assert_eq!(runtime.redis_url.expose(), "redis://10.0.0.9:6380");
        assert_eq!(runtime.base_member_id.as_deref(), Some("pod-1"));
        assert!(runtime.static_membership);
        assert!(runtime.env_errors.is_empty(), "{:?}", runtime.env_errors);
        let odd = Runtime::from_lookup(env(&[("STREAM_LISTENER_STATIC_MEMBERSHIP", "maybe")]));
        assert!(!odd.static_membership);
        assert_eq!(
            odd.env_errors,
            ["STREAM_LISTENER_STATIC_MEMBERSHIP=\"maybe\" is not true or false"]
        );
        assert_eq!(
            runtime.group_config,
            GroupConfig {
                heartbeat_interval_ms: 250,
                session_timeout_ms: 4000,
                rebalance_timeout_ms: 9000,
            }
        );
        assert_eq!(runtime.shard_count, 12);
        assert_eq!(
            runtime.tls,
            TlsFiles {
                ca_cert: Some("/etc/redis/ca.pem".into()),
                cert: Some("/etc/redis/client.pem".into()),
                key: Some("/etc/redis/client.key".into()),
            }
        );
        assert!(runtime.env_errors.is_empty());

        let defaults = Runtime::from_lookup(env(&[]));
        assert_eq!(defaults.group_config, GroupConfig::default());
        assert_eq!(defaults.shard_count, DEFAULT_SHARD_COUNT);
        assert!(defaults.tls.is_empty());
    }

    #[test]
    fn edit_distance_counts_single_character_edits() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("ORDR", "ORDER"), 1);
        assert_eq!(edit_distance("ORDER", "ORDR"), 1);
        assert_eq!(edit_distance("GROUP", "GROPU"), 2);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn an_unknown_variable_is_named_with_the_nearest_valid_one() {
        let valid = names(&[
            "STREAM_LISTENER_MEMBER_ID",
            "STREAM_LISTENER_ON_ORDER_GROUP",
            "STREAM_LISTENER_ON_ORDER_STREAM",
        ]);
        let present = names(&[
            "STREAM_LISTENER_ON_ORDR_GROUP",
            "STREAM_LISTENER_MEMBER_ID",
            "STREAM_LISTENER_MEMBERID",
            "OTHER_VARIABLE",
        ]);
        assert_eq!(
            unknown_variables(&present, &valid),
            [
                UnknownVariable {
                    name: "STREAM_LISTENER_MEMBERID".into(),
                    nearest: "STREAM_LISTENER_MEMBER_ID".into(),
                },
                UnknownVariable {
                    name: "STREAM_LISTENER_ON_ORDR_GROUP".into(),
                    nearest: "STREAM_LISTENER_ON_ORDER_GROUP".into(),
                },
            ]
        );
        assert!(unknown_variables(&names(&["STREAM_LISTENER_MEMBER_ID"]), &valid).is_empty());
    }

    #[test]
    fn the_valid_names_are_the_runtimes_and_every_listeners_settings() {
        let spec = ListenerSpec::new(
            crate::runtime::Origin::Builder {
                index: 1,
                stream: "orders".into(),
                group: "billing".into(),
            },
            "on_order".into(),
            "orders".into(),
            "billing".into(),
        );
        let valid = valid_names(&[spec]);
        for name in [
            "STREAM_LISTENER_MEMBER_ID",
            "STREAM_LISTENER_HEARTBEAT_INTERVAL_MS",
            "STREAM_LISTENER_SESSION_TIMEOUT_MS",
            "STREAM_LISTENER_REBALANCE_TIMEOUT_MS",
            "STREAM_LISTENER_DEFAULT_SHARD_COUNT",
            "STREAM_LISTENER_ON_ORDER_GROUP",
            "STREAM_LISTENER_ON_ORDER_START_FROM",
        ] {
            assert!(valid.iter().any(|v| v == name), "{name}");
        }
        assert_eq!(valid.len(), RUNTIME_SETTINGS.len() + ENV_SETTINGS.len());
    }

    #[test]
    fn the_runtime_settings_are_those_from_lookup_reads() {
        let asked = std::cell::RefCell::new(Vec::new());
        let _ = Runtime::from_lookup(|name| {
            asked.borrow_mut().push(name.to_owned());
            None
        });
        let mut asked: Vec<String> = asked
            .into_inner()
            .into_iter()
            .filter(|name| name.starts_with(PREFIX))
            .collect();
        let mut expected: Vec<String> = RUNTIME_SETTINGS
            .iter()
            .map(|s| format!("{PREFIX}{s}"))
            .collect();
        asked.sort();
        expected.sort();
        assert_eq!(asked, expected);
    }

    #[tokio::test]
    async fn a_typo_in_a_listener_variable_is_a_start_error_naming_the_nearest_name() {
        let present = names(&["STREAM_LISTENER_ON_ORDR_GROUP", "STREAM_LISTENER_MEMBER_ID"]);
        let runtime = Runtime::from_variables(|_| None, present)
            .without_annotated_listeners()
            .consumer(
                crate::ConsumerBuilder::new("orders", "billing")
                    .name("on_order")
                    .handler(|_msg: crate::Message<u64>| async { Ok::<(), String>(()) }),
            );
        let error = runtime.start().await.unwrap_err();
        assert!(
            matches!(&error, crate::RuntimeError::UnknownEnvironment { variables, .. }
                if variables[0].nearest == "STREAM_LISTENER_ON_ORDER_GROUP"),
            "{error:#?}"
        );
        assert_eq!(
            error.to_string(),
            "unknown environment variable STREAM_LISTENER_ON_ORDR_GROUP (did you mean \
             STREAM_LISTENER_ON_ORDER_GROUP?): stream-listener reads STREAM_LISTENER_<SETTING> \
             (MEMBER_ID, HEARTBEAT_INTERVAL_MS, SESSION_TIMEOUT_MS, REBALANCE_TIMEOUT_MS, \
             DEFAULT_SHARD_COUNT) and STREAM_LISTENER_<LISTENER>_<SETTING> for its listeners (on_order); \
             fix or remove it"
        );
    }

    #[tokio::test]
    async fn an_unparsable_runtime_setting_is_a_start_error_naming_it() {
        let runtime = Runtime::from_lookup(|name| {
            (name == "STREAM_LISTENER_SESSION_TIMEOUT_MS").then(|| "10s".to_owned())
        });
        let error = runtime.start().await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid environment: STREAM_LISTENER_SESSION_TIMEOUT_MS=\"10s\" is not a positive integer"
        );
    }
}
