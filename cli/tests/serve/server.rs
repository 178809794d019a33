//! `stream-listener serve` as a child process on a free loopback port (the address it prints).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The server process, killed on drop.
#[derive(Debug)]
pub struct Server {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `stream-listener --redis-url url serve --listen 127.0.0.1:0 args..` and waits (20 s at
    /// most) for the address it prints.
    pub fn start(url: &str, args: &[&str]) -> Self {
        Self::start_at(url, "127.0.0.1:0", args)
    }

    /// [`start`](Self::start) on `listen` (a restart on the address of a server that is gone).
    pub fn start_at(url: &str, listen: &str, args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_stream-listener"))
            .args(["--redis-url", url, "serve", "--listen", listen])
            .args(args)
            .env_remove("REDIS_URL")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run the binary");
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .expect("the server prints where it listens");
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|a| a.trim_end_matches(':').parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Self { child, addr }
    }

    /// `http://addr`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sends SIGTERM and waits for the process to exit; its exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        self.child.wait().unwrap()
    }
}

/// `GET url` with an optional `Authorization`: the status and the body as JSON (`null` when empty).
pub fn get_json(url: &str, authorization: Option<&str>) -> (u16, serde_json::Value) {
    let (status, _, body) = request_with("GET", url, None, authorization);
    let value = if body.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
    };
    (status, value)
}

/// `Authorization: Basic` of `user:password`.
pub fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// `(status, headers as lowercase name -> value, body)` of one request, never failing on a status.
pub fn request(
    method: &str,
    url: &str,
    body: Option<&[u8]>,
) -> (u16, Vec<(String, String)>, String) {
    request_with(method, url, body, None)
}

/// [`request`] with an `Authorization` header.
pub fn request_with(
    method: &str,
    url: &str,
    body: Option<&[u8]>,
    authorization: Option<&str>,
) -> (u16, Vec<(String, String)>, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into();
    let authorization = authorization.unwrap_or_default();
    let mut response = match (method, body) {
        ("GET", _) if authorization.is_empty() => agent.get(url).call(),
        ("GET", _) => agent.get(url).header("authorization", authorization).call(),
        ("DELETE", body) => {
            let mut delete = agent
                .delete(url)
                .force_send_body()
                .header("content-type", "application/json");
            if !authorization.is_empty() {
                delete = delete.header("authorization", authorization);
            }
            delete.send(body.unwrap_or_default())
        }
        (_, body) => {
            let mut post = agent.post(url).header("content-type", "application/json");
            if !authorization.is_empty() {
                post = post.header("authorization", authorization);
            }
            match body {
                Some(body) => post.send(body),
                None => post.send_empty(),
            }
        }
    }
    .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let text = response
        .body_mut()
        .with_config()
        .limit(16 << 20)
        .read_to_string()
        .unwrap_or_default();
    (status, headers, text)
}
