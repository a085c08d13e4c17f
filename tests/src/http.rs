//! A small blocking HTTP/1.1 client over `TcpStream` for black-box tests: every byte sent is
//! under the test's control (wrong content types, oversized or malformed bodies, hanging up in
//! the middle of a stream), and SSE responses are read event by event as they arrive.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A complete response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked).
    pub body: Vec<u8>,
}

impl Response {
    /// The first header called `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|err| {
            panic!("not JSON ({err}): {}", String::from_utf8_lossy(&self.body))
        })
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request with `Connection: close`; `headers` are added as given.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    let mut reader = send(addr, method, path, headers, body)?;
    let (status, headers) = read_head(&mut reader)?;
    let mut body = Vec::new();
    body_reader(reader, &headers).read_to_end(&mut body)?;
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// `GET path`.
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    request(addr, "GET", path, &[], b"")
}

/// `POST path` with a JSON body.
pub fn post_json(
    addr: SocketAddr,
    path: &str,
    body: &serde_json::Value,
) -> std::io::Result<Response> {
    let headers = [("Content-Type", "application/json")];
    request(addr, "POST", path, &headers, body.to_string().as_bytes())
}

/// A POST without a body (`/cancel/{id}`, `/shutdown`), sent as JSON as every POST must be.
pub fn post_empty(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        b"",
    )
}

fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<BufReader<TcpStream>> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes())?;
    // A server may answer (413) and close before reading a large body; that is not our error.
    let _ = stream.write_all(body);
    Ok(BufReader::new(stream))
}

fn read_head(reader: &mut impl BufRead) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    Ok((status, headers))
}

fn body_reader(reader: BufReader<TcpStream>, headers: &[(String, String)]) -> Box<dyn Read + Send> {
    let chunked = headers
        .iter()
        .any(|(name, value)| name == "transfer-encoding" && value.contains("chunked"));
    if chunked {
        Box::new(Chunked {
            inner: reader,
            left: 0,
            done: false,
        })
    } else {
        Box::new(reader)
    }
}

/// Decodes `Transfer-Encoding: chunked`.
struct Chunked<R> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            self.inner.read_line(&mut line)?;
            if line.is_empty() {
                self.done = true;
                return Ok(0);
            }
            let size = line.trim().split(';').next().unwrap_or("0");
            self.left = usize::from_str_radix(size, 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size {line:?}")))?;
            if self.left == 0 {
                self.done = true;
                return Ok(0);
            }
        }
        let n = out.len().min(self.left);
        let n = self.inner.read(&mut out[..n])?;
        self.left -= n;
        if self.left == 0 {
            let mut crlf = [0u8; 2];
            self.inner.read_exact(&mut crlf)?;
        }
        Ok(n)
    }
}

/// One server-sent event.
#[derive(Debug, Clone)]
pub struct SseEvent {
    /// The `event:` field.
    pub event: String,
    /// The `data:` JSON.
    pub data: serde_json::Value,
}

/// An open `/execute` response: the head, then events as they arrive. Dropping it closes the
/// connection (the client hanging up).
pub struct EventStream {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    lines: BufReader<Box<dyn Read + Send>>,
    /// Keep-alive comments seen.
    pub comments: usize,
}

impl EventStream {
    /// POSTs `body` to `path` and reads the head.
    pub fn open(addr: SocketAddr, path: &str, body: &serde_json::Value) -> std::io::Result<Self> {
        let headers = [("Content-Type", "application/json")];
        let mut reader = send(addr, "POST", path, &headers, body.to_string().as_bytes())?;
        let (status, headers) = read_head(&mut reader)?;
        let lines = BufReader::new(body_reader(reader, &headers));
        Ok(Self {
            status,
            headers,
            lines,
            comments: 0,
        })
    }

    /// The rest of the body as text (for error responses).
    pub fn rest(mut self) -> String {
        let mut text = String::new();
        let _ = self.lines.read_to_string(&mut text);
        text
    }

    /// The next event, `None` at the end of the stream; panics on malformed frames.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        let (mut event, mut data) = (None, None);
        loop {
            let mut line = String::new();
            match self.lines.read_line(&mut line) {
                Ok(0) => {
                    assert!(
                        event.is_none() && data.is_none(),
                        "stream ended inside a frame"
                    );
                    return None;
                }
                Ok(_) => {}
                Err(err) => panic!("reading the stream: {err}"),
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                match (event.take(), data.take()) {
                    (Some(event), Some(data)) => return Some(SseEvent { event, data }),
                    (None, None) => continue,
                    frame => panic!("incomplete frame {frame:?}"),
                }
            } else if line.starts_with(':') {
                self.comments += 1;
            } else if let Some(name) = line.strip_prefix("event: ") {
                event = Some(name.to_owned());
            } else if let Some(json) = line.strip_prefix("data: ") {
                let value = serde_json::from_str(json)
                    .unwrap_or_else(|err| panic!("data is not JSON ({err}): {json}"));
                data = Some(value);
            } else {
                panic!("unexpected SSE line {line:?}");
            }
        }
    }

    /// Every remaining event.
    pub fn collect(mut self) -> Vec<SseEvent> {
        std::iter::from_fn(|| self.next_event()).collect()
    }
}
