//! A `main` that returns a start error, as a user's does, for `tests/tests/start_errors.rs`: the test runs
//! it as a child process and reads what Rust prints on stderr (`Error: {:?}`).
//!
//! The first argument picks the error; `REDIS_URL` (and the other variables the runtime reads) come from
//! the test.
//!
//! | argument | what `main` returns |
//! | --- | --- |
//! | `duplicate-member-id` | `RuntimeError::DuplicateMemberId`: two builders with one member id |
//! | `missing-topology` | `ProducerError::Topology(Missing)`: a producer for a stream nobody created |
//! | `from-env` | whatever `Runtime::from_env()` with the annotated `on_order` listener returns (a URL that does not parse, an invalid or unknown variable, a refused or unreachable Redis) |
//! | `unreachable` | `RuntimeError::Unreachable`: nothing listens, and the start gives up after 300 ms |
//! | `stuck` | runs a listener whose handler never returns until SIGINT/SIGTERM; prints `handling` on stdout when it is in the handler and logs to stderr; a second signal forces the stuck shutdown |

use std::process::{ExitCode, Termination};
use std::time::Duration;

use stream_listener::{
    stream_listener, ConsumerBuilder, Message, Producer, ProducerError, Runtime, RuntimeError,
};

/// The listener of the typo (`STREAM_LISTENER_ON_ORDR_GROUP`), for the `from-env` runs.
#[stream_listener(stream = "orders", group = "billing")]
async fn on_order(_msg: Message<u64>) -> Result<(), std::io::Error> {
    Ok(())
}

fn builder(member_id: &str) -> ConsumerBuilder {
    ConsumerBuilder::new("orders", "billing")
        .member_id(member_id)
        .handler(|_msg: Message<u64>| async { Ok::<(), String>(()) })
}

fn url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

async fn duplicate_member_id() -> Result<(), RuntimeError> {
    Runtime::new(url())
        .without_annotated_listeners()
        .consumer(builder("pod-1"))
        .consumer(builder("pod-1"))
        .run()
        .await
}

async fn missing_topology() -> Result<(), ProducerError> {
    Producer::connect(&url(), "nobody-made-me").await.map(drop)
}

async fn unreachable() -> Result<(), RuntimeError> {
    Runtime::new("redis://127.0.0.1:1/")
        .without_annotated_listeners()
        .consumer(builder("pod-1"))
        .startup_timeout(Duration::from_millis(300))
        .run()
        .await
}

async fn stuck() -> Result<(), RuntimeError> {
    let url = url();
    let producer = Producer::connect_creating(&url, "stuck", 1)
        .await
        .expect("the test's Redis answers");
    producer.send("k", &1u64).await.expect("sent");
    Runtime::new(url)
        .without_annotated_listeners()
        // Long enough that only the second signal can end the shutdown within the test's bound.
        .shutdown_timeout(Duration::from_secs(120))
        .consumer(
            ConsumerBuilder::new("stuck", "g")
                .member_id("stuck-1")
                .handler(|_msg: Message<u64>| async {
                    println!("handling");
                    std::future::pending::<()>().await;
                    Ok::<(), String>(())
                }),
        )
        .run()
        .await
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    if mode == "stuck" {
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // `Termination::report` is what Rust does with the `Result` a `main` returns: `Error: {:?}` on stderr.
    match mode.as_str() {
        "duplicate-member-id" => runtime.block_on(duplicate_member_id()).report(),
        "missing-topology" => runtime.block_on(missing_topology()).report(),
        "from-env" => runtime.block_on(Runtime::from_env().run()).report(),
        "unreachable" => runtime.block_on(unreachable()).report(),
        "stuck" => runtime.block_on(stuck()).report(),
        other => {
            eprintln!("unknown mode {other:?}");
            ExitCode::from(2)
        }
    }
}
