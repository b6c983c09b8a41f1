//! Guards of the HTTP layer against malformed, oversized, slow or
//! misdirected requests: bearer schemes, body and header bounds, the
//! connection cap, DNS rebinding (see docs/reliability.md).

use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use trainstate_actor::StateConfig;
use trainstate_actor::http::HttpConfig;
use trainstate_schema::RunId;

use crate::common::{Server, run_with, unique_name};
use crate::contract::check_answer;

const T0: u64 = 1_760_000_000_000;

async fn server(http: HttpConfig) -> Server {
    Server::start(StateConfig::in_memory().with_name(unique_name("guards")), http).await
}

/// Sends `request` (built by the caller, for headers `send` does not set)
/// and checks the answer against the document.
async fn send_raw(
    method: Method,
    url: &str,
    request: reqwest::RequestBuilder,
) -> (StatusCode, Value) {
    let response = request.send().await.unwrap();
    let status = response.status();
    let bytes = response.bytes().await.unwrap();
    check_answer(&method, url, status, &bytes);
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn regression_lower_case_bearer_scheme_is_accepted() {
    let server = server(HttpConfig::default().with_token(Some("s3cret".into()))).await;
    let client = Client::new();
    let runs = format!("{}/api/train/runs", server.url);
    for (i, scheme) in ["bearer", "BEARER", "Bearer", "bEaReR"].into_iter().enumerate() {
        let run = run_with(&RunId::new_v7(), &format!("case{i}"), "job1", T0, 2);
        let request = client
            .post(&runs)
            .header("content-type", "application/json")
            .header("authorization", format!("{scheme} s3cret"))
            .body(serde_json::to_vec(&run).unwrap());
        let (status, body) = send_raw(Method::POST, &runs, request).await;
        assert_eq!(status, StatusCode::CREATED, "{scheme}: {body}");
    }
    let request = client
        .post(&runs)
        .header("content-type", "application/json")
        .header("authorization", "bearer wrong")
        .body(serde_json::to_vec(&run_with(&RunId::new_v7(), "x", "job1", T0, 2)).unwrap());
    let (status, body) = send_raw(Method::POST, &runs, request).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "unauthorized");
    server.stop().await;
}

/// Reads one HTTP/1.1 answer (headers and a `content-length` body) from a
/// raw socket; `None` if the server closed the connection first.
pub(crate) async fn read_answer(
    stream: &mut tokio::net::TcpStream,
) -> Option<(StatusCode, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let status: u16 = head.split(' ').nth(1)?.parse().ok()?;
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            while buf.len() < end + 4 + length {
                let n = stream.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = buf[end + 4..end + 4 + length].to_vec();
            return Some((StatusCode::from_u16(status).unwrap(), body));
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A guard on a wait that must end by itself; not a margin the test needs.
const HANG: std::time::Duration = std::time::Duration::from_secs(60);

#[tokio::test]
async fn regression_over_limit_content_length_is_refused_at_once() {
    use tokio::io::AsyncWriteExt;
    // A deadline far longer than the guard: an answer can only come from
    // the header check, not from the request deadline (the old 503 after 30 s).
    let http = HttpConfig::default()
        .with_max_body_bytes(1024)
        .with_request_timeout(std::time::Duration::from_secs(3600));
    let server = server(http).await;
    let url = format!("{}/api/train/runs", server.url);
    let mut stream =
        tokio::net::TcpStream::connect(server.url.trim_start_matches("http://")).await.unwrap();
    stream
        .write_all(
            b"POST /api/train/runs HTTP/1.1\r\nhost: 127.0.0.1\r\n\
              content-type: application/json\r\ncontent-length: 1025\r\n\r\n",
        )
        .await
        .unwrap();
    let (status, body) = tokio::time::timeout(HANG, read_answer(&mut stream))
        .await
        .expect("the 413 comes without the body being sent")
        .expect("an answer");
    check_answer(&Method::POST, &url, status, &body);
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "payload_too_large");
    drop(stream);
    server.stop().await;
}

/// The bound on bodies counts bytes, not requests: a burst of 64 small
/// registrations, all waiting on one commit at once (the writer is held),
/// is taken whole. A bound of 16 bodies refused 48 of them with 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_burst_of_small_registrations_is_not_refused_by_the_body_bound() {
    let faults = std::sync::Arc::new(trainstate_actor::Faults::default());
    let config =
        StateConfig::in_memory().with_name(unique_name("burst")).with_faults(faults.clone());
    let server = Server::start(config, HttpConfig::default()).await;
    let url = format!("{}/api/train/runs", server.url);
    let client = Client::new();
    faults.hold_writer();
    let posts: Vec<_> = (0..64)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let run = run_with(&RunId::new_v7(), &format!("burst{i}"), "job1", T0, 8);
                let body = serde_json::to_vec(&run).unwrap();
                crate::contract::send(
                    &client,
                    Method::POST,
                    &url,
                    Some(("application/json", body)),
                    None,
                )
                .await
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + HANG;
    while server.service.in_flight_writes() < 64 {
        assert!(std::time::Instant::now() < deadline, "the 64 registrations never all waited");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    faults.release_writer();
    for post in posts {
        let (status, body) = post.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    assert_eq!(server.service.run_count(), 64);
    server.stop().await;
}

/// The bytes of bodies received at once are bounded, counted as they
/// arrive (each body's first 64 KiB aside): two uploads that sent 512 KiB
/// each past that and stalled spend a budget of 1 MiB; a large write is
/// then refused with `overloaded`, a small one is served, and the large
/// one is served again once a stalled upload gives up.
#[tokio::test]
async fn regression_concurrent_request_bodies_are_bounded() {
    use tokio::io::AsyncWriteExt;
    let hour = std::time::Duration::from_secs(3600);
    let http = HttpConfig::default()
        .with_max_body_bytes_in_flight(1 << 20)
        .with_body_read_timeout(hour)
        .with_request_timeout(hour);
    let server = server(http).await;
    let url = format!("{}/api/train/runs", server.url);
    let addr = server.url.trim_start_matches("http://").to_owned();
    let upload = |sent: usize| {
        let addr = addr.clone();
        async move {
            let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
            stream
                .write_all(
                    b"POST /api/train/runs HTTP/1.1\r\nhost: 127.0.0.1\r\n\
                      content-type: application/json\r\ncontent-length: 4000000\r\n\r\n",
                )
                .await
                .unwrap();
            stream.write_all(&vec![b' '; sent]).await.unwrap();
            stream
        }
    };
    let mut stalled = Vec::new();
    for _ in 0..2 {
        stalled.push(upload((64 + 512) << 10).await);
    }
    let budget = "trainstate_http_request_body_budget_bytes";
    crate::http_bounds::wait_for_metric(&server, budget, 1 << 20, false).await;
    // A large write is refused as soon as its bytes pass its free 64 KiB.
    let mut large = upload((64 + 100) << 10).await;
    let (status, body) = tokio::time::timeout(HANG, read_answer(&mut large))
        .await
        .expect("a write past the budget is refused at once")
        .expect("an answer");
    check_answer(&Method::POST, &url, status, &body);
    let refused: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(refused["error"]["code"], "overloaded", "{refused}");
    // A small one is served meanwhile.
    let client = Client::new();
    let run = run_with(&RunId::new_v7(), "small", "job1", T0, 2);
    let body = Some(("application/json", serde_json::to_vec(&run).unwrap()));
    let (status, answer) = crate::contract::send(&client, Method::POST, &url, body, None).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    // A stalled upload that gives up frees its bytes.
    stalled.pop();
    crate::http_bounds::wait_for_metric(&server, budget, 512 << 10, false).await;
    let large = crate::http_bounds::registration_of(300 << 10);
    assert!(large.len() > (64 + 100) << 10, "{} bytes", large.len());
    let (status, answer) =
        crate::contract::send(&client, Method::POST, &url, Some(("application/json", large)), None)
            .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    drop(stalled);
    server.stop().await;
}

#[tokio::test]
async fn regression_half_sent_headers_are_cut_off_by_the_header_read_timeout() {
    use tokio::io::AsyncWriteExt;
    let http =
        HttpConfig::default().with_header_read_timeout(std::time::Duration::from_millis(200));
    let server = server(http).await;
    let mut stream =
        tokio::net::TcpStream::connect(server.url.trim_start_matches("http://")).await.unwrap();
    stream.write_all(b"GET /api/train/runs HTTP/1.1\r\nhost: 127.0").await.unwrap();
    // The head closes the connection by itself (it never would before).
    let answer = tokio::time::timeout(HANG, read_answer(&mut stream))
        .await
        .expect("the head must close a connection whose headers never finish");
    assert!(answer.is_none(), "no answer to a request never sent: {answer:?}");
    server.stop().await;
}

#[tokio::test]
async fn regression_connections_beyond_the_cap_wait_for_a_free_place() {
    use tokio::io::AsyncWriteExt;
    let server = server(HttpConfig::default().with_max_connections(1)).await;
    let url = format!("{}/healthz", server.url);
    // Connection A holds the only place with a request in flight: an open
    // event stream, which is never closed to make room.
    let mut a = connect_from("127.0.0.1", &server).await;
    a.write_all(b"GET /api/train/events HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").await.unwrap();
    let head = read_head(&mut a).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // B waits in the backlog while A's stream is open, well past the time
    // a waiting connection would have been closed for it...
    let mut b = tokio::spawn(async move {
        crate::contract::send(&Client::new(), Method::GET, &url, None, None).await
    });
    let waited = tokio::time::timeout(std::time::Duration::from_secs(3), &mut b).await;
    assert!(waited.is_err(), "a second connection was served beside an open stream");
    // ...and is served once A closes.
    drop(a);
    let (status, _) = tokio::time::timeout(HANG, b).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}

/// A connection to `server` from the loopback address `from` (any of
/// 127.0.0.0/8 is this machine), as a client on another host would be.
async fn connect_from(from: &str, server: &Server) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let to = server.url.trim_start_matches("http://").parse().unwrap();
    socket.connect(to).await.unwrap()
}

/// Reads an answer's status line and headers (for a streamed answer).
async fn read_head(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(HANG, stream.read(&mut byte)).await.unwrap().unwrap();
        assert_ne!(n, 0, "closed before an answer: {}", String::from_utf8_lossy(&buf));
        buf.push(byte[0]);
    }
    String::from_utf8(buf).unwrap()
}

/// Waits until the head closes `stream` (reads give end of file).
async fn closed_by_head(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut sink = [0u8; 1024];
    while !matches!(stream.read(&mut sink).await, Ok(0) | Err(_)) {}
}

/// A slow client's connection from `from`, over and over: it opens, sends
/// half a request's headers, and opens again as soon as it is closed.
/// Counts the times it opened and was closed.
fn slow_client(
    from: &'static str,
    server: &Server,
    opened: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    closed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    use tokio::io::AsyncWriteExt;
    let url = server.url.clone();
    tokio::spawn(async move {
        loop {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
            let Ok(mut stream) =
                socket.connect(url.trim_start_matches("http://").parse().unwrap()).await
            else {
                return;
            };
            let _ = stream.write_all(b"GET /api/train/runs HTTP/1.1\r\nhost: 127.0").await;
            opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            closed_by_head(stream).await;
            closed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    })
}

#[tokio::test]
async fn regression_slow_connections_from_several_addresses_give_way_to_another_client() {
    use tokio::io::AsyncWriteExt;
    // Only making room can free a place: the header-read timeout is far
    // longer than the test waits.
    let http = HttpConfig::default()
        .with_max_connections(32)
        .with_max_connections_per_client(8)
        .with_header_read_timeout(std::time::Duration::from_secs(600));
    let server = server(http).await;
    // Eight slow connections from each of six addresses: more than the cap.
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let closed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let addresses = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7"];
    let slow: Vec<_> = addresses
        .iter()
        .flat_map(|from| (0..8).map(|_| slow_client(from, &server, opened.clone(), closed.clone())))
        .collect();
    // Every slow connection is open (the kernel queues those beyond the
    // cap) before the other client's, which queues behind them.
    let all_open = async {
        while opened.load(std::sync::atomic::Ordering::Relaxed) < slow.len() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(HANG, all_open).await.unwrap();
    // Another client's request is answered all the same...
    let mut other = connect_from("127.0.0.9", &server).await;
    other.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").await.unwrap();
    let answer = tokio::time::timeout(std::time::Duration::from_secs(30), read_answer(&mut other))
        .await
        .expect("another client waited behind slow connections until their timeout");
    assert_eq!(answer.map(|(status, _)| status), Some(StatusCode::OK));
    // ...because slow connections were closed to make room for it.
    let some_closed = async {
        while closed.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(HANG, some_closed).await.expect("no slow connection was closed");
    for task in slow {
        task.abort();
    }
    server.stop().await;
}

#[tokio::test]
async fn regression_idle_connections_give_way_when_the_cap_is_nearly_full() {
    use tokio::io::AsyncWriteExt;
    let http = HttpConfig::default()
        .with_max_connections(4)
        .with_header_read_timeout(std::time::Duration::from_secs(600));
    let server = server(http).await;
    let request = b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n";
    // Four kept-alive connections, each served once and then idle: every place.
    let mut idle = Vec::new();
    for _ in 0..4 {
        let mut stream = connect_from("127.0.0.2", &server).await;
        stream.write_all(request).await.unwrap();
        assert_eq!(read_answer(&mut stream).await.map(|a| a.0), Some(StatusCode::OK));
        idle.push(stream);
    }
    // A new client is served without waiting for the idle timeout...
    let mut other = connect_from("127.0.0.3", &server).await;
    other.write_all(request).await.unwrap();
    let answer = tokio::time::timeout(std::time::Duration::from_secs(30), read_answer(&mut other))
        .await
        .expect("a new client waited behind idle connections until their timeout");
    let (status, body) = answer.expect("an answer");
    assert_eq!(status, StatusCode::OK);
    // Sized answers keep their `content-length` (not chunked): the body is
    // read by it.
    assert!(serde_json::from_slice::<Value>(&body).is_ok(), "{}", String::from_utf8_lossy(&body));
    // ...because an idle one was closed for it (the oldest first).
    let first = idle.remove(0);
    tokio::time::timeout(HANG, closed_by_head(first)).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn regression_dns_rebinding_host_is_refused_without_a_token() {
    let runs_of = |server: &Server| format!("{}/api/train/runs", server.url);
    let get = |url: String, host: &'static str| async move {
        let request = Client::new().get(&url).header("host", host);
        send_raw(Method::GET, &url, request).await
    };
    // No token: only the head's own names are served.
    let open = server(HttpConfig::default()).await;
    let url = runs_of(&open);
    for host in ["evil.example", "evil.example:8266", "127.0.0.1.nip.io"] {
        let (status, body) = get(url.clone(), host).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{host}: {body}");
        assert_eq!(body["error"]["code"], "misdirected_request", "{host}");
    }
    for host in ["localhost:8266", "127.0.0.1", "[::1]:8266"] {
        let (status, body) = get(url.clone(), host).await;
        assert_eq!(status, StatusCode::OK, "{host}: {body}");
    }
    let (status, _) = crate::contract::send(&Client::new(), Method::GET, &url, None, None).await;
    assert_eq!(status, StatusCode::OK, "the listen address itself");
    open.stop().await;
    // `--insecure`, or a token, lifts it.
    for http in [
        HttpConfig::default().with_any_host(true),
        HttpConfig::default().with_token(Some("s3cret".into())),
    ] {
        let server = server(http).await;
        let (status, body) = get(runs_of(&server), "evil.example").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        server.stop().await;
    }
}
