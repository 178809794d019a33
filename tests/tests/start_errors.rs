//! The first hour's start errors, as a user meets them: a `main` that returns one prints its `Display`
//! text (not its `Debug` structure), a URL that does not parse is named (redacted) with where it came
//! from, what Redis will refuse every time fails at once instead of being retried forever, a typo in a
//! `STREAM_LISTENER_*` variable is refused naming the nearest valid name, and a second signal forces a
//! stuck shutdown. Each runs `src/bin/start_errors.rs` as a child process and reads its stderr.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use stream_listener::{Producer, ProducerError};
use stream_listener_test_support::RedisServer;

/// How long a child may run before the test kills it and fails.
const CHILD_LIMIT: Duration = Duration::from_secs(60);
/// The bound a permanent start error must fail within, with the default (unlimited) startup retry.
const FAIL_FAST: Duration = Duration::from_secs(5);

/// A running `start_errors` child: its lines as they come, on stdout and stderr.
struct Run {
    child: Child,
    started: Instant,
    lines: mpsc::Receiver<(bool, String)>,
    stderr: String,
    stdout: String,
}

impl Run {
    /// Starts `start_errors <mode>` with only `env` of the variables stream-listener reads.
    fn start(mode: &str, env: &[(&str, &str)]) -> Run {
        let mut command = Command::new(env!("CARGO_BIN_EXE_start_errors"));
        command
            .arg(mode)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, _) in std::env::vars() {
            if name.starts_with("STREAM_LISTENER_") || name.starts_with("REDIS_") {
                command.env_remove(name);
            }
        }
        command.envs(env.iter().copied());
        let mut child = command.spawn().expect("start the start_errors binary");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        for (is_err, pipe) in [
            (false, Box::new(out) as Box<dyn std::io::Read + Send>),
            (true, Box::new(err)),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    if tx.send((is_err, line)).is_err() {
                        break;
                    }
                }
            });
        }
        Run {
            child,
            started: Instant::now(),
            lines,
            stderr: String::new(),
            stdout: String::new(),
        }
    }

    /// Takes the lines that came, waiting up to `wait` for one.
    fn take_lines(&mut self, wait: Duration) {
        if let Ok((is_err, line)) = self.lines.recv_timeout(wait) {
            let text = if is_err {
                &mut self.stderr
            } else {
                &mut self.stdout
            };
            text.push_str(&line);
            text.push('\n');
        }
        while let Ok((is_err, line)) = self.lines.try_recv() {
            let text = if is_err {
                &mut self.stderr
            } else {
                &mut self.stdout
            };
            text.push_str(&line);
            text.push('\n');
        }
    }

    /// Waits until `done` holds of the output so far, for at most `limit`.
    fn wait_for(&mut self, what: &str, limit: Duration, done: impl Fn(&Run) -> bool) {
        let deadline = Instant::now() + limit;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "no {what} within {limit:?}; stdout:\n{}\nstderr:\n{}",
                self.stdout,
                self.stderr
            );
            self.take_lines(Duration::from_millis(50));
        }
    }

    /// Waits for the child to exit (killing it after [`CHILD_LIMIT`]): its status and how long it ran.
    fn finish(mut self) -> (ExitStatus, Duration, String) {
        let deadline = self.started + CHILD_LIMIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "still running after {CHILD_LIMIT:?}; stderr:\n{}",
                    self.stderr
                );
            }
            self.take_lines(Duration::from_millis(20));
        };
        let ran = self.started.elapsed();
        // The pipes close with the process: read what is left.
        let drain = Instant::now() + Duration::from_secs(5);
        while Instant::now() < drain {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok((true, line)) => {
                    self.stderr.push_str(&line);
                    self.stderr.push('\n');
                }
                Ok((false, line)) => {
                    self.stdout.push_str(&line);
                    self.stdout.push('\n');
                }
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        (status, ran, self.stderr)
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name}");
    }
}

/// Runs `mode` to its end: what a failed `main` printed (`Error: ...`, to the end of stderr), after
/// the default logger's lines (the runtime logs by default: every line before it must be one).
fn stderr_of(mode: &str, env: &[(&str, &str)]) -> (String, Duration) {
    let (status, ran, stderr) = Run::start(mode, env).finish();
    assert!(!status.success(), "{mode} succeeded: {stderr}");
    let at = if stderr.starts_with("Error: ") {
        0
    } else {
        stderr
            .find("\nError: ")
            .map(|at| at + 1)
            .unwrap_or_else(|| panic!("{mode}: no `Error: ` line: {stderr}"))
    };
    for line in stderr[..at].lines() {
        assert!(
            line.starts_with("20") && line.contains(" stream_listener"),
            "{mode}: a line before the error is not a log line: {line:?}\n{stderr}"
        );
    }
    (stderr[at..].to_string(), ran)
}

#[test]
fn main_prints_the_text_of_a_start_error_not_its_structure() {
    let (stderr, _) = stderr_of("duplicate-member-id", &[]);
    assert!(
        stderr.starts_with(
            "Error: listeners ConsumerBuilder::new(\"orders\", \"billing\") (consumer #1 of the Runtime) \
             and ConsumerBuilder::new(\"orders\", \"billing\") (consumer #2 of the Runtime) would both \
             run member `pod-1` of group `billing` on stream `orders`: give one of them another id"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("DuplicateMemberId"), "{stderr}");

    let redis = RedisServer::start();
    let (stderr, _) = stderr_of("missing-topology", &[("REDIS_URL", &redis.url())]);
    assert!(
        stderr.starts_with(
            "Error: stream `nobody-made-me` has no topology (no Redis key `sl:topology:{nobody-made-me}`)"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("Missing {"), "{stderr}");

    let (stderr, _) = stderr_of("unreachable", &[]);
    assert!(
        stderr.starts_with("Error: Redis at redis://127.0.0.1:1/ unreachable for "),
        "{stderr}"
    );
    assert!(!stderr.contains("Unreachable {"), "{stderr}");

    let (stderr, _) = stderr_of("from-env", &[("STREAM_LISTENER_SESSION_TIMEOUT_MS", "10s")]);
    assert_eq!(
        stderr.trim_end(),
        "Error: invalid environment: STREAM_LISTENER_SESSION_TIMEOUT_MS=\"10s\" is not a positive integer"
    );
}

#[test]
fn a_url_that_does_not_parse_is_named_redacted_with_where_it_came_from() {
    let (stderr, _) = stderr_of(
        "from-env",
        &[("REDIS_URL", "redis://:s3cr3t-pw@cache.internal:63790x/")],
    );
    assert!(
        stderr.starts_with(
            "Error: Redis URL `redis://:***@cache.internal:63790x/` (from the environment variable \
             REDIS_URL) does not parse: expected redis://[user:password@]host[:port][/db]"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cr3t-pw"), "{stderr}");
}

#[tokio::test]
async fn a_producer_names_the_url_it_was_given() {
    let error = Producer::connect("localhost:6379", "orders")
        .await
        .expect_err("no scheme");
    assert!(matches!(error, ProducerError::InvalidUrl(_)), "{error:#?}");
    assert!(
        error.to_string().starts_with(
            "Redis URL `localhost:6379` (from the url of Producer::connect) has no scheme"
        ),
        "{error}"
    );
}

#[test]
fn a_typo_in_a_listener_variable_is_refused_naming_the_nearest_valid_one() {
    let (stderr, _) = stderr_of(
        "from-env",
        &[
            ("STREAM_LISTENER_ON_ORDR_GROUP", "x"),
            // Valid names pass: the runtime's own and the listener's.
            ("STREAM_LISTENER_MEMBER_ID", "pod-1"),
            ("STREAM_LISTENER_ON_ORDER_BATCH_SIZE", "5"),
        ],
    );
    assert!(
        stderr.starts_with(
            "Error: unknown environment variable STREAM_LISTENER_ON_ORDR_GROUP (did you mean \
             STREAM_LISTENER_ON_ORDER_GROUP?)"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("for its listeners (on_order)"), "{stderr}");
}

/// Starts a `from-env` child against `url` and expects it to fail within [`FAIL_FAST`] (the startup
/// retry is unlimited by default): its stderr.
fn fails_fast(url: &str) -> String {
    let (stderr, ran) = stderr_of("from-env", &[("REDIS_URL", url)]);
    assert!(ran < FAIL_FAST, "took {ran:?} to fail: {stderr}");
    stderr
}

#[test]
fn a_wrong_or_missing_password_fails_the_start_at_once_naming_the_cause() {
    let redis = RedisServer::try_start_with_args(Vec::new(), Some("s3cr3t-pw".into())).unwrap();
    let port = redis.port();
    let stderr = fails_fast(&format!("redis://:not-the-password@127.0.0.1:{port}/"));
    assert!(
        stderr.starts_with(&format!(
            "Error: Redis at redis://:***@127.0.0.1:{port}/: authentication failed: the user name or \
             password in the URL is wrong"
        )),
        "{stderr}"
    );
    assert!(
        stderr
            .contains("for `requirepass`) (Password authentication failed - AuthenticationFailed)"),
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-password"), "{stderr}");

    let stderr = fails_fast(&format!("redis://127.0.0.1:{port}/"));
    assert!(
        stderr.starts_with(&format!(
            "Error: Redis at redis://127.0.0.1:{port}/: authentication failed"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("NOAUTH"), "{stderr}");
}

/// Starts as an ACL user that may run everything but `command`: the start fails at once, naming it.
fn start_as_a_user_without(command: &str) {
    let redis = RedisServer::start();
    let port = redis.port();
    let output = Command::new("redis-cli")
        .args([
            "-p",
            &port.to_string(),
            "ACL",
            "SETUSER",
            "app",
            "on",
            ">app-pw",
        ])
        .args(["~*", "&*", "+@all", &format!("-{command}")])
        .output()
        .expect("redis-cli (it comes with redis-server)");
    assert!(output.status.success(), "{output:?}");
    let stderr = fails_fast(&format!("redis://app:app-pw@127.0.0.1:{port}/"));
    assert!(
        stderr.starts_with(&format!(
            "Error: Redis at redis://app:***@127.0.0.1:{port}/: the ACL user may not run a command \
             stream-listener needs"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "this user has no permissions to run the '{command}' command"
        )),
        "{stderr}"
    );
}

/// Every command but INFO, which the start reads the server's version with.
#[test]
fn an_acl_user_without_a_command_it_needs_fails_the_start_at_once() {
    start_as_a_user_without("info");
}

/// The consumer's dead letters and the cluster producer's batches are transactions. A user without
/// `MULTI` (an ACL written for an older release) fails the start naming it, not its first batch, where a
/// refused `MULTI` broke redis-rs's count of replies.
#[test]
fn an_acl_user_without_transactions_fails_the_start_at_once() {
    start_as_a_user_without("multi");
}

#[test]
fn a_database_index_out_of_range_fails_the_start_at_once() {
    let redis =
        RedisServer::try_start_with_args(vec!["--databases".into(), "1".into()], None).unwrap();
    let port = redis.port();
    let stderr = fails_fast(&format!("redis://127.0.0.1:{port}/3"));
    assert!(
        stderr.starts_with(&format!(
            "Error: Redis at redis://127.0.0.1:{port}/3: the database index in the URL (`/<db>`) is out \
             of range"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("DB index is out of range"), "{stderr}");
}

#[test]
fn a_second_signal_forces_a_stuck_shutdown_naming_what_was_stuck() {
    let redis = RedisServer::start();
    let mut run = Run::start("stuck", &[("REDIS_URL", &redis.url())]);
    run.wait_for("handler running", Duration::from_secs(30), |run| {
        run.stdout.contains("handling")
    });
    run.signal("INT");
    run.wait_for("graceful shutdown begun", Duration::from_secs(10), |run| {
        run.stderr.contains("shutting down")
    });
    let forced_at = Instant::now();
    run.signal("INT");
    let (status, _, stderr) = run.finish();
    let took = forced_at.elapsed();
    assert!(!status.success(), "{stderr}");
    // The shutdown timeout is 120 s: only the second signal ends it this soon.
    assert!(took < Duration::from_secs(10), "took {took:?}: {stderr}");
    assert!(
        stderr.contains(
            "Error: shutdown forced by a second signal; aborted: member stuck-1 (leave not completed"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("handlers running: shard 0 entry "),
        "{stderr}"
    );
}
