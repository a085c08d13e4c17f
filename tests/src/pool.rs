//! A pool-manager stand-in: receives ready callbacks, records what workers advertise, and picks
//! a worker for a request the way pool-managerd does (capability, worker type, memory
//! architecture, then the most free memory).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http;

/// What a request needs from a worker.
#[derive(Debug, Clone, Default)]
pub struct Requirement {
    /// A capability the worker must advertise (`text-gen`).
    pub capability: String,
    /// `worker_type`, when it matters.
    pub worker_type: Option<String>,
    /// `memory_architecture`, when it matters (`vram-only` for GPU-resident weights).
    pub memory_architecture: Option<String>,
    /// Bytes the job needs beyond the worker's current use.
    pub min_free_bytes: u64,
}

/// One callback as received, with the `/health` the stand-in fetched while handling it.
#[derive(Debug, Clone)]
pub struct Registration {
    /// The callback body.
    pub payload: Value,
    /// `/health` of the worker at `uri`, fetched before answering the callback.
    pub health: Option<Value>,
}

/// The stand-in pool manager, listening on an ephemeral port.
pub struct Pool {
    /// Where it listens.
    pub addr: SocketAddr,
    registrations: Arc<Mutex<Vec<Registration>>>,
}

impl Pool {
    /// Starts listening; every callback is answered with `status`.
    pub fn start(status: u16) -> Pool {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|err| panic!("bind: {err}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|err| panic!("addr: {err}"));
        let registrations = Arc::new(Mutex::new(Vec::new()));
        let shared = registrations.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                if let Some(registration) = handle(stream, status) {
                    shared
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(registration);
                }
            }
        });
        Pool {
            addr,
            registrations,
        }
    }

    /// The callback URL to give a worker.
    pub fn callback_url(&self) -> String {
        format!("http://{}/v1/workers/ready", self.addr)
    }

    /// Waits for `n` registrations (at most `timeout`).
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Registration> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.registrations();
            if seen.len() >= n || Instant::now() >= deadline {
                return seen;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Registrations so far.
    pub fn registrations(&self) -> Vec<Registration> {
        self.registrations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The worker (its callback payload) that should take a request with `need`, if any.
    pub fn pick(&self, need: &Requirement) -> Option<Value> {
        self.registrations()
            .into_iter()
            .map(|registration| registration.payload)
            .filter(|worker| fits(worker, need))
            .max_by_key(free_bytes)
    }
}

fn fits(worker: &Value, need: &Requirement) -> bool {
    let has_capability = worker["capabilities"]
        .as_array()
        .is_some_and(|caps| caps.iter().any(|cap| cap == need.capability.as_str()));
    let type_ok = need
        .worker_type
        .as_ref()
        .is_none_or(|wanted| worker["worker_type"] == wanted.as_str());
    let memory_ok = need
        .memory_architecture
        .as_ref()
        .is_none_or(|wanted| worker["memory_architecture"] == wanted.as_str());
    has_capability && type_ok && memory_ok && free_bytes(worker) >= need.min_free_bytes
}

/// Free memory as the pool sees it: a CPU worker's host memory is not tracked by the worker, so
/// only GPU workers report a budget (`vram_bytes`); CPU workers are treated as unbounded.
fn free_bytes(worker: &Value) -> u64 {
    match worker["memory_architecture"].as_str() {
        Some("cpu") => u64::MAX,
        _ => worker["vram_bytes"].as_u64().unwrap_or(0),
    }
}

fn handle(mut stream: TcpStream, status: u16) -> Option<Registration> {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut length = 0;
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((name, value)) = trimmed.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let payload: Value = serde_json::from_slice(&body).ok()?;
    let health = payload["uri"]
        .as_str()
        .and_then(|uri| uri.strip_prefix("http://"))
        .and_then(|host| host.parse().ok())
        .and_then(|addr| http::get(addr, "/health").ok())
        .map(|response| response.json());
    let reply = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    let _ = stream.write_all(reply.as_bytes());
    Some(Registration { payload, health })
}
