//! `MONITOR` of one server, and the check that every script touches only the keys it declares (feature
//! `aio`).
//!
//! Redis documents a script that builds key names itself as unsupported: Redis Cluster cannot route it
//! during a slot migration, and managed servers and Dragonfly refuse it. The check reads a `MONITOR` feed:
//! a script's own commands (`[0 lua]`) follow its `EVALSHA` line, and the server itself says which
//! arguments of each are keys (`COMMAND GETKEYS`), so nothing about a command's syntax is guessed here.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionLike;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A `MONITOR` connection collecting every line the server feeds it.
#[derive(Debug)]
pub struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Monitor {
    /// Starts watching the server at `addr`; returns once the server confirmed (`+OK`).
    ///
    /// # Panics
    /// If the server cannot be reached or does not confirm within 10 s.
    pub async fn start(addr: SocketAddr) -> Monitor {
        let mut stream = TcpStream::connect(addr).await.expect("connect for MONITOR");
        stream
            .write_all(b"MONITOR\r\n")
            .await
            .expect("send MONITOR");
        let mut reader = BufReader::new(stream);
        let mut first = String::new();
        tokio::time::timeout(Duration::from_secs(10), reader.read_line(&mut first))
            .await
            .expect("MONITOR confirmed in time")
            .expect("MONITOR reply");
        assert!(first.starts_with("+OK"), "MONITOR refused: {first}");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let task = tokio::spawn(async move {
            let mut line = String::new();
            while matches!(reader.read_line(&mut line).await, Ok(n) if n > 0) {
                sink.lock()
                    .expect("monitor lines")
                    .push(line.trim_end().to_owned());
                line.clear();
            }
        });
        Monitor { lines, task }
    }

    /// The lines fed so far, in order.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("monitor lines").clone()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One `MONITOR` line: who sent it (`lua` for a script's own commands) and the command's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorLine {
    /// `127.0.0.1:5555`, `lua`, `unix:...`.
    pub client: String,
    /// The command and its arguments, unquoted.
    pub args: Vec<String>,
}

impl MonitorLine {
    /// `+1700000000.123456 [0 127.0.0.1:5555] "GET" "k"` (the `+` optional).
    pub fn parse(text: &str) -> Option<MonitorLine> {
        let text = text.strip_prefix('+').unwrap_or(text);
        let (_, rest) = text.split_once(" [")?;
        let (client, args) = rest.split_once(']')?;
        Some(MonitorLine {
            client: client.split_whitespace().nth(1)?.to_owned(),
            args: parse_quoted(args),
        })
    }
}

/// The quoted, escaped arguments of a monitor line (`sdscatrepr`).
pub fn parse_quoted(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => arg.push('\n'),
                    Some('r') => arg.push('\r'),
                    Some('t') => arg.push('\t'),
                    Some('a') => arg.push('\x07'),
                    Some('b') => arg.push('\x08'),
                    Some('x') => {
                        let hex: String = chars.by_ref().take(2).collect();
                        if let Ok(b) = u8::from_str_radix(&hex, 16) {
                            arg.push(b as char);
                        }
                    }
                    Some(other) => arg.push(other),
                    None => break,
                },
                other => arg.push(other),
            }
        }
        out.push(arg);
    }
    out
}

/// A command a script ran on a key its invocation did not declare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndeclaredKey {
    /// The script's SHA1 (`EVALSHA`), or the first line of its body (`EVAL`).
    pub script: String,
    /// The keys the invocation declared.
    pub declared: Vec<String>,
    /// The command the script ran.
    pub command: Vec<String>,
    /// The key it touched.
    pub key: String,
}

/// What [`script_key_audit`] found in a feed.
#[derive(Debug, Default)]
pub struct ScriptAudit {
    /// Scripts that ran at least once (SHA1 for `EVALSHA`, lowercase).
    pub scripts: BTreeSet<String>,
    /// Every command of a script that touched a key the invocation did not declare.
    pub undeclared: Vec<UndeclaredKey>,
}

/// Reads a `MONITOR` feed of one server (in the order fed) and asks that server for the keys of every
/// command a script ran (`COMMAND GETKEYS`): each must be one the script's `EVAL`/`EVALSHA` declared.
///
/// # Panics
/// If the server does not answer `COMMAND GETKEYS`.
pub async fn script_key_audit(conn: &mut impl ConnectionLike, lines: &[String]) -> ScriptAudit {
    let mut audit = ScriptAudit::default();
    // The invocation whose commands follow: (script, declared keys).
    let mut current: Option<(String, Vec<String>)> = None;
    for line in lines.iter().filter_map(|l| MonitorLine::parse(l)) {
        if line.client != "lua" {
            current = script_invocation(&line.args);
            if let Some((script, _)) = &current {
                audit.scripts.insert(script.clone());
            }
            continue;
        }
        let Some((script, declared)) = &current else {
            continue;
        };
        for key in keys_of(conn, &line.args).await {
            if !declared.contains(&key) {
                audit.undeclared.push(UndeclaredKey {
                    script: script.clone(),
                    declared: declared.clone(),
                    command: line.args.clone(),
                    key,
                });
            }
        }
    }
    audit
}

/// `EVALSHA sha n k1..kn args`, `EVAL body n ...` (and their `_RO` forms): the script and its keys.
fn script_invocation(args: &[String]) -> Option<(String, Vec<String>)> {
    let command = args.first()?.to_ascii_uppercase();
    let script = match command.as_str() {
        "EVALSHA" | "EVALSHA_RO" => args.get(1)?.to_ascii_lowercase(),
        "EVAL" | "EVAL_RO" => args.get(1)?.lines().next().unwrap_or("").to_owned(),
        _ => return None,
    };
    let n: usize = args.get(2)?.parse().ok()?;
    Some((script, args.get(3..3 + n)?.to_vec()))
}

/// The keys of one command, as the server reads them (none for a command without key arguments).
async fn keys_of(conn: &mut impl ConnectionLike, args: &[String]) -> Vec<String> {
    if args.len() < 2 {
        return Vec::new(); // `TIME`, `PING`: a command without arguments has no keys
    }
    let mut cmd = redis::cmd("COMMAND");
    cmd.arg("GETKEYS").arg(args);
    match cmd.query_async::<Vec<String>>(conn).await {
        Ok(keys) => keys,
        Err(error)
            if error.to_string().contains("no key arguments")
                || error.to_string().contains("Invalid arguments") =>
        {
            Vec::new()
        }
        Err(error) => panic!("COMMAND GETKEYS {args:?}: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_lines_and_invocations_parse() {
        let line = MonitorLine::parse(
            r#"+1700000000.5 [0 127.0.0.1:1] "EVALSHA" "AB12" "2" "k1" "k\"2" "arg""#,
        )
        .unwrap();
        assert_eq!(line.client, "127.0.0.1:1");
        assert_eq!(
            script_invocation(&line.args),
            Some(("ab12".into(), vec!["k1".into(), "k\"2".into()]))
        );
        let lua = MonitorLine::parse(r#"1.000001 [0 lua] "DEL" "x""#).unwrap();
        assert_eq!((lua.client.as_str(), lua.args.len()), ("lua", 2));
        assert_eq!(script_invocation(&lua.args), None);
        assert_eq!(parse_quoted(r#""a\"b" "\x41c""#), vec!["a\"b", "Ac"]);
    }
}
