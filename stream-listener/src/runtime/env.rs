//! The runtime's settings from environment variables ([`Runtime::from_env`](super::Runtime::from_env)):
//! the Redis URL and its TLS files, the base member id, the timing of groups and the shard count of
//! streams this process creates. Listener settings have their own overrides
//! ([`ListenerSpec::apply_env`](super::ListenerSpec::apply_env)).

use crate::tls::TlsFiles;

use super::Runtime;

impl Runtime {
    /// [`Runtime::new`] with the settings `lookup` finds (the process environment for `from_env`); a value
    /// that does not parse is kept in `env_errors`, which `start` refuses.
    pub(super) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let url = lookup("REDIS_URL").unwrap_or_else(|| "redis://127.0.0.1:6379".into());
        let mut runtime = Self::new(url);
        runtime.tls = TlsFiles::from_lookup(&lookup);
        runtime.base_member_id = lookup("STREAM_LISTENER_MEMBER_ID");
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
        runtime
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
