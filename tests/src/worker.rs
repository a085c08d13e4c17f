//! A real worker process for black-box tests: spawned from the built binary, its JSON log lines
//! collected, its port read from the `startup` line.
//!
//! `LLORCH_TEST_WORKER` picks the binary (`llorch-cpud` by default, `worker-orcd` on a GPU
//! host), so one contract test suite covers both workers.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::assets::Model;
use crate::bins::binary;
use crate::http;

/// Runs the black-box tests of one test binary one at a time: each worker takes both cores.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A ready worker on SmolLM2 with `args`.
pub fn smollm2(args: &[&str]) -> Worker {
    Worker::ready(&Model::SmolLm2.path(), args)
}

/// The worker binary under test.
pub fn worker_binary() -> String {
    std::env::var("LLORCH_TEST_WORKER").unwrap_or_else(|_| "llorch-cpud".into())
}

/// The arguments for `binary`: `--threads` is a CPU flag, so it is dropped for other workers;
/// the CPU worker gets one compute thread unless the test asks for more, so a test does not
/// fight the test harness for cores.
fn worker_args(binary: &str, args: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if *arg == "--threads" && binary != "llorch-cpud" {
            rest.next();
            continue;
        }
        out.push((*arg).to_owned());
    }
    if binary == "llorch-cpud" && !args.contains(&"--threads") {
        out.extend(["--threads".to_owned(), "1".to_owned()]);
    }
    out
}

/// A running worker; killed when dropped.
pub struct Worker {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Worker {
    /// Starts the worker on `model` with `args` and waits for its listener (not for the model).
    pub fn spawn(model: &Path, args: &[&str]) -> Worker {
        Self::spawn_with_env(model, args, &[])
    }

    /// [`Worker::spawn`] with extra environment variables (test-only triggers).
    pub fn spawn_with_env(model: &Path, args: &[&str], env: &[(&str, &str)]) -> Worker {
        Self::launch(model, args, env, None)
    }

    /// [`Worker::ready`] under a soft descriptor limit of `descriptors` from its start: run
    /// through `prlimit`, which sets it and execs the worker in its own process.
    pub fn ready_with_descriptor_limit(model: &Path, args: &[&str], descriptors: u64) -> Worker {
        let worker = Self::launch(model, args, &[], Some(descriptors));
        worker.wait_ready();
        worker
    }

    fn launch(
        model: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        descriptors: Option<u64>,
    ) -> Worker {
        let name = worker_binary();
        let mut command = match descriptors {
            Some(limit) => {
                let mut command = Command::new("prlimit");
                command
                    .arg(format!("--nofile={limit}:"))
                    .arg("--")
                    .arg(binary(&name));
                command
            }
            None => Command::new(binary(&name)),
        };
        command
            .arg("--model")
            .arg(model)
            .args(worker_args(&name, args))
            .envs(env.iter().copied())
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {name}: {err}"));
        let logs = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        for pipe in [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let logs = logs.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    logs.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                }
            }));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = loop {
            let found = Self::find_log(&logs, |line| line["event"] == "startup")
                .and_then(|line| line["address"].as_str().and_then(|a| a.parse().ok()));
            if let Some(addr) = found {
                break addr;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "{name} exited with {status} before listening: {:?}",
                    logs.lock().map(|l| l.clone())
                );
            }
            assert!(Instant::now() < deadline, "{name} did not log its address");
            std::thread::sleep(Duration::from_millis(10));
        };
        Worker {
            child,
            addr,
            logs,
            readers,
        }
    }

    /// Starts the worker and waits until `/health` answers 200.
    pub fn ready(model: &Path, args: &[&str]) -> Worker {
        let worker = Self::spawn(model, args);
        worker.wait_ready();
        worker
    }

    /// Polls `/health` until 200 (at most 120 s), then waits (at most 5 s) for the grammar
    /// compiler, which the worker builds on a thread of its own after `ready`: the tests that
    /// measure memory take their baseline from a worker whose start-up is over.
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(response) = http::get(self.addr, "/health")
                && response.status == 200
            {
                let built = |line: &Value| {
                    matches!(
                        line["event"].as_str(),
                        Some("grammars_ready" | "grammars_unavailable")
                    )
                };
                self.wait_for_log(built);
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not ready in time: {:?}",
                self.log_lines()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn find_log(logs: &Mutex<Vec<String>>, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        let lines = logs.lock().unwrap_or_else(|e| e.into_inner());
        lines
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|line| pred(line))
    }

    /// Every output line so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.logs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The JSON log lines so far.
    pub fn logs(&self) -> Vec<Value> {
        self.log_lines()
            .iter()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// The first JSON log line matching `pred`, waiting up to 5 s for the log reader.
    pub fn wait_for_log(&self, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let found = Self::find_log(&self.logs, &pred);
            if found.is_some() || Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sets the running worker's soft descriptor limit (`prlimit --pid`).
    pub fn set_descriptor_limit(&self, descriptors: u64) {
        set_descriptor_limit(self.pid(), descriptors);
    }

    /// How many descriptors the worker has open (`/proc/<pid>/fd`).
    pub fn open_descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|entries| entries.count())
            .unwrap_or_else(|err| panic!("reading the worker's descriptors: {err}"))
    }

    /// Resident set size from `/proc/<pid>/status`.
    pub fn rss_bytes(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        assert!(status.is_ok_and(|s| s.success()), "kill -TERM failed");
    }

    /// Waits for the process to exit (at most `timeout`), then for its last log lines.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                for reader in self.readers.drain(..) {
                    let _ = reader.join();
                }
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Sets the soft descriptor limit of process `pid` (`prlimit`, util-linux); panics when it fails.
fn set_descriptor_limit(pid: u32, descriptors: u64) {
    let status = Command::new("prlimit")
        .args([
            "--pid",
            &pid.to_string(),
            &format!("--nofile={descriptors}:"),
        ])
        .status()
        .unwrap_or_else(|err| panic!("cannot run prlimit (util-linux): {err}"));
    assert!(
        status.success(),
        "prlimit --pid {pid} --nofile={descriptors}: failed: {status}"
    );
}

/// Raises this test process's soft descriptor limit to `descriptors` when it is lower, for tests
/// that hold many sockets; panics when the hard limit does not allow it.
pub fn raise_own_descriptor_limit(descriptors: u64) {
    let limits = std::fs::read_to_string("/proc/self/limits")
        .unwrap_or_else(|err| panic!("reading /proc/self/limits: {err}"));
    let soft = limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|soft| match soft {
            "unlimited" => Some(u64::MAX),
            number => number.parse::<u64>().ok(),
        })
        .unwrap_or_else(|| panic!("no open-file limit in /proc/self/limits: {limits}"));
    if soft < descriptors {
        set_descriptor_limit(std::process::id(), descriptors);
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
