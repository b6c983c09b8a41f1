//! TLS on the head: `serve --tls-cert --tls-key` reached by curl and by
//! trainstate's own clients with `--ca-cert`, plain HTTP refused on its
//! port, the certificate rotated on SIGHUP, a handshake that never comes,
//! and forwarding to a TLS hub. Certificates are made at test time: a CA
//! and a server certificate it signed, for 127.0.0.1 and localhost.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use trainstate_actor::StateConfig;
use trainstate_actor::http::{HttpConfig, ServerTls};
use trainstate_schema::RunId;

use crate::common::{Head, start_head};
use crate::common::{Server, run_with, unique_name};
use crate::contract::send;

const T0: u64 = 1_760_000_000_000;

/// A guard on waits that must end by themselves; not a margin any test needs.
const DEADLINE: Duration = Duration::from_secs(60);

/// A certificate authority made for one test.
pub(crate) struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    /// The CA's certificate, PEM.
    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for 127.0.0.1 and localhost signed by this CA,
    /// and its key: (certificate PEM, key PEM).
    pub(crate) fn server(&self) -> (String, String) {
        let params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A CA's certificate and a server certificate and key it signed, as files.
pub(crate) struct Pki {
    pub(crate) ca: PathBuf,
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

impl Pki {
    /// Writes `ca`'s certificate and a new server certificate of it into
    /// `dir`, named after `name`.
    pub(crate) fn write(dir: &Path, name: &str, ca: &Ca) -> Pki {
        let pki = Pki {
            ca: dir.join(format!("{name}-ca.pem")),
            cert: dir.join(format!("{name}-cert.pem")),
            key: dir.join(format!("{name}-key.pem")),
        };
        std::fs::write(&pki.ca, ca.pem()).unwrap();
        let (cert, key) = ca.server();
        std::fs::write(&pki.cert, cert).unwrap();
        std::fs::write(&pki.key, key).unwrap();
        pki
    }

    /// The `serve` flags of this server certificate.
    pub(crate) fn serve_flags(&self) -> Vec<&str> {
        vec!["--tls-cert", path(&self.cert), "--tls-key", path(&self.key)]
    }
}

pub(crate) fn path(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// An HTTP client that trusts only the CA in `ca_pem` (and opens a new
/// connection for each client).
pub(crate) fn client_trusting(ca_pem: &str) -> Client {
    Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap()])
        .build()
        .unwrap()
}

/// Runs curl with `args`: (exit code, stdout, stderr).
fn curl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "30"])
        .args(args)
        .output()
        .expect("curl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `trainstate ARGS…`: (success, stdout, stderr).
fn trainstate(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_trainstate"))
        .args(args)
        .env_remove("TRAINSTATE_CA_CERT")
        .env_remove("TRAINSTATE_URL")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn regression_curl_with_the_ca_reaches_a_tls_head_and_plain_http_to_its_port_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("hub CA");
    let pki = Pki::write(dir.path(), "hub", &ca);
    let head = start_head(&dir.path().join("data"), &pki.serve_flags()).expect("a TLS head");
    assert!(head.url.starts_with("https://127.0.0.1:"), "listening on {}", head.url);
    let healthz = format!("{}/healthz", head.url);
    let plain = healthz.replacen("https://", "http://", 1);

    // curl trusting the CA gets the answer.
    let (code, body, err) = curl(&["--cacert", path(&pki.ca), &healthz]);
    assert_eq!(code, 0, "{err}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["status"], "ok");

    // Without the CA, curl refuses the certificate (60: peer certificate
    // cannot be authenticated with known CA certificates).
    let (code, _, err) = curl(&[&healthz]);
    assert_eq!(code, 60, "{err}");

    // Plain HTTP to the TLS port gets no HTTP answer: the head reads the
    // request as a broken TLS record and closes (curl sees the TLS alert,
    // not a status line).
    let (code, status, err) =
        curl(&["--output", "/dev/null", "--write-out", "%{http_code}", &plain]);
    assert_ne!(code, 0, "plain HTTP must fail: {err}");
    assert_eq!(status, "000", "no HTTP status may come back: {err}");
    let refused = Client::new().get(&plain).send().await.expect_err("plain HTTP must fail");
    assert!(refused.status().is_none() && !refused.is_timeout(), "{refused:?}");

    // The head goes on serving, over TLS, to trainstate's own client too.
    let run = run_with(&RunId::new_v7(), "over-tls", "job", T0, 2);
    let url = format!("{}/api/train/runs", head.url);
    let body = Some(("application/json", serde_json::to_vec(&run).unwrap()));
    let (status, answer) = send(&client_trusting(&ca.pem()), Method::POST, &url, body, None).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (ok, out, err) =
        trainstate(&["runs", "list", "--json", "--url", &head.url, "--ca-cert", path(&pki.ca)]);
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["train_runs"][0]["name"], "over-tls", "{out}");

    // Without --ca-cert, the CLI says which flag would make it trust the head.
    let (ok, _, err) = trainstate(&["runs", "list", "--url", &head.url]);
    assert!(!ok);
    assert!(err.contains("not trusted") && err.contains("--ca-cert"), "{err}");
}

#[tokio::test]
async fn regression_sighup_rotates_the_certificate_for_new_connections_and_open_ones_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let (old_ca, new_ca) = (Ca::new("old CA"), Ca::new("new CA"));
    let pki = Pki::write(dir.path(), "head", &old_ca);
    let head = start_head(&dir.path().join("data"), &pki.serve_flags()).expect("a TLS head");
    let healthz = format!("{}/healthz", head.url);

    // A connection opened before the rotation, kept alive in its pool.
    let before = client_trusting(&old_ca.pem());
    let (status, _) = send(&before, Method::GET, &healthz, None, None).await;
    assert_eq!(status, StatusCode::OK);

    // The new CA's certificate replaces the files; SIGHUP reads them.
    let (cert, key) = new_ca.server();
    std::fs::write(&pki.cert, cert).unwrap();
    std::fs::write(&pki.key, key).unwrap();
    head.signal("-HUP");
    let deadline = Instant::now() + DEADLINE;
    while client_trusting(&new_ca.pem()).get(&healthz).send().await.is_err() {
        assert!(Instant::now() < deadline, "no new connection trusts the new CA: {}", head.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A new connection trusting only the old CA is refused now...
    let refused = client_trusting(&old_ca.pem()).get(&healthz).send().await;
    assert!(refused.is_err(), "a new connection still gets the old certificate");
    // ...while the connection opened before goes on (a new one could not
    // have been made by this client).
    let (status, _) = send(&before, Method::GET, &healthz, None, None).await;
    assert_eq!(status, StatusCode::OK, "the open connection was dropped");

    // A reload that fails (a key that is not the certificate's) keeps the
    // current certificate and says why; the head goes on.
    std::fs::write(&pki.key, old_ca.server().1).unwrap();
    head.signal("-HUP");
    let deadline = Instant::now() + DEADLINE;
    while !head.log().contains("not reloaded") {
        assert!(Instant::now() < deadline, "the failed reload was not logged: {}", head.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(head.log().contains("--tls-key"), "{}", head.log());
    let (status, _) =
        send(&client_trusting(&new_ca.pem()), Method::GET, &healthz, None, None).await;
    assert_eq!(status, StatusCode::OK, "the current certificate must stay after a failed reload");
}

#[tokio::test]
async fn regression_a_client_that_never_handshakes_blocks_no_one_and_is_cut_off() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("CA");
    let pki = Pki::write(dir.path(), "head", &ca);
    let tls = Arc::new(ServerTls::from_pem_files(&pki.cert, &pki.key).unwrap());
    let http = HttpConfig::default()
        .with_tls(Some(tls))
        .with_max_connections(2)
        .with_header_read_timeout(Duration::from_millis(300));
    let server = Server::start(StateConfig::in_memory().with_name(unique_name("tls")), http).await;
    let url = server.url.replacen("http://", "https://", 1);

    // A client that connects and never says a word...
    let mut silent =
        tokio::net::TcpStream::connect(url.trim_start_matches("https://")).await.unwrap();
    // ...does not hold up another's handshake and request.
    let (status, body) =
        send(&client_trusting(&ca.pem()), Method::GET, &format!("{url}/healthz"), None, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // And the head closes it once the header-read timeout has passed.
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(DEADLINE, silent.read(&mut byte))
        .await
        .expect("the silent connection must be closed by the head");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn regression_forwarding_to_a_tls_hub_with_its_ca_delivers_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("hub CA");
    let pki = Pki::write(dir.path(), "hub", &ca);
    let hub = start_head(&dir.path().join("hub"), &pki.serve_flags()).expect("a TLS hub");
    let forward = |ca_cert: Option<&Path>, data: &str| {
        let mut flags = vec!["--cluster", "c1", "--forward-to", &hub.url];
        if let Some(ca_cert) = ca_cert {
            flags.extend(["--ca-cert", path(ca_cert)]);
        }
        start_head(&dir.path().join(data), &flags).expect("a cluster head")
    };

    let http = Client::new();
    let register = |head: &Head, name: &str| {
        let run = run_with(&RunId::new_v7(), name, "job", T0, 2);
        let url = format!("{}/api/train/runs", head.url);
        let body = Some(("application/json", serde_json::to_vec(&run).unwrap()));
        let http = http.clone();
        async move {
            let (status, answer) = send(&http, Method::POST, &url, body, None).await;
            assert_eq!(status, StatusCode::CREATED, "{answer}");
            run
        }
    };

    // A head that does not trust the hub's CA says which flag is missing.
    let untrusting = forward(None, "untrusting");
    register(&untrusting, "untrusted").await;
    let deadline = Instant::now() + DEADLINE;
    while !untrusting.log().contains("--ca-cert") {
        assert!(Instant::now() < deadline, "no error naming --ca-cert: {}", untrusting.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(untrusting.log().contains("not trusted"), "{}", untrusting.log());
    drop(untrusting);

    // With the CA, a run registered on the cluster head reaches the hub.
    let head = forward(Some(&pki.ca), "head");
    let run = register(&head, "over-tls").await;
    let hub_run = format!("{}/api/train/runs/{}", hub.url, run.id());
    let hub_client = client_trusting(&ca.pem());
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (status, answer) = send(&hub_client, Method::GET, &hub_run, None, None).await;
        if status == StatusCode::OK {
            assert_eq!(answer["cluster"], "c1", "{answer}");
            assert_eq!(answer["name"], "over-tls", "{answer}");
            break;
        }
        assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
        assert!(Instant::now() < deadline, "the run did not reach the hub: {}", head.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
