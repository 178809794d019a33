//! [`ListenerSpec`]: what one listener is, whether it came from `#[stream_listener]` or a
//! [`ConsumerBuilder`](super::ConsumerBuilder). Both build one; the runtime applies the environment's
//! overrides ([`ListenerSpec::apply_env`]), validates it once ([`ListenerSpec::validate`], errors name the
//! listener) and starts its members from it.

use std::time::Duration;

use crate::consumer::{AckPolicy, ConsumerConfig, FailurePolicy, OnExhausted, Retention};
use crate::member::identity;
use crate::topology::StartFrom;

use super::registry::ListenerRegistration;
use super::state::{HandlerSource, States};

/// Where a listener was declared: named in every error about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A `#[stream_listener]` function.
    Annotated {
        /// `module::path::function`.
        path: String,
        /// Source file.
        file: &'static str,
        /// Source line.
        line: u32,
    },
    /// The `index`-th [`ConsumerBuilder`](super::ConsumerBuilder) given to the runtime (from 1).
    Builder {
        /// Position among the runtime's builders, from 1.
        index: usize,
        /// The stream as the builder named it.
        stream: String,
        /// The group as the builder named it.
        group: String,
    },
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Annotated { path, file, line } => {
                write!(f, "#[stream_listener] {path} ({file}:{line})")
            }
            Self::Builder {
                index,
                stream,
                group,
            } => write!(
                f,
                "ConsumerBuilder::new({stream:?}, {group:?}) (consumer #{index} of the Runtime)"
            ),
        }
    }
}

/// One listener, as the runtime starts it. Built from an annotated registration or a builder; every
/// setting has its final value here (defaults applied), so both paths behave the same.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ListenerSpec {
    /// Where it was declared.
    pub origin: Origin,
    /// The name its environment overrides use: `STREAM_LISTENER_<NAME>_<SETTING>` with `<NAME>` this,
    /// upper-cased, every character outside `[A-Z0-9]` an `_` (see [`ListenerSpec::env_prefix`]). The
    /// function name of an annotated listener; the builder's [`name`](super::ConsumerBuilder::name),
    /// else `{stream}_{group}`.
    pub name: String,
    /// Logical stream.
    pub stream: String,
    /// Consumer group.
    pub group: String,
    /// Logical members this process runs for it: `concurrency` of the attribute; always 1 for a builder.
    pub members: usize,
    /// The member id: for an annotated listener the base of `{base}-m0..` (its `id`; default the
    /// runtime's base member id); for a builder the one member's id (default `{base}-{group}`).
    pub member_id: Option<String>,
    /// Local workers of each member.
    pub runtime_max_concurrency: usize,
    /// Static balancing weight of each member.
    pub weight: u32,
    /// Entries per read.
    pub batch_size: usize,
    /// Blocking read timeout, in milliseconds.
    pub block_ms: u64,
    /// Acknowledgement policy.
    pub ack: AckPolicy,
    /// Retries, backoff and the fate of an exhausted entry.
    pub failure: FailurePolicy,
    /// Dead-letter stream (default `{stream}:dlq`).
    pub dead_letter: Option<String>,
    /// How long one handler attempt may run.
    pub handler_timeout: Option<Duration>,
    /// Where the group starts reading when this listener creates it.
    pub start_from: StartFrom,
    /// Trimming of what every group acknowledged (default [`Retention::default`]; `None`: never trims).
    pub retention: Option<Retention>,
    /// Shards of the stream if this listener creates it (default: the runtime's
    /// [`default_shard_count`](super::Runtime::default_shard_count)). An existing stream keeps its count.
    pub shard_count: Option<u32>,
    pub(crate) handler: Option<HandlerSource>,
    /// The listener's own states (a builder's), over the runtime's.
    pub(crate) states: States,
    /// Lifecycle callbacks (a builder's, or [`Runtime::hooks`](super::Runtime::hooks)).
    pub(crate) hooks: crate::consumer::LifecycleHooks,
}

/// The `<SETTING>`s of `STREAM_LISTENER_<NAME>_<SETTING>` that [`ListenerSpec::apply_env`] reads: every
/// other name with a listener's prefix is refused at start ([`RuntimeError::UnknownEnvironment`](super::RuntimeError::UnknownEnvironment)).
pub(crate) const ENV_SETTINGS: &[&str] = &[
    "STREAM",
    "GROUP",
    "CONCURRENCY",
    "MEMBER_ID",
    "RUNTIME_MAX_CONCURRENCY",
    "WEIGHT",
    "BATCH_SIZE",
    "BLOCK_MS",
    "HANDLER_TIMEOUT_MS",
    "MAX_DELIVERIES",
    "INITIAL_BACKOFF_MS",
    "MAX_BACKOFF_MS",
    "JITTER",
    "DEAD_LETTER",
    "START_FROM",
    "SHARD_COUNT",
];

/// A listener that cannot start, and why.
#[derive(Clone, PartialEq, Eq, thiserror::Error, stream_listener_macros::ReportDebug)]
#[error("listener {listener}: {reason}")]
pub struct InvalidListener {
    /// The listener ([`Origin`]).
    pub listener: String,
    /// What is wrong.
    pub reason: String,
}

impl ListenerSpec {
    /// A spec with the defaults for `stream` and `group`, declared at `origin`.
    pub(crate) fn new(origin: Origin, name: String, stream: String, group: String) -> Self {
        let defaults = ConsumerConfig::new("", "", "");
        Self {
            origin,
            name,
            stream,
            group,
            members: 1,
            member_id: None,
            runtime_max_concurrency: 1,
            weight: 1,
            batch_size: defaults.batch_size,
            block_ms: defaults.block_ms,
            ack: defaults.ack_policy,
            failure: defaults.failure_policy,
            dead_letter: None,
            handler_timeout: None,
            start_from: StartFrom::Earliest,
            retention: defaults.retention,
            shard_count: None,
            handler: None,
            states: States::default(),
            hooks: crate::consumer::LifecycleHooks::default(),
        }
    }

    /// The spec of an annotated listener.
    pub(crate) fn from_registration(reg: &ListenerRegistration) -> Self {
        let mut spec = Self::new(
            Origin::Annotated {
                path: reg.qualified_name(),
                file: reg.file,
                line: reg.line,
            },
            reg.handler_name.to_owned(),
            reg.stream.to_owned(),
            reg.group.to_owned(),
        );
        spec.members = reg.concurrency;
        spec.member_id = reg.id.map(str::to_owned);
        spec.weight = reg.weight.unwrap_or(1);
        if let Some(n) = reg.batch_size {
            spec.batch_size = n;
        }
        if let Some(ms) = reg.block_ms {
            spec.block_ms = ms;
        }
        if let Some(ack) = reg.ack {
            spec.ack = ack;
        }
        if let Some(max) = reg.max_deliveries {
            spec.failure.max_deliveries = max;
        }
        if let Some(on_exhausted) = reg.on_exhausted {
            spec.failure.on_exhausted = on_exhausted;
        }
        if let Some(ms) = reg.initial_backoff_ms {
            spec.failure.initial_backoff = Duration::from_millis(ms);
        }
        if let Some(ms) = reg.max_backoff_ms {
            spec.failure.max_backoff = Duration::from_millis(ms);
        }
        if let Some(on) = reg.jitter {
            spec.failure.jitter = on;
        }
        spec.dead_letter = reg.dead_letter.map(str::to_owned);
        spec.handler_timeout = reg.handler_timeout_ms.map(Duration::from_millis);
        spec.start_from = reg.start_from.unwrap_or_default();
        spec.shard_count = reg.shard_count;
        let make = reg.make_handler;
        spec.handler = Some(HandlerSource::Bind(std::sync::Arc::new(make)));
        spec
    }

    /// Every `#[stream_listener]` of the binary, as specs (before overrides and validation).
    pub fn registered() -> Vec<ListenerSpec> {
        super::registry::registrations()
            .map(Self::from_registration)
            .collect()
    }

    /// `STREAM_LISTENER_<NAME>_`: the prefix of this listener's environment overrides.
    pub fn env_prefix(&self) -> String {
        let name: String = self
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect();
        format!("STREAM_LISTENER_{name}_")
    }

    /// Applies the overrides `lookup` finds (the runtime passes the process environment): for each setting,
    /// `STREAM_LISTENER_<NAME>_<SETTING>` with `<SETTING>` one of `STREAM`, `GROUP`, `CONCURRENCY`,
    /// `MEMBER_ID`, `RUNTIME_MAX_CONCURRENCY`, `WEIGHT`, `BATCH_SIZE`, `BLOCK_MS`, `HANDLER_TIMEOUT_MS`,
    /// `MAX_DELIVERIES`, `DEAD_LETTER`, `START_FROM` (`earliest` / `latest`), `SHARD_COUNT`. A value that
    /// does not parse is an error naming the variable; an empty value counts as unset. A runtime built
    /// with [`Runtime::from_env`](super::Runtime::from_env) refuses any other `STREAM_LISTENER_*` name
    /// (a typo would leave the setting at its default), naming the nearest valid one.
    pub fn apply_env(
        &mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(), InvalidListener> {
        let prefix = self.env_prefix();
        let get = |setting: &str| {
            let var = format!("{prefix}{setting}");
            lookup(&var)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .map(|v| (var, v))
        };
        let origin = self.origin.to_string();
        let bad = |var: &str, value: &str, expected: &str| InvalidListener {
            listener: origin.clone(),
            reason: format!("{var}={value:?} is not {expected}"),
        };
        let number = |setting: &str| -> Result<Option<u64>, InvalidListener> {
            match get(setting) {
                None => Ok(None),
                Some((var, value)) => value
                    .parse::<u64>()
                    .map(Some)
                    .map_err(|_| bad(&var, &value, "a non-negative integer")),
            }
        };
        if let Some((_, v)) = get("STREAM") {
            self.stream = v;
        }
        if let Some((_, v)) = get("GROUP") {
            self.group = v;
        }
        if let Some((_, v)) = get("MEMBER_ID") {
            self.member_id = Some(v);
        }
        if let Some((_, v)) = get("DEAD_LETTER") {
            self.dead_letter = Some(v);
        }
        if let Some((var, v)) = get("START_FROM") {
            self.start_from = match v.to_ascii_lowercase().as_str() {
                "earliest" => StartFrom::Earliest,
                "latest" => StartFrom::Latest,
                _ => return Err(bad(&var, &v, "`earliest` or `latest`")),
            };
        }
        if let Some(n) = number("CONCURRENCY")? {
            self.members = n as usize;
        }
        if let Some(n) = number("RUNTIME_MAX_CONCURRENCY")? {
            self.runtime_max_concurrency = n as usize;
        }
        if let Some(n) = number("WEIGHT")? {
            self.weight = n.min(u32::MAX as u64) as u32;
        }
        if let Some(n) = number("BATCH_SIZE")? {
            self.batch_size = n as usize;
        }
        if let Some(n) = number("BLOCK_MS")? {
            self.block_ms = n;
        }
        if let Some(n) = number("HANDLER_TIMEOUT_MS")? {
            self.handler_timeout = Some(Duration::from_millis(n));
        }
        if let Some(n) = number("MAX_DELIVERIES")? {
            self.failure.max_deliveries = n.min(u32::MAX as u64) as u32;
        }
        if let Some(n) = number("INITIAL_BACKOFF_MS")? {
            self.failure.initial_backoff = Duration::from_millis(n);
        }
        if let Some(n) = number("MAX_BACKOFF_MS")? {
            self.failure.max_backoff = Duration::from_millis(n);
        }
        if let Some((var, v)) = get("JITTER") {
            self.failure.jitter = match v.to_ascii_lowercase().as_str() {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => return Err(bad(&var, &v, "`true` or `false`")),
            };
        }
        if let Some(n) = number("SHARD_COUNT")? {
            self.shard_count = Some(n.min(u32::MAX as u64) as u32);
        }
        Ok(())
    }

    /// Every check, in one place, for both ways of declaring a listener. The attribute already refused
    /// most of these at compile time; the builder and the environment meet them here.
    pub fn validate(&self) -> Result<(), InvalidListener> {
        let fail = |reason: String| {
            Err(InvalidListener {
                listener: self.origin.to_string(),
                reason,
            })
        };
        if self.stream.trim().is_empty() {
            return fail("the stream name is empty".into());
        }
        if self.stream.contains(['{', '}']) {
            return fail(format!(
                "stream {:?} contains `{{` or `}}`: shard keys are `{{stream}}:{{i}}`, and a hash tag would put every shard in one Redis Cluster slot",
                self.stream
            ));
        }
        if self.group.trim().is_empty() {
            return fail("the group name is empty".into());
        }
        if let Some(id) = &self.member_id {
            if id.is_empty()
                || !id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            {
                return fail(format!(
                    "member id {id:?} must be non-empty ASCII letters, digits, `.`, `_` and `-`"
                ));
            }
        }
        for (what, value) in [
            ("concurrency (members)", self.members as u64),
            (
                "runtime_max_concurrency",
                self.runtime_max_concurrency as u64,
            ),
            ("weight", u64::from(self.weight)),
            ("batch_size", self.batch_size as u64),
            ("max_deliveries", u64::from(self.failure.max_deliveries)),
            ("shard_count", u64::from(self.shard_count.unwrap_or(1))),
        ] {
            if value == 0 {
                return fail(format!("{what} must be at least 1"));
            }
        }
        if self.failure.initial_backoff > self.failure.max_backoff {
            return fail(format!(
                "initial_backoff ({} ms) is above max_backoff ({} ms): every wait would be max_backoff",
                self.failure.initial_backoff.as_millis(),
                self.failure.max_backoff.as_millis()
            ));
        }
        if self.handler_timeout == Some(Duration::ZERO) {
            return fail("handler_timeout must be more than zero".into());
        }
        if self.dead_letter.is_some() && self.failure.on_exhausted == OnExhausted::LeavePending {
            return fail(
                "a dead-letter stream has no effect when exhausted entries are left pending".into(),
            );
        }
        if self.handler.is_none() {
            return fail(
                "no handler: call `.handler(..)` (or another `*handler`) on the builder".into(),
            );
        }
        Ok(())
    }

    /// The member ids this process runs for the listener under the process's `base` member id.
    pub fn member_ids(&self, base: Option<&str>) -> Vec<String> {
        match self.origin {
            Origin::Annotated { .. } => {
                let base = identity::base_member_id(self.member_id.as_deref().or(base));
                identity::member_ids(&base.id, self.members)
            }
            Origin::Builder { .. } => vec![self.member_id.clone().unwrap_or_else(|| {
                format!("{}-{}", identity::base_member_id(base).id, self.group)
            })],
        }
    }

    /// The consumer configuration of its member `member_id`.
    pub fn consumer_config(&self, member_id: &str) -> ConsumerConfig {
        let mut config = ConsumerConfig::new(&self.stream, &self.group, member_id);
        config.runtime_max_concurrency = self.runtime_max_concurrency;
        config.batch_size = self.batch_size;
        config.block_ms = self.block_ms;
        config.ack_policy = self.ack;
        config.failure_policy = self.failure;
        config.dead_letter_stream = self.dead_letter.clone();
        config.handler_timeout = self.handler_timeout;
        config.retention = self.retention;
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::{BoxedHandler, RawMessage};

    fn spec() -> ListenerSpec {
        let mut spec = ListenerSpec::new(
            Origin::Builder {
                index: 2,
                stream: "orders".into(),
                group: "billing".into(),
            },
            "orders_billing".into(),
            "orders".into(),
            "billing".into(),
        );
        spec.handler = Some(HandlerSource::Ready(BoxedHandler::raw(
            |_m: RawMessage| async { Ok::<(), String>(()) },
        )));
        spec
    }

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn defaults_are_the_consumer_config_defaults() {
        let spec = spec();
        spec.validate().unwrap();
        let mut expected = ConsumerConfig::new("orders", "billing", "m");
        expected.runtime_max_concurrency = 1;
        assert_eq!(spec.consumer_config("m"), expected);
        assert_eq!(spec.start_from, StartFrom::Earliest);
    }

    #[test]
    fn the_settings_the_environment_may_name_are_those_apply_env_reads() {
        let asked = std::cell::RefCell::new(Vec::new());
        spec()
            .apply_env(|name: &str| {
                asked.borrow_mut().push(name.to_owned());
                None
            })
            .unwrap();
        let expected: Vec<String> = ENV_SETTINGS
            .iter()
            .map(|s| format!("STREAM_LISTENER_ORDERS_BILLING_{s}"))
            .collect();
        let (mut asked, mut expected) = (asked.into_inner(), expected);
        asked.sort();
        expected.sort();
        assert_eq!(asked, expected);
    }

    #[test]
    fn the_environment_overrides_every_setting() {
        let mut spec = spec();
        assert_eq!(spec.env_prefix(), "STREAM_LISTENER_ORDERS_BILLING_");
        spec.apply_env(env(&[
            ("STREAM_LISTENER_ORDERS_BILLING_STREAM", "orders-eu"),
            ("STREAM_LISTENER_ORDERS_BILLING_GROUP", "billing-eu"),
            ("STREAM_LISTENER_ORDERS_BILLING_CONCURRENCY", "3"),
            ("STREAM_LISTENER_ORDERS_BILLING_MEMBER_ID", "pod-7"),
            (
                "STREAM_LISTENER_ORDERS_BILLING_RUNTIME_MAX_CONCURRENCY",
                "8",
            ),
            ("STREAM_LISTENER_ORDERS_BILLING_WEIGHT", "2"),
            ("STREAM_LISTENER_ORDERS_BILLING_BATCH_SIZE", " 50 "),
            ("STREAM_LISTENER_ORDERS_BILLING_BLOCK_MS", "20"),
            ("STREAM_LISTENER_ORDERS_BILLING_HANDLER_TIMEOUT_MS", "1500"),
            ("STREAM_LISTENER_ORDERS_BILLING_MAX_DELIVERIES", "9"),
            ("STREAM_LISTENER_ORDERS_BILLING_INITIAL_BACKOFF_MS", "20"),
            ("STREAM_LISTENER_ORDERS_BILLING_MAX_BACKOFF_MS", "900"),
            ("STREAM_LISTENER_ORDERS_BILLING_JITTER", "False"),
            ("STREAM_LISTENER_ORDERS_BILLING_DEAD_LETTER", "dead"),
            ("STREAM_LISTENER_ORDERS_BILLING_START_FROM", "Latest"),
            ("STREAM_LISTENER_ORDERS_BILLING_SHARD_COUNT", "12"),
            ("STREAM_LISTENER_OTHER_BATCH_SIZE", "1"),
        ]))
        .unwrap();
        assert_eq!(
            (spec.stream.as_str(), spec.group.as_str()),
            ("orders-eu", "billing-eu")
        );
        assert_eq!(spec.members, 3);
        assert_eq!(spec.member_id.as_deref(), Some("pod-7"));
        assert_eq!(spec.runtime_max_concurrency, 8);
        assert_eq!(spec.weight, 2);
        assert_eq!(spec.batch_size, 50);
        assert_eq!(spec.block_ms, 20);
        assert_eq!(spec.handler_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(spec.failure.max_deliveries, 9);
        assert_eq!(spec.failure.initial_backoff, Duration::from_millis(20));
        assert_eq!(spec.failure.max_backoff, Duration::from_millis(900));
        assert!(!spec.failure.jitter);
        assert_eq!(spec.dead_letter.as_deref(), Some("dead"));
        assert_eq!(spec.start_from, StartFrom::Latest);
        assert_eq!(spec.shard_count, Some(12));
    }

    #[test]
    fn a_bad_override_names_the_variable_and_the_listener() {
        let mut spec = spec();
        let error = spec
            .apply_env(env(&[(
                "STREAM_LISTENER_ORDERS_BILLING_BATCH_SIZE",
                "many",
            )]))
            .unwrap_err();
        assert!(error.listener.contains("consumer #2"), "{error}");
        assert!(
            error
                .reason
                .contains("STREAM_LISTENER_ORDERS_BILLING_BATCH_SIZE=\"many\""),
            "{error}"
        );
        let error = spec
            .apply_env(env(&[(
                "STREAM_LISTENER_ORDERS_BILLING_START_FROM",
                "middle",
            )]))
            .unwrap_err();
        assert!(error.reason.contains("`earliest` or `latest`"), "{error}");
    }

    #[test]
    fn validation_names_the_listener_and_the_problem() {
        let check = |edit: fn(&mut ListenerSpec), expected: &str| {
            let mut spec = spec();
            edit(&mut spec);
            let error = spec.validate().unwrap_err();
            assert!(
                error.to_string().starts_with(
                    "listener ConsumerBuilder::new(\"orders\", \"billing\") (consumer #2 of the Runtime): "
                ),
                "{error}"
            );
            assert!(error.reason.contains(expected), "{error}");
        };
        check(|s| s.stream = " ".into(), "stream name is empty");
        check(|s| s.stream = "{orders}".into(), "contains `{`");
        check(|s| s.group = String::new(), "group name is empty");
        check(|s| s.member_id = Some("a b".into()), "member id");
        check(
            |s| s.members = 0,
            "concurrency (members) must be at least 1",
        );
        check(|s| s.runtime_max_concurrency = 0, "runtime_max_concurrency");
        check(|s| s.weight = 0, "weight");
        check(|s| s.batch_size = 0, "batch_size");
        check(|s| s.failure.max_deliveries = 0, "max_deliveries");
        check(|s| s.shard_count = Some(0), "shard_count");
        check(
            |s| s.handler_timeout = Some(Duration::ZERO),
            "handler_timeout",
        );
        check(
            |s| {
                s.dead_letter = Some("d".into());
                s.failure.on_exhausted = OnExhausted::LeavePending;
            },
            "no effect",
        );
        check(
            |s| {
                s.failure.initial_backoff = Duration::from_secs(10);
                s.failure.max_backoff = Duration::from_secs(5);
            },
            "initial_backoff (10000 ms) is above max_backoff (5000 ms)",
        );
        check(|s| s.handler = None, "no handler");
    }

    #[test]
    fn a_builder_member_id_defaults_to_base_dash_group() {
        let spec = spec();
        assert_eq!(spec.member_ids(Some("10.0.0.1")), ["10.0.0.1-billing"]);
        let mut named = spec.clone();
        named.member_id = Some("fixed".into());
        assert_eq!(named.member_ids(Some("10.0.0.1")), ["fixed"]);
    }

    #[test]
    fn annotated_members_are_base_dash_m_i() {
        let mut spec = spec();
        spec.origin = Origin::Annotated {
            path: "app::on_order".into(),
            file: "src/app.rs",
            line: 3,
        };
        spec.members = 2;
        assert_eq!(spec.member_ids(Some("b")), ["b-m0", "b-m1"]);
        spec.member_id = Some("own".into());
        assert_eq!(spec.member_ids(Some("b")), ["own-m0", "own-m1"]);
    }
}
