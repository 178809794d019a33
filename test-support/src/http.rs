//! A plain blocking HTTP `GET`, for tests of the probe server and the lag exporter: probes run on OS
//! threads, as a kubelet's would, so a handler that stalls the runtime cannot stall the probing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `(status code, body)` of `GET path` on `addr` (connect within 2 s, answer within 10 s; the servers
/// tested close the connection after a response). Status 0: no status line.
///
/// # Panics
/// If the server cannot be reached or does not answer in time.
pub fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}
