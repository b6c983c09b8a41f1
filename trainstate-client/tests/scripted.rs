//! A real HTTP/1.1 server on a loopback port that answers each request
//! with the next answer of a script, and counts what it was asked.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// One scripted answer: an HTTP status and a JSON body.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: String,
}

impl Answer {
    /// `status` with `body`.
    pub(crate) fn new(status: u16, body: impl Into<String>) -> Self {
        Self { status, body: body.into() }
    }

    /// The head's error answer for `code`: its status, `{"error": body}`.
    pub(crate) fn error(body: &trainstate_schema::api::ErrorBody) -> Self {
        let answer = serde_json::json!({ "error": body });
        Self::new(body.code.http_status(), answer.to_string())
    }
}

/// The server: its URL and how many requests it has read.
pub(crate) struct Scripted {
    pub(crate) url: String,
    requests: Arc<AtomicUsize>,
    paths: Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Scripted {
    /// Serves `script` in order; once it is spent, every request gets its
    /// last answer again.
    pub(crate) async fn start(script: Vec<Answer>) -> Self {
        assert!(!script.is_empty(), "a script of no answers");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let paths = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (count, seen) = (requests.clone(), paths.clone());
        let task = tokio::spawn(async move {
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                let (script, count, seen) = (script.clone(), count.clone(), seen.clone());
                tokio::spawn(async move {
                    let mut socket = BufReader::new(socket);
                    // Keep-alive: one connection may carry several requests.
                    while let Some(path) = read_request(&mut socket).await {
                        seen.lock().unwrap().push(path);
                        let n = count.fetch_add(1, Ordering::SeqCst);
                        let answer = &script[n.min(script.len() - 1)];
                        let head = format!(
                            "HTTP/1.1 {} X\r\ncontent-type: application/json\r\n\
                             content-length: {}\r\n\r\n",
                            answer.status,
                            answer.body.len()
                        );
                        let socket = socket.get_mut();
                        if socket.write_all(head.as_bytes()).await.is_err()
                            || socket.write_all(answer.body.as_bytes()).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        Self { url, requests, paths, task }
    }

    /// How many requests were read so far.
    pub(crate) fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// The request lines read so far (`GET /api/version`).
    pub(crate) fn request_lines(&self) -> Vec<String> {
        self.paths.lock().unwrap().clone()
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request (its headers and a `content-length` body); returns
/// its request line without the version, or `None` at the end of the
/// connection.
async fn read_request(socket: &mut BufReader<tokio::net::TcpStream>) -> Option<String> {
    let mut line = String::new();
    if socket.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let request_line = line.trim_end().rsplit_once(' ').map(|(l, _)| l.to_owned())?;
    let mut length = 0;
    loop {
        let mut header = String::new();
        if socket.read_line(&mut header).await.ok()? == 0 {
            return None;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length];
    socket.read_exact(&mut body).await.ok()?;
    Some(request_line)
}
