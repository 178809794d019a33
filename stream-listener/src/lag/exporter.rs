//! `LagExporter`: which groups to read (given, discovered, or both), the scrape cache, and the two
//! renderings (Prometheus text, the JSON KEDA's `metrics-api` scaler reads).
//!
//! | metric (gauge) | labels | what |
//! | --- | --- | --- |
//! | `stream_listener_group_up` | `stream`, `group` | 1 when the group was read, 0 when its read failed (the error follows as a `#` comment) |
//! | `stream_listener_group_lag` | `stream`, `group` | entries not delivered to the group yet, all shards |
//! | `stream_listener_group_lag_exact` | `stream`, `group` | 0 when a shard's lag is a lower bound (more than the count limit to count) |
//! | `stream_listener_group_pending` | `stream`, `group` | entries delivered and not acknowledged |
//! | `stream_listener_group_backlog` | `stream`, `group` | lag + pending |
//! | `stream_listener_group_oldest_unacked_age_seconds` | `stream`, `group` | age of the oldest entry not acknowledged (0 when none) |
//! | `stream_listener_group_live_members` | `stream`, `group` | members whose lease is ahead of Redis time |
//! | `stream_listener_group_shards` | `stream`, `group` | the stream's shard count |
//! | `stream_listener_group_shard_lag`, `_shard_pending`, `_shard_oldest_unacked_age_seconds` | `stream`, `group`, `shard` | the same per shard |
//!
//! The names differ from the members' own `stream_listener_shard_lag`, so a `sum(...)` over both jobs
//! does not count a backlog twice.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tokio::sync::Mutex;

use super::{discover, read_group, GroupLag, LagError, LagOptions};
use crate::connection::Connection;

/// A `stream/group` pair.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupName {
    /// Logical stream.
    pub stream: String,
    /// Consumer group.
    pub group: String,
}

impl GroupName {
    /// `stream/group` (the group is after the last `/`).
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.rsplit_once('/') {
            Some((stream, group)) if !stream.is_empty() && !group.is_empty() => Ok(Self {
                stream: stream.to_owned(),
                group: group.to_owned(),
            }),
            _ => Err(format!("`{text}` is not `<stream>/<group>`")),
        }
    }
}

impl std::fmt::Display for GroupName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.stream, self.group)
    }
}

/// One group's result in a scrape.
#[derive(Debug, Clone)]
pub struct ScrapedGroup {
    /// Which group.
    pub name: GroupName,
    /// Its numbers, or why it could not be read (the text of a [`LagError`]).
    pub result: Result<GroupLag, ScrapeError>,
}

/// Why one group of a scrape could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeError {
    /// The stream or the group is unknown (HTTP 404), rather than unreadable (503).
    pub unknown: bool,
    /// The error's text.
    pub message: String,
}

impl From<&LagError> for ScrapeError {
    fn from(error: &LagError) -> Self {
        Self {
            unknown: matches!(
                error,
                LagError::UnknownStream { .. } | LagError::UnknownGroup { .. }
            ),
            message: error.to_string(),
        }
    }
}

/// What one scrape read.
#[derive(Debug, Clone)]
pub struct Scrape {
    /// Every group, in name order.
    pub groups: Vec<ScrapedGroup>,
    /// Why discovery failed, or that it stopped at its scan limit (the groups found before are kept).
    pub discovery_error: Option<String>,
}

/// A lag exporter that is not a member: reads groups' backlogs from Redis on demand (a scrape), at most
/// once per cache period however many scrapes come, and renders them.
pub struct LagExporter {
    conn: Connection,
    given: Vec<GroupName>,
    discover: bool,
    options: LagOptions,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    scrape: Option<(Instant, Arc<Scrape>)>,
    discovered: Option<(Instant, Vec<GroupName>, Option<String>)>,
}

impl std::fmt::Debug for LagExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LagExporter")
            .field("given", &self.given)
            .field("discover", &self.discover)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl LagExporter {
    /// Reads `given` groups, plus every group [`discover`] finds when `discover` (or when `given` is
    /// empty).
    pub fn new(
        conn: Connection,
        given: Vec<GroupName>,
        discover: bool,
        options: LagOptions,
    ) -> Self {
        let discover = discover || given.is_empty();
        Self {
            conn,
            given,
            discover,
            options,
            cache: Mutex::new(Cache::default()),
        }
    }

    /// The groups' numbers now: the cached scrape if younger than the cache period, else a new read.
    /// Concurrent callers wait for one read and share it.
    pub async fn scrape(&self) -> Arc<Scrape> {
        let mut cache = self.cache.lock().await;
        if let Some((at, scrape)) = &cache.scrape {
            if at.elapsed() < self.options.cache_ttl {
                return scrape.clone();
            }
        }
        let mut conn = self.conn.clone();
        let mut names = self.given.clone();
        let mut discovery_error = None;
        if self.discover {
            let due = cache
                .discovered
                .as_ref()
                .is_none_or(|(at, _, _)| at.elapsed() >= self.options.discovery_interval);
            if due {
                let found = match discover(&mut conn, self.options.scan_limit).await {
                    Ok((found, truncated)) => {
                        let names = found
                            .into_iter()
                            .map(|(stream, group)| GroupName { stream, group })
                            .collect();
                        let note = truncated.then(|| {
                            format!(
                                "discovery stopped after about {} keys; some groups may be missing",
                                self.options.scan_limit
                            )
                        });
                        (names, note)
                    }
                    // Keep what an earlier discovery found.
                    Err(e) => (
                        cache
                            .discovered
                            .as_ref()
                            .map(|(_, names, _)| names.clone())
                            .unwrap_or_default(),
                        Some(format!("discovery failed: {e}")),
                    ),
                };
                cache.discovered = Some((Instant::now(), found.0, found.1));
            }
            if let Some((_, found, note)) = &cache.discovered {
                names.extend(found.iter().cloned());
                discovery_error = note.clone();
            }
        }
        names.sort();
        names.dedup();
        let mut groups = Vec::with_capacity(names.len());
        for name in names {
            let result = read_group(&mut conn, &name.stream, &name.group, &self.options)
                .await
                .map_err(|e| ScrapeError::from(&e));
            groups.push(ScrapedGroup { name, result });
        }
        let scrape = Arc::new(Scrape {
            groups,
            discovery_error,
        });
        cache.scrape = Some((Instant::now(), scrape.clone()));
        scrape
    }

    /// Serves `/metrics` ([`Scrape::prometheus`]), `/lag` ([`Scrape::json`]) and
    /// `/lag/<stream>/<group>` ([`Scrape::group_json`], what KEDA's `metrics-api` reads) at `addr`,
    /// with `/livez` and `/readyz` answering 200, on the probe server's thread; scrapes run on
    /// `runtime` (a multi-threaded runtime, or a current-thread one whose `block_on` is running).
    #[cfg(feature = "http")]
    pub fn serve(
        self: Arc<Self>,
        addr: impl std::net::ToSocketAddrs,
        runtime: tokio::runtime::Handle,
    ) -> std::io::Result<crate::http::ProbeServer> {
        use crate::http::{ProbeServer, Response};
        let metrics = {
            let (exporter, runtime) = (self.clone(), runtime.clone());
            Box::new(move || runtime.block_on(exporter.scrape()).prometheus())
                as crate::http::MetricsRenderer
        };
        let lag = Box::new(move |path: &str| {
            let scrape = runtime.block_on(self.scrape());
            let rest = path.strip_prefix("/lag").unwrap_or("");
            if rest.is_empty() || rest == "/" {
                return Response::json(200, &scrape.json());
            }
            let Ok(name) = GroupName::parse(rest.trim_start_matches('/')) else {
                return Response::json(
                    404,
                    &json!({ "error": format!("not found: `{path}` is not /lag/<stream>/<group>") }),
                );
            };
            match scrape.group_json(&name) {
                Some((code, body)) => Response::json(code, &body),
                None => Response::json(
                    404,
                    &json!({ "error": format!("group `{name}` is not exported here (not given and not discovered)") }),
                ),
            }
        }) as crate::http::RouteHandler;
        ProbeServer::start_with_routes(
            addr,
            crate::health::HealthHandle::without_members(),
            Some(metrics),
            vec![("/lag".to_owned(), lag)],
        )
    }
}

impl Scrape {
    /// The Prometheus text format (see the module docs for the metrics).
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        if let Some(error) = &self.discovery_error {
            let _ = writeln!(out, "# {}", one_line(error));
        }
        let group_metrics: [Gauge<GroupLag>; 8] = [
            ("lag", "Entries not delivered to the group yet.", |g| {
                g.lag as f64
            }),
            ("lag_exact", "0 when a shard's lag is a lower bound.", |g| {
                f64::from(u8::from(g.lag_exact))
            }),
            ("pending", "Entries delivered and not acknowledged.", |g| {
                g.pending as f64
            }),
            ("backlog", "Lag plus pending.", |g| g.backlog as f64),
            (
                "oldest_unacked_age_seconds",
                "Age of the oldest entry not acknowledged.",
                |g| g.oldest_unacked_age_ms.unwrap_or(0) as f64 / 1000.0,
            ),
            (
                "live_members",
                "Members whose lease is ahead of Redis time.",
                |g| g.live_members as f64,
            ),
            ("shards", "The stream's shard count.", |g| {
                f64::from(g.shard_count)
            }),
            ("up", "1 when the group was read.", |_| 1.0),
        ];
        for (name, help, value) in group_metrics {
            let _ = writeln!(out, "# HELP stream_listener_group_{name} {help}");
            let _ = writeln!(out, "# TYPE stream_listener_group_{name} gauge");
            for scraped in &self.groups {
                let labels = labels(&scraped.name, None);
                match &scraped.result {
                    Ok(group) => {
                        let _ =
                            writeln!(out, "stream_listener_group_{name}{labels} {}", value(group));
                    }
                    Err(error) if name == "up" => {
                        let _ = writeln!(out, "# {}: {}", scraped.name, one_line(&error.message));
                        let _ = writeln!(out, "stream_listener_group_{name}{labels} 0");
                    }
                    Err(_) => {}
                }
            }
        }
        let shard_metrics: [Gauge<super::ShardLag>; 3] = [
            (
                "shard_lag",
                "Entries of the shard not delivered to the group yet.",
                |s| s.lag as f64,
            ),
            (
                "shard_pending",
                "Entries of the shard delivered and not acknowledged.",
                |s| s.pending as f64,
            ),
            (
                "shard_oldest_unacked_age_seconds",
                "Age of the shard's oldest entry not acknowledged.",
                |s| s.oldest_unacked_age_ms.unwrap_or(0) as f64 / 1000.0,
            ),
        ];
        for (name, help, value) in shard_metrics {
            let _ = writeln!(out, "# HELP stream_listener_group_{name} {help}");
            let _ = writeln!(out, "# TYPE stream_listener_group_{name} gauge");
            for scraped in &self.groups {
                if let Ok(group) = &scraped.result {
                    for shard in &group.shards {
                        let labels = labels(&scraped.name, Some(shard.shard));
                        let _ =
                            writeln!(out, "stream_listener_group_{name}{labels} {}", value(shard));
                    }
                }
            }
        }
        out
    }

    /// Every group as JSON: `{"groups": [<group_json>...], "discoveryError": ...}`.
    pub fn json(&self) -> Value {
        json!({
            "groups": self.groups.iter().map(group_value).collect::<Vec<_>>(),
            "discoveryError": self.discovery_error,
        })
    }

    /// One group's JSON and the HTTP status to serve it with (200; 404 for an unknown stream or group,
    /// 503 for an unreadable one, the body then `{"stream", "group", "error"}`); `None` when the
    /// scrape has no such group. On 200 the body is [`GroupLag`] in camelCase: `stream`, `group`,
    /// `shardCount`, `liveMembers`, `lag`, `lagExact`, `pending`, `backlog`, `oldestUnackedAgeMs`,
    /// `shards` (`shard`, `streamKey`, `exists`, `hasGroup`, `length`, `lag`, `source`, `pending`,
    /// `oldestUnackedAgeMs`, `lastDeliveredId`, `entriesRead`, `entriesAdded`).
    pub fn group_json(&self, name: &GroupName) -> Option<(u16, Value)> {
        let scraped = self.groups.iter().find(|g| &g.name == name)?;
        let code = match &scraped.result {
            Ok(_) => 200,
            Err(e) if e.unknown => 404,
            Err(_) => 503,
        };
        Some((code, group_value(scraped)))
    }

    /// The group's result, if the scrape has it.
    pub fn group(&self, name: &GroupName) -> Option<&ScrapedGroup> {
        self.groups.iter().find(|g| &g.name == name)
    }
}

/// A gauge's name (after `stream_listener_group_`), help text and value.
type Gauge<T> = (&'static str, &'static str, fn(&T) -> f64);

fn group_value(scraped: &ScrapedGroup) -> Value {
    match &scraped.result {
        Ok(group) => serde_json::to_value(group).expect("a GroupLag serializes"),
        Err(error) => json!({
            "stream": scraped.name.stream,
            "group": scraped.name.group,
            "error": error.message,
        }),
    }
}

/// `{stream="…",group="…"[,shard="…"]}` with the label values escaped.
fn labels(name: &GroupName, shard: Option<u32>) -> String {
    let escape = |v: &str| {
        v.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    let mut out = format!(
        "{{stream=\"{}\",group=\"{}\"",
        escape(&name.stream),
        escape(&name.group)
    );
    if let Some(shard) = shard {
        let _ = write!(out, ",shard=\"{shard}\"");
    }
    out.push('}');
    out
}

fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_parse() {
        assert_eq!(
            GroupName::parse("orders/billing"),
            Ok(GroupName {
                stream: "orders".into(),
                group: "billing".into()
            })
        );
        for bad in ["orders", "/billing", "orders/", ""] {
            assert!(GroupName::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        let name = GroupName {
            stream: "a\"b".into(),
            group: "c\\d".into(),
        };
        assert_eq!(
            labels(&name, Some(3)),
            "{stream=\"a\\\"b\",group=\"c\\\\d\",shard=\"3\"}"
        );
    }

    #[test]
    fn a_failed_group_is_down_with_its_error_and_others_stay() {
        let ok = GroupLag {
            stream: "orders".into(),
            group: "billing".into(),
            shard_count: 1,
            live_members: 0,
            lag: 5,
            lag_exact: true,
            pending: 2,
            backlog: 7,
            oldest_unacked_age_ms: Some(1500),
            shards: vec![],
        };
        let scrape = Scrape {
            groups: vec![
                ScrapedGroup {
                    name: GroupName::parse("orders/billing").unwrap(),
                    result: Ok(ok),
                },
                ScrapedGroup {
                    name: GroupName::parse("nope/g").unwrap(),
                    result: Err(ScrapeError {
                        unknown: true,
                        message: "unknown stream `nope`".into(),
                    }),
                },
            ],
            discovery_error: None,
        };
        let text = scrape.prometheus();
        assert!(text.contains("stream_listener_group_lag{stream=\"orders\",group=\"billing\"} 5\n"));
        assert!(text.contains("stream_listener_group_oldest_unacked_age_seconds{stream=\"orders\",group=\"billing\"} 1.5\n"));
        assert!(text.contains("stream_listener_group_up{stream=\"nope\",group=\"g\"} 0\n"));
        assert!(text.contains("# nope/g: unknown stream `nope`\n"));
        let (code, body) = scrape
            .group_json(&GroupName::parse("nope/g").unwrap())
            .unwrap();
        assert_eq!(code, 404);
        assert_eq!(body["error"], "unknown stream `nope`");
        let (code, body) = scrape
            .group_json(&GroupName::parse("orders/billing").unwrap())
            .unwrap();
        assert_eq!((code, body["lag"].as_u64()), (200, Some(5)));
    }
}
