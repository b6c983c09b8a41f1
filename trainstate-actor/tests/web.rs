//! The web page in a real headless Chromium, driven by `thirtyfour` through
//! chromedriver: the runs view, a run's view, and live updates.
//!
//! Skips (with the reason) when Chromium or chromedriver is not installed,
//! but fails when `CI=true`. `TRAINSTATE_UPDATE_SCREENSHOTS=1` also writes
//! the runs view to `docs/screenshots/runs.png`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::Client;
use serde_json::{Value, json};
use thirtyfour::{By, ChromiumLikeCapabilities, DesiredCapabilities, WebDriver, WebElement};
use trainstate_actor::StateConfig;
use trainstate_actor::http::HttpConfig;
use trainstate_schema::RunId;

use crate::common::{Server, run_with, unique_name, workers};

const CHROMIUM: &[&str] = &["/usr/bin/chromium", "/usr/bin/chromium-browser"];
const CHROMEDRIVER: &[&str] = &["/usr/bin/chromedriver"];
/// The deadline of every wait on the browser.
const DEADLINE: Duration = Duration::from_secs(30);
/// How often a wait looks at the page again.
const POLL: Duration = Duration::from_millis(25);

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn output_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Chromium and chromedriver. A test that calls this is ignored where
/// they were not installed when it was built (see `build.rs`), except
/// under `CI=true`, where it fails here.
fn browser() -> (PathBuf, PathBuf) {
    let find = |candidates: &[&str]| candidates.iter().map(PathBuf::from).find(|p| p.is_file());
    let missing = match (find(CHROMIUM), find(CHROMEDRIVER)) {
        (Some(chromium), Some(driver)) => return (chromium, driver),
        (None, _) => "chromium",
        (_, None) => "chromedriver",
    };
    panic!("the web page tests need {missing} (apt-get install chromium chromium-driver)")
}

// ---- The browser ---------------------------------------------------------------

/// A child process, killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts chromedriver on a free port and waits until it is ready.
async fn start_chromedriver(chromedriver: &Path, log: &Path) -> (Killed, u16) {
    let http = Client::builder().no_proxy().build().unwrap();
    let until = Instant::now() + DEADLINE;
    loop {
        // The port can be taken between this probe and chromedriver's bind: then try another.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = Killed(
            Command::new(chromedriver)
                .arg(format!("--port={port}"))
                .arg(format!("--log-path={}", log.display()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display())),
        );
        let url = format!("http://127.0.0.1:{port}/status");
        while Instant::now() < until && child.0.try_wait().unwrap().is_none() {
            if let Ok(response) = http.get(&url).send().await {
                let status: Value =
                    serde_json::from_str(&response.text().await.unwrap_or_default())
                        .unwrap_or_default();
                if status["value"]["ready"] == true {
                    return (child, port);
                }
            }
            tokio::time::sleep(POLL).await;
        }
        assert!(Instant::now() < until, "chromedriver never became ready; see {}", log.display());
    }
}

/// A browser session of chromedriver. Dropping it ends the session (so
/// Chromium exits) and then chromedriver, also when a test fails halfway.
struct Browser {
    /// Names this browser's files in the output directory.
    label: &'static str,
    /// Dropped before chromedriver (fields drop in order): the session ends first.
    driver: WebDriver,
    _chromedriver: Killed,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start(chromium: &Path, chromedriver: &Path, label: &'static str) -> Self {
        let log = output_dir().join(format!("chromedriver-{label}.log"));
        let (chromedriver, port) = start_chromedriver(chromedriver, &log).await;
        let profile = tempfile::tempdir().unwrap();
        let mut capabilities = DesiredCapabilities::chrome();
        capabilities.set_binary(chromium.to_str().unwrap()).unwrap();
        let user_data_dir = format!("--user-data-dir={}", profile.path().display());
        for arg in [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-quic",
            "--no-proxy-server",
            "--window-size=1280,900",
            "--force-device-scale-factor=1",
            &user_data_dir,
        ] {
            capabilities.add_arg(arg).unwrap();
        }
        // No proxy for chromedriver on loopback, and no pooled connections: a session
        // left open by a failed test is ended from another runtime (see WebDriver's Drop).
        let http = Client::builder().no_proxy().pool_max_idle_per_host(0).build().unwrap();
        let driver = WebDriver::builder(format!("http://127.0.0.1:{port}"), capabilities)
            .client(http)
            .await
            .unwrap_or_else(|e| panic!("no browser session: {e}; see {}", log.display()));
        Self { label, driver, _chromedriver: chromedriver, _profile: profile }
    }

    async fn goto(&self, url: &str) {
        self.driver.goto(url).await.unwrap_or_else(|e| panic!("goto {url}: {e}"));
    }

    async fn back(&self) {
        self.driver.back().await.unwrap_or_else(|e| panic!("back: {e}"));
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    async fn execute(&self, script: &str) -> Value {
        let answer = self.driver.execute(script, Vec::new()).await;
        answer.unwrap_or_else(|e| panic!("{e} in the script:\n{script}")).json().clone()
    }

    async fn find(&self, css: &str) -> WebElement {
        self.driver.find(By::Css(css)).await.unwrap_or_else(|e| panic!("{css}: {e}"))
    }

    async fn click(&self, css: &str) {
        self.find(css).await.click().await.unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Saves a PNG of the page's body: the content, without the empty viewport below it.
    async fn screenshot(&self, path: &Path) {
        let png = self.find("body").await.screenshot_as_png().await.expect("a screenshot");
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(path, png).unwrap();
    }

    /// Waits until `script` returns something other than null or false; returns it.
    async fn wait_for(&self, what: &str, script: &str) -> Value {
        let until = Instant::now() + DEADLINE;
        loop {
            let value = self.execute(script).await;
            if !value.is_null() && value != false {
                return value;
            }
            if Instant::now() >= until {
                let failure = output_dir().join(format!("failure-{}.png", self.label));
                self.screenshot(&failure).await;
                let text = self.execute("return document.body.innerText").await;
                panic!(
                    "timed out waiting for {what}; screenshot at {}; page text:\n{}",
                    failure.display(),
                    text.as_str().unwrap_or_default()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn quit(self) {
        self.driver.quit().await.expect("the session ends");
    }
}

// ---- The test ----------------------------------------------------------------

const MINUTE: u64 = 60_000;
const HOUR: u64 = 60 * MINUTE;

/// A run's registration: `n` workers, 8 to a node, and its datasets.
fn run_body(name: &str, job: &str, start_ms: u64, n: u32, datasets: &[&str]) -> (RunId, Value) {
    let id = RunId::new_v7();
    let mut run = serde_json::to_value(run_with(&id, name, job, start_ms, 1)).unwrap();
    run["controller_actor_id"] = json!(format!("{:032x}", start_ms));
    run["workers"] = serde_json::to_value(workers(n, 8, &format!("{name}-"))).unwrap();
    run["resources"] = Value::Null;
    run["datasets"] = datasets
        .iter()
        .enumerate()
        .map(|(i, key)| {
            json!({
                "name": key,
                "dataset_uuid": format!("{:032x}", start_ms * 16 + i as u64),
                "dataset_name": format!("{key}_{name}"),
            })
        })
        .collect();
    (id, run)
}

struct Api {
    http: Client,
    url: String,
    token: Option<&'static str>,
}

impl Api {
    fn new(server: &Server, token: Option<&'static str>) -> Self {
        Self { http: Client::builder().no_proxy().build().unwrap(), url: server.url.clone(), token }
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.url);
        let body = Some(("application/json", serde_json::to_vec(&body).unwrap()));
        let (status, answer) =
            crate::contract::send(&self.http, reqwest::Method::POST, &url, body, self.token).await;
        assert!(status.is_success(), "POST {path}: {status}: {answer}");
        answer
    }

    async fn get(&self, path: &str) -> Value {
        let url = format!("{}{path}", self.url);
        let (status, answer) =
            crate::contract::send(&self.http, reqwest::Method::GET, &url, None, self.token).await;
        assert!(status.is_success(), "GET {path}: {status}: {answer}");
        answer
    }

    async fn register(&self, run: (RunId, Value)) -> RunId {
        self.post("/api/train/runs", run.1).await;
        run.0
    }

    async fn set_status(&self, id: &RunId, body: Value) {
        self.post(&format!("/api/train/runs/{id}/status"), body).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_browser), ignore = "needs chromium and chromedriver")]
async fn the_page_lists_runs_shows_a_run_and_follows_changes_live() {
    let (chromium, chromedriver) = browser();
    let server = Server::start(
        StateConfig::in_memory()
            .with_name(unique_name("web"))
            .with_lease(Duration::from_secs(3600)),
        HttpConfig::default(),
    )
    .await;
    let api = Api::new(&server, None);

    // Eight runs of every status, registered oldest first, as a cluster would.
    let now = now_ms();
    let trace = "Traceback (most recent call last):\n  File \"train.py\", line 118, in train_loop\n    loss = model(batch).loss\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n\u{1b}[0m";
    let vit = api
        .register(run_body("vit-b16-pretrain", "02000000", now - 26 * HOUR, 64, &["train", "val"]))
        .await;
    api.set_status(&vit, json!({"status": "FINISHED", "end_time_ms": now - 9 * HOUR})).await;
    let bert = api
        .register(run_body("bert-large-finetune", "03000000", now - 7 * HOUR, 32, &["train"]))
        .await;
    api.set_status(
        &bert,
        json!({"status": "ERRORED", "detail": trace, "end_time_ms": now - 6 * HOUR - 50 * MINUTE,
               "cause": {"kind": "USER_ERROR", "failed_world_rank": 3}}),
    )
    .await;
    let whisper = api
        .register(run_body("whisper-small-asr", "04000000", now - 5 * HOUR, 16, &["train", "eval"]))
        .await;
    api.set_status(&whisper, json!({"status": "FINISHED", "end_time_ms": now - 3 * HOUR})).await;
    let t5 = api
        .register(run_body("t5-base-summarize", "05000000", now - 3 * HOUR, 8, &["train"]))
        .await;
    api.set_status(
        &t5,
        json!({"status": "ABORTED", "detail": "Stopped by the user (Ctrl-C).",
               "end_time_ms": now - 2 * HOUR - 40 * MINUTE, "cause": {"kind": "USER_INTERRUPT"}}),
    )
    .await;
    let sweep =
        api.register(run_body("gpt2-medium-sweep-3", "06000000", now - 2 * HOUR, 8, &[])).await;
    api.set_status(
        &sweep,
        json!({"status": "ERRORED", "detail": "The node 10.0.0.3 was lost.",
               "end_time_ms": now - HOUR - 52 * MINUTE, "cause": {"kind": "SYSTEM_ERROR"}}),
    )
    .await;
    let llama = api
        .register(run_body(
            "llama3-8b-pretrain",
            "07000000",
            now - 95 * MINUTE,
            256,
            &["train", "val"],
        ))
        .await;
    let resnet = api
        .register(run_body("resnet50-imagenet", "08000000", now - 40 * MINUTE, 16, &["train"]))
        .await;
    let resized = serde_json::to_value(workers(12, 4, "resnet50-imagenet-b-")).unwrap();
    api.post(
        &format!("/api/train/runs/{resnet}/attempts"),
        json!({"attempt_id": "1", "start_time_ms": now - 12 * MINUTE, "workers": resized}),
    )
    .await;
    let mistral = api
        .register(run_body("mistral-7b-sft", "09000000", now - 8 * MINUTE, 32, &["train"]))
        .await;
    let newest_first = [
        (&mistral, "RUNNING"),
        (&resnet, "RUNNING"),
        (&llama, "RUNNING"),
        (&sweep, "ERRORED"),
        (&t5, "ABORTED"),
        (&whisper, "FINISHED"),
        (&bert, "ERRORED"),
        (&vit, "FINISHED"),
    ];
    let expected: Vec<Value> =
        newest_first.iter().map(|(id, status)| json!([id.to_string(), status])).collect();

    let browser = Browser::start(&chromium, &chromedriver, "views").await;
    let out = output_dir();

    // The runs view: every run, newest first, with its status; the live stream connected.
    browser.goto(&format!("{}/", server.url)).await;
    let rows = browser
        .wait_for(
            "the runs view to list every run over a live connection",
            "const rows = [...document.querySelectorAll('#runs tr[data-run-id]')];
             if (rows.length !== 8 || document.getElementById('connection').textContent !== 'live') return null;
             return rows.map((r) => [r.dataset.runId, r.querySelector('[data-col=status]').textContent]);",
        )
        .await;
    assert_eq!(rows, Value::from(expected.clone()));
    let counts = browser
        .execute(
            "return ['ALL', 'RUNNING', 'FINISHED', 'ERRORED', 'ABORTED'].map((s) =>
               document.querySelector(`.counts [data-status=${s}] .count`).textContent);",
        )
        .await;
    assert_eq!(counts, json!(["8", "3", "2", "2", "1"]));
    let runs_png = out.join("runs.png");
    browser.screenshot(&runs_png).await;
    if std::env::var("TRAINSTATE_UPDATE_SCREENSHOTS").as_deref() == Ok("1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/screenshots");
        std::fs::create_dir_all(&docs).unwrap();
        std::fs::copy(&runs_png, docs.join("runs.png")).unwrap();
    }
    // Navigation is in-page from here on: a reload would lose this mark.
    browser.execute("window.notReloaded = true; return null;").await;

    // A run of 256 workers: its own URL, workers by rank, 200 to a page, nodes summarised.
    browser.click(&format!("tr[data-run-id='{llama}'] a")).await;
    let ranks = browser
        .wait_for(
            "the run view to list the workers",
            &format!(
                "if (location.pathname !== '/runs/{llama}') return null;
                 const ranks = [...document.querySelectorAll('#workers tr[data-world-rank]')]
                   .map((r) => Number(r.dataset.worldRank));
                 return ranks.length ? ranks : null;"
            ),
        )
        .await;
    assert_eq!(ranks, json!((0..200).collect::<Vec<_>>()));
    let nodes = browser.execute("return document.querySelectorAll('#nodes tbody tr').length").await;
    assert_eq!(nodes, 32, "256 workers, 8 to a node");
    browser.click("[data-key='workers-next']").await;
    let ranks = browser
        .wait_for(
            "the second page of workers",
            "const ranks = [...document.querySelectorAll('#workers tr[data-world-rank]')]
               .map((r) => Number(r.dataset.worldRank));
             return ranks[0] === 200 ? ranks : null;",
        )
        .await;
    assert_eq!(ranks, json!((200..256).collect::<Vec<_>>()));

    // Back to the list, into a live run, and the run errors while the page is open.
    browser.click("nav.crumbs a").await;
    browser
        .wait_for(
            "the runs view again",
            "return document.querySelectorAll('#runs tr[data-run-id]').length === 8",
        )
        .await;
    browser.click(&format!("tr[data-run-id='{mistral}'] a")).await;
    browser
        .wait_for(
            "the live run's view",
            &format!(
                "return location.pathname === '/runs/{mistral}' &&
                   document.getElementById('run-status')?.textContent === 'RUNNING' &&
                   document.querySelectorAll('#workers tr[data-world-rank]').length === 32;"
            ),
        )
        .await;
    api.set_status(
        &mistral,
        json!({"status": "ERRORED", "detail": trace,
               "cause": {"kind": "USER_ERROR", "failed_world_rank": 5}}),
    )
    .await;
    let detail = browser
        .wait_for(
            "the status change to appear without a reload",
            "return window.notReloaded && document.getElementById('run-status').textContent === 'ERRORED'
               && document.getElementById('status-detail')?.textContent;",
        )
        .await;
    let detail = detail.as_str().unwrap();
    assert!(detail.contains("torch.OutOfMemoryError"), "{detail}");
    assert!(detail.ends_with("\\u{1b}[0m"), "control characters are shown escaped: {detail:?}");
    let cause = browser.execute("return document.getElementById('run-cause').textContent").await;
    assert!(cause.as_str().unwrap().contains("USER_ERROR"), "{cause}");
    assert!(cause.as_str().unwrap().contains('5'), "{cause}");
    browser.screenshot(&out.join("run.png")).await;

    // History back to the list, which follows changes too.
    browser.back().await;
    api.set_status(&resnet, json!({"status": "FINISHED"})).await;
    browser
        .wait_for(
            "the list to show both changes without a reload",
            &format!(
                "const status = (id) => document.querySelector(`#runs tr[data-run-id='${{id}}'] [data-col=status]`)?.textContent;
                 return window.notReloaded && location.pathname === '/' &&
                   status('{mistral}') === 'ERRORED' && status('{resnet}') === 'FINISHED';"
            ),
        )
        .await;

    // The Nodes view, from the header: every node seen under the runs, the
    // failed rank's node counting one application failure (no suspect).
    browser.click("a.top-link").await;
    browser
        .wait_for(
            "the nodes view to list the nodes with the failed rank's application failure",
            "const rows = [...document.querySelectorAll('#nodes tbody tr')];
             return window.notReloaded && location.pathname === '/nodes' && rows.length > 1 &&
               rows.some((tr) => tr.children[5].textContent === '1' && tr.children[2].textContent === 'ok') &&
               rows.every((tr) => tr.querySelector('a')?.getAttribute('href').startsWith('/nodes?node='));",
        )
        .await;
    browser.screenshot(&out.join("nodes.png")).await;

    browser.quit().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_browser), ignore = "needs chromium and chromedriver")]
async fn the_page_reads_a_protected_head_with_the_token_from_its_url() {
    let (chromium, chromedriver) = browser();
    // Characters a URL must escape: the page sends the token percent-encoded.
    const TOKEN: &str = "k+3/x=";
    let http = HttpConfig::default().with_token(Some(TOKEN.into())).with_protected_reads(true);
    let server =
        Server::start(StateConfig::in_memory().with_name(unique_name("web-token")), http).await;
    let api = Api::new(&server, Some(TOKEN));
    let id = api.register(run_body("protected-run", "01000000", now_ms() - HOUR, 4, &[])).await;
    let browser = Browser::start(&chromium, &chromedriver, "token").await;

    // Without the token, the page asks for it.
    browser.goto(&format!("{}/", server.url)).await;
    browser
        .wait_for("the page to ask for a token", "return !!document.getElementById('token-input')")
        .await;

    // With it in the URL, it reads and follows the head, and drops the token from the address bar.
    browser.goto(&format!("{}/?token=k%2B3%2Fx%3D", server.url)).await;
    browser
        .wait_for(
            "the protected runs over a live connection",
            &format!(
                "return document.getElementById('connection').textContent === 'live' &&
                   location.search === '' &&
                   document.querySelector(`#runs tr[data-run-id='{id}'] [data-col=status]`)?.textContent === 'RUNNING';"
            ),
        )
        .await;
    api.set_status(&id, json!({"status": "FINISHED"})).await;
    browser
        .wait_for(
            "the change to arrive over the protected event stream",
            &format!(
                "return document.querySelector(`#runs tr[data-run-id='{id}'] [data-col=status]`)?.textContent === 'FINISHED';"
            ),
        )
        .await;

    browser.quit().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_browser), ignore = "needs chromium and chromedriver")]
async fn the_page_shows_sub_statuses_attempts_with_causes_the_restart_budget_and_links_out() {
    let (chromium, chromedriver) = browser();
    let links = trainstate_client::api::LinksResponse::new(
        Some("https://logs.example/run/{run_id}/rank/{rank}".into()),
        Some("https://grafana.example/d/train?var-run={run_id}&var-attempt={attempt_id}".into()),
    );
    let server = Server::start(
        StateConfig::in_memory().with_name(unique_name("web-v2")),
        HttpConfig::default().with_links(links),
    )
    .await;
    let api = Api::new(&server, None);
    let (id, mut run) = run_body("flaky-pretrain", "06000000", now_ms() - HOUR, 4, &["train"]);
    run["run_settings"] = json!({"run_config": {"failure_config": {"max_failures": 2}}});
    api.register((id.clone(), run.clone())).await;
    api.set_status(&id, json!({"status": "RESTARTING"})).await;
    api.post(
        &format!("/api/train/runs/{id}/attempts"),
        json!({"attempt_id": "1", "start_time_ms": now_ms() - HOUR / 2, "workers": run["workers"]}),
    )
    .await;
    api.set_status(
        &id,
        json!({"status": "ERRORED", "detail": "boom", "cause": {"kind": "USER_ERROR", "failed_world_rank": 2}}),
    )
    .await;

    let browser = Browser::start(&chromium, &chromedriver, "v2").await;
    browser.goto(&format!("{}/runs/{id}", server.url)).await;
    let shown = browser
        .wait_for(
            "the attempts, their statuses and the links",
            "const statuses = [...document.querySelectorAll('[data-col=attempt-status]')].map((e) => e.textContent);
             const links = [...document.querySelectorAll('a.out')].map((a) => a.getAttribute('href'));
             const budget = [...document.querySelectorAll('h2')].map((e) => e.textContent).find((t) => t.startsWith('Attempts'));
             const cause = document.querySelector('.attempt-cause')?.textContent;
             const runCause = document.getElementById('run-cause')?.textContent;
             const runClass = document.querySelector('#run-cause .cause-class')?.textContent;
             return statuses.length === 2 && links.length > 1 && { statuses, links, budget, cause, runCause, runClass };",
        )
        .await;
    assert_eq!(shown["statuses"], json!(["ABORTED", "ERRORED"]));
    assert_eq!(shown["budget"], "Attempts (2 of at most 3)");
    assert!(shown["cause"].as_str().unwrap().contains("first failed rank 2"), "{shown}");
    // The failed run's cause says whose fault it was: its kind and its class.
    assert_eq!(shown["runClass"], "APPLICATION", "{shown}");
    let run_cause = shown["runCause"].as_str().unwrap();
    assert!(run_cause.contains("USER_ERROR") && run_cause.contains("APPLICATION"), "{shown}");
    let links: Vec<&str> =
        shown["links"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert!(
        links.contains(
            &format!("https://grafana.example/d/train?var-run={id}&var-attempt=1").as_str()
        ),
        "{links:?}"
    );
    assert!(links.contains(&format!("https://logs.example/run/{id}/rank/3").as_str()), "{links:?}");

    // The run's status history, as a timeline: status, time, attempt, detail.
    let history = browser
        .wait_for(
            "the status history",
            "const changes = [...document.querySelectorAll('#status-history .change')];
             return changes.length === 3 && changes.map((c) => ({
               status: c.querySelector('[data-col=change-status]')?.textContent,
               time: c.querySelector('time')?.getAttribute('datetime'),
               text: c.textContent,
             }));",
        )
        .await;
    let statuses: Vec<&Value> = history.as_array().unwrap().iter().map(|c| &c["status"]).collect();
    assert_eq!(statuses, [&json!("RUNNING"), &json!("RESTARTING"), &json!("ERRORED")], "{history}");
    assert!(history.as_array().unwrap().iter().all(|c| c["time"].is_string()), "{history}");
    assert!(history[0]["text"].as_str().unwrap().contains("attempt 0"), "{history}");
    assert!(history[2]["text"].as_str().unwrap().contains("attempt 1"), "{history}");
    assert!(history[2]["text"].as_str().unwrap().contains("boom"), "{history}");

    // A live sub-status is what the runs list shows.
    let (other, _) = {
        let (other, body) = run_body("scheduling-run", "06000000", now_ms() - 10 * MINUTE, 2, &[]);
        api.register((other.clone(), body)).await;
        api.set_status(&other, json!({"status": "SCHEDULING"})).await;
        (other, ())
    };
    browser.goto(&format!("{}/", server.url)).await;
    browser
        .wait_for(
            "the live sub-status in the list",
            &format!(
                "return document.querySelector(`#runs tr[data-run-id='{other}'] [data-col=status]`)?.textContent === 'SCHEDULING';"
            ),
        )
        .await;
    browser.quit().await;
    server.stop().await;
}

/// Issue 10, item 9: a stored run whose time is not a valid date (a start
/// in nanoseconds, stored before such times were refused, or forwarded)
/// shows "—" and the rest of the list still renders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_browser), ignore = "needs chromium and chromedriver")]
async fn regression_a_run_with_an_unparseable_time_shows_a_dash_and_the_list_renders() {
    let (chromium, chromedriver) = browser();
    let server = Server::start(
        StateConfig::in_memory().with_name(unique_name("web-bad-time")),
        HttpConfig::default(),
    )
    .await;
    let api = Api::new(&server, None);
    let good = api.register(run_body("good-run", "01000000", now_ms() - HOUR, 4, &[])).await;
    // Forwarded runs are stored as they are, so a nanosecond time still gets in.
    let bad = RunId::new_v7();
    let ns = now_ms() * 1_000_000;
    let mut draft = run_with(&bad, "ns-run", "02000000", ns, 2).into_draft();
    draft.cluster = Some("elsewhere".into());
    server.service.handle().forward(draft.validate().unwrap()).await.unwrap();
    let browser = Browser::start(&chromium, &chromedriver, "bad-time").await;
    browser.goto(&format!("{}/", server.url)).await;
    let start = browser
        .wait_for(
            "both runs listed, the bad time as a dash",
            &format!(
                "const good = document.querySelector(`#runs tr[data-run-id='{good}'] [data-col=start]`);
                 const bad = document.querySelector(`#runs tr[data-run-id='{bad}'] [data-col=start]`);
                 return good && bad && good.textContent !== '—' && bad.textContent;"
            ),
        )
        .await;
    assert_eq!(start, json!("—"));
    browser.quit().await;
    server.stop().await;
}

/// Stragglers on the page: rank 1's own steps take twice rank 0's for
/// longer than 10 s; the run's page names it in the health box and
/// highlights and labels its row in the workers table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_browser), ignore = "needs chromium and chromedriver")]
async fn the_page_names_a_straggler_and_labels_its_row() {
    let (chromium, chromedriver) = browser();
    let clock = std::sync::Arc::new(trainstate_actor::ManualClock::new(now_ms()));
    let server = Server::start(
        StateConfig::in_memory()
            .with_name(unique_name("web-straggler"))
            .with_clock(clock.clone())
            // The test drives the sweep itself.
            .with_sweep_interval(Duration::from_secs(3600)),
        HttpConfig::default(),
    )
    .await;
    let api = Api::new(&server, None);
    let mut id = String::new();
    for worker in &workers(2, 1, "s-") {
        let join = json!({"world_size": 2, "worker": worker, "name": "slow", "job_id": "9"});
        id = api.post("/api/train/rendezvous/web-straggler/join", join).await["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    let handle = server.service.handle();
    for second in 1..=12u64 {
        clock.advance_ms(1_000);
        for (rank, step_time_ms) in [(0, 100.0), (1, 200.0)] {
            let progress = json!({"attempt_id": "0", "progress": {
                "step": second * 5, "step_time_ms": step_time_ms}});
            api.post(&format!("/api/train/runs/{id}/ranks/{rank}/heartbeat"), progress).await;
        }
        handle.sweep_leases().await.unwrap();
    }
    let run = handle.get_run(trainstate_schema::RunId::parse(&id).unwrap()).await.unwrap();
    let health = run.health().expect("the run has health");
    assert_eq!(health.stragglers.iter().map(|s| s.rank).collect::<Vec<_>>(), [1], "{health:?}");

    let browser = Browser::start(&chromium, &chromedriver, "straggler").await;
    browser.goto(&format!("{}/runs/{id}", server.url)).await;
    let shown = browser
        .wait_for(
            "the straggler named and its row labelled",
            "const line = document.querySelector('#run-stragglers');
             const rows = [...document.querySelectorAll('#workers tbody tr')];
             if (!line || rows.length < 2) return null;
             return {
               line: line.textContent,
               highlighted: rows.filter((r) => r.classList.contains('straggler')).map((r) => Number(r.dataset.worldRank)),
               labels: rows.map((r) => (r.querySelector('.badge.straggler') || {}).textContent || null),
             };",
        )
        .await;
    assert_eq!(shown["highlighted"], json!([1]), "{shown}");
    assert_eq!(shown["labels"], json!([null, "straggler 2.0\u{d7}"]), "{shown}");
    let line = shown["line"].as_str().unwrap();
    assert!(line.contains("rank 1 2.0\u{d7} (0.20 s a step, its peers 0.10 s)"), "{line}");
    browser.screenshot(&output_dir().join("run-straggler.png")).await;
    browser.quit().await;
    server.stop().await;
}

/// Run health on the page: a live rendezvous run whose ranks reported
/// progress and then stopped advancing shows the STALLED badge in the list,
/// and on its page the health with the ranks it names (their rows
/// highlighted), a progress bar at the reported step of the total, each
/// rank's step and phase, and a plot of the reported metric, a line per rank.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_browser), ignore = "needs chromium and chromedriver")]
async fn the_page_shows_a_stalled_run_its_progress_and_the_ranks_named() {
    let (chromium, chromedriver) = browser();
    let clock = std::sync::Arc::new(trainstate_actor::ManualClock::new(now_ms()));
    let server = Server::start(
        StateConfig::in_memory()
            .with_name(unique_name("web-health"))
            .with_clock(clock.clone())
            .with_stall_after(Duration::from_secs(60))
            // The test drives the sweep itself.
            .with_sweep_interval(Duration::from_secs(3600)),
        HttpConfig::default(),
    )
    .await;
    let api = Api::new(&server, None);
    let group = workers(2, 2, "h-");
    let mut id = String::new();
    for worker in &group {
        let join = json!({"world_size": 2, "worker": worker, "name": "stalls", "job_id": "9"});
        id = api.post("/api/train/rendezvous/web-health/join", join).await["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    // Each rank reports a few steps with its loss, then stops advancing.
    for (rank, steps, phase) in [(0, [10, 20, 30, 40], "train"), (1, [10, 20, 30, 37], "eval")] {
        for (i, step) in steps.into_iter().enumerate() {
            let loss = 1.0 - 0.2 * i as f64 + 0.05 * f64::from(rank);
            let progress = json!({"attempt_id": "0", "progress": {
                "step": step, "total_steps": 100, "phase": phase, "metrics": {"loss": loss}}});
            api.post(&format!("/api/train/runs/{id}/ranks/{rank}/heartbeat"), progress).await;
        }
    }
    let handle = server.service.handle();
    handle.sweep_leases().await.unwrap();
    // No rank advances for longer than the window; the ranks stay alive.
    clock.advance_ms(61_000);
    for rank in 0..2 {
        let beat = json!({"attempt_id": "0"});
        api.post(&format!("/api/train/runs/{id}/ranks/{rank}/heartbeat"), beat).await;
    }
    handle.sweep_leases().await.unwrap();
    let run = handle.get_run(trainstate_schema::RunId::parse(&id).unwrap()).await.unwrap();
    let health = run.health().expect("the run has health");
    assert_eq!(health.state.as_str(), "STALLED", "{health:?}");

    // The points reach the store with the writer's next flush (a second).
    let metrics = format!("/api/train/runs/{id}/metrics");
    let flushed = Instant::now() + DEADLINE;
    while api.get(&metrics).await["series"][0]["points"].as_array().is_none_or(|p| p.len() < 8) {
        assert!(Instant::now() < flushed, "the reported points never reached the store");
        tokio::time::sleep(POLL).await;
    }

    let browser = Browser::start(&chromium, &chromedriver, "health").await;
    browser.goto(&format!("{}/", server.url)).await;
    browser
        .wait_for(
            "the STALLED badge in the list",
            &format!(
                "const row = document.querySelector(`#runs tr[data-run-id='{id}']`);
                 return row && row.querySelector('[data-health=STALLED]') !== null;"
            ),
        )
        .await;
    browser.goto(&format!("{}/runs/{id}", server.url)).await;
    let shown = browser
        .wait_for(
            "the run's health, progress bar, ranks and plot",
            "const bar = document.querySelector('#run-progress');
             const health = document.querySelector('#run-health');
             const rows = [...document.querySelectorAll('#workers tbody tr')];
             if (!bar || !health || rows.length < 2 || !document.querySelector('#metrics svg')) return null;
             return {
               value: bar.getAttribute('value'), max: bar.getAttribute('max'),
               step: document.querySelector('#run-step').textContent,
               health: health.getAttribute('data-health'),
               stalledBadge: document.querySelector('#run-status [data-health=STALLED]') !== null,
               eta: document.querySelector('#run-eta') !== null,
               stalledFor: document.querySelector('#run-stalled-for') !== null,
               culprits: rows.filter((r) => r.classList.contains('culprit')).map((r) => Number(r.dataset.worldRank)),
               steps: rows.map((r) => r.querySelector('[data-col=step]').textContent),
               phases: rows.map((r) => r.querySelector('[data-col=phase]').textContent),
               plotted: [...document.querySelectorAll('#metrics svg[data-metric=loss] polyline')]
                 .map((l) => [Number(l.dataset.rank), l.getAttribute('points').trim().split(' ').length]),
             };",
        )
        .await;
    assert_eq!(shown["value"], "40", "{shown}");
    assert_eq!(shown["max"], "100", "{shown}");
    assert!(shown["step"].as_str().unwrap().contains("step 40 of 100"), "{shown}");
    assert_eq!(shown["health"], "STALLED", "{shown}");
    assert_eq!(shown["stalledBadge"], true, "{shown}");
    assert_eq!(shown["eta"], false, "no estimate of the time left while stalled: {shown}");
    assert_eq!(shown["stalledFor"], true, "how long it stood still instead: {shown}");
    let named: Vec<u64> = health.ranks.iter().map(|r| u64::from(*r)).collect();
    assert!(!named.is_empty(), "{health:?}");
    assert_eq!(shown["culprits"], json!(named), "the ranks health names are highlighted: {shown}");
    assert_eq!(shown["steps"], json!(["40", "37"]), "{shown}");
    assert_eq!(shown["phases"], json!(["train", "eval"]), "{shown}");
    assert_eq!(
        shown["plotted"],
        json!([[0, 4], [1, 4]]),
        "a line per rank, a point per report: {shown}"
    );
    browser.screenshot(&output_dir().join("run-health.png")).await;
    browser.quit().await;
    server.stop().await;
}

/// A rendezvous run none of whose ranks is heard from within the lease (a
/// whole job killed outright): its page says so in its own words, "No
/// rank heard from", shows its launch key where a controller's run shows
/// its controller, and nowhere says "controller".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_browser), ignore = "needs chromium and chromedriver")]
async fn the_page_of_a_rendezvous_run_whose_ranks_went_silent_names_no_controller() {
    let (chromium, chromedriver) = browser();
    let clock = std::sync::Arc::new(trainstate_actor::ManualClock::new(now_ms()));
    let server = Server::start(
        StateConfig::in_memory()
            .with_name(unique_name("web-silent"))
            .with_clock(clock.clone())
            .with_lease(Duration::from_secs(60))
            // The test drives the sweep itself.
            .with_sweep_interval(Duration::from_secs(3600)),
        HttpConfig::default(),
    )
    .await;
    let api = Api::new(&server, None);
    let mut id = String::new();
    for worker in &workers(2, 1, "k-") {
        let join = json!({"world_size": 2, "worker": worker, "name": "killed", "job_id": "9"});
        id = api.post("/api/train/rendezvous/web-silent/join", join).await["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    let last_heard = trainstate_actor::Clock::now_ms(&*clock);
    clock.advance_ms(61_000);
    server.service.handle().sweep_leases().await.unwrap();
    let run = api.get(&format!("/api/train/runs/{id}")).await;
    assert_eq!(run["cause"]["kind"], json!("LOST_CONTROLLER"), "{run}");
    assert_eq!(
        run["end_time_ms"],
        json!(last_heard),
        "it ended when its ranks were last heard from"
    );

    let browser = Browser::start(&chromium, &chromedriver, "silent").await;
    browser.goto(&format!("{}/runs/{id}", server.url)).await;
    let shown = browser
        .wait_for(
            "the run's cause on its page",
            "const cause = document.getElementById('run-cause');
             return cause && { cause: cause.textContent, text: document.body.innerText };",
        )
        .await;
    assert_eq!(shown["cause"], json!("No rank heard from · INFRASTRUCTURE"), "{shown}");
    let text = shown["text"].as_str().unwrap();
    assert!(text.to_lowercase().contains("launch"), "{text}");
    assert!(text.contains("web-silent"), "the launch key: {text}");
    assert!(!text.to_lowercase().contains("controller"), "{text}");
    browser.quit().await;
    server.stop().await;
}

/// The post-mortem: an ERRORED rendezvous run whose ranks reported progress
/// and metrics shows, after its end, its metric plots (read from the
/// store) with a legend entry per rank, round ticks on both axes and the
/// value under the pointer, each rank's last step and phase, and its nodes
/// by host name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_browser), ignore = "needs chromium and chromedriver")]
async fn the_page_of_an_ended_run_shows_its_plots_and_each_ranks_last_progress() {
    let (chromium, chromedriver) = browser();
    let server = Server::start(
        StateConfig::in_memory()
            .with_name(unique_name("web-postmortem"))
            .with_sweep_interval(Duration::from_millis(200)),
        HttpConfig::default(),
    )
    .await;
    let api = Api::new(&server, None);
    let mut id = String::new();
    for worker in workers(3, 2, "pm-") {
        let mut worker = serde_json::to_value(worker).unwrap();
        worker["node_name"] = json!(format!("gpu-box-{}", worker["node_rank"]));
        let join = json!({"world_size": 3, "worker": worker, "name": "oom", "job_id": "11"});
        id = api.post("/api/train/rendezvous/web-postmortem/join", join).await["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    // Each rank trains for a while; rank 2 is in its evaluation when rank 1 runs out of memory.
    for step in 1..=40u64 {
        for rank in 0..3u32 {
            if rank == 1 && step > 33 {
                continue;
            }
            let loss = 2.0 / (step as f64).sqrt() + 0.1 * f64::from(rank);
            let phase = if rank == 2 && step == 40 { "eval" } else { "train" };
            let progress = json!({"attempt_id": "0", "progress": {
                "step": step, "total_steps": 100, "phase": phase, "metrics": {"loss": loss}}});
            api.post(&format!("/api/train/runs/{id}/ranks/{rank}/heartbeat"), progress).await;
        }
    }
    for (rank, status) in [(1, "ERRORED"), (0, "ABORTED"), (2, "ABORTED")] {
        let end = json!({"attempt_id": "0", "status": status,
            "detail": "torch.OutOfMemoryError: CUDA out of memory"});
        api.post(&format!("/api/train/runs/{id}/ranks/{rank}/end"), end).await;
    }
    // The run ended, its group is no longer tracked, and its points are in the store.
    let until = Instant::now() + DEADLINE;
    loop {
        let run = api.get(&format!("/api/train/runs/{id}")).await;
        let points = api.get(&format!("/api/train/runs/{id}/metrics")).await["series"][0]["points"]
            .as_array()
            .map_or(0, Vec::len);
        if run["run_status"] == "ERRORED"
            && run.get("rank_last_heartbeat_ms").is_none()
            && points == 113
        {
            assert_eq!(run["rank_progress"][2]["phase"], "eval", "{run}");
            break;
        }
        assert!(Instant::now() < until, "the run never ended with its points stored: {run}");
        tokio::time::sleep(POLL).await;
    }

    let browser = Browser::start(&chromium, &chromedriver, "postmortem").await;
    browser.goto(&format!("{}/runs/{id}", server.url)).await;
    let shown = browser
        .wait_for(
            "the ended run's plots and last progress",
            "const svg = document.querySelector('#metrics svg[data-metric=loss]');
             const rows = [...document.querySelectorAll('#workers tbody tr')];
             if (!svg || rows.length < 3) return null;
             const heading = [...document.querySelectorAll('h2')].map((e) => e.textContent);
             return {
               heading,
               status: document.querySelector('#run-status').textContent,
               step: document.querySelector('#run-step').textContent,
               last: document.querySelector('#run-last-progress').textContent,
               steps: rows.map((r) => r.querySelector('[data-col=step]').textContent),
               phases: rows.map((r) => r.querySelector('[data-col=phase]').textContent),
               nodes: [...document.querySelectorAll('#nodes tbody [data-col=node]')].map((e) => e.textContent),
               lines: [...svg.querySelectorAll('.series')].map((l) => Number(l.dataset.rank)),
               legend: [...svg.closest('figure').querySelectorAll('.legend li')].map((l) => [Number(l.dataset.rank), l.textContent]),
               xTicks: [...svg.querySelectorAll('.x-tick')].map((t) => t.textContent),
               yTicks: [...svg.querySelectorAll('.y-tick')].map((t) => t.textContent),
             };",
        )
        .await;
    assert!(shown["status"].as_str().unwrap().contains("ERRORED"), "{shown}");
    assert!(shown["heading"].as_array().unwrap().contains(&json!("Last progress")), "{shown}");
    assert!(shown["step"].as_str().unwrap().contains("step 40 of 100"), "{shown}");
    assert_eq!(shown["steps"], json!(["40", "33", "40"]), "{shown}");
    assert_eq!(shown["phases"], json!(["train", "train", "eval"]), "{shown}");
    assert!(shown["last"].as_str().unwrap().contains("rank 2 at step 40 (eval)"), "{shown}");
    assert_eq!(shown["nodes"], json!(["gpu-box-0 (pm-node0)", "gpu-box-1 (pm-node1)"]), "{shown}");
    assert_eq!(shown["lines"], json!([0, 1, 2]), "a line per rank: {shown}");
    assert_eq!(
        shown["legend"],
        json!([[0, "rank 0"], [1, "rank 1"], [2, "rank 2"]]),
        "a legend entry per rank: {shown}"
    );
    let numbers = |ticks: &Value| -> Vec<f64> {
        ticks.as_array().unwrap().iter().map(|t| t.as_str().unwrap().parse().unwrap()).collect()
    };
    let x = numbers(&shown["xTicks"]);
    assert!(
        x.len() >= 3 && x.iter().all(|t| t.fract() == 0.0 && t % 5.0 == 0.0),
        "round steps: {shown}"
    );
    let y = numbers(&shown["yTicks"]);
    assert!(y.len() >= 3, "value ticks: {shown}");

    // The value under the pointer: rank 1's last point (step 33).
    let tip = browser
        .execute(
            "const svg = document.querySelector('#metrics svg[data-metric=loss]');
             const line = svg.querySelector('.series[data-rank=\"1\"]');
             const last = line.getAttribute('points').trim().split(' ').pop().split(',').map(Number);
             const box = svg.getBoundingClientRect();
             const [w, h] = svg.getAttribute('viewBox').split(' ').slice(2).map(Number);
             svg.dispatchEvent(new PointerEvent('pointermove', { bubbles: true,
               clientX: box.left + (last[0] * box.width) / w, clientY: box.top + (last[1] * box.height) / h }));
             const tip = svg.closest('figure').querySelector('.plot-tip');
             return { hidden: tip.hidden, text: tip.textContent, rank: tip.dataset.rank, step: tip.dataset.step };",
        )
        .await;
    assert_eq!(tip["hidden"], false, "{tip}");
    assert_eq!((&tip["rank"], &tip["step"]), (&json!("1"), &json!("33")), "{tip}");
    assert!(tip["text"].as_str().unwrap().starts_with("rank 1 · step 33 · "), "{tip}");
    browser.screenshot(&output_dir().join("run-postmortem.png")).await;
    browser.quit().await;
    server.stop().await;
}

/// A run's stack captures on its page: the suspect first with its node and
/// innermost frame, the groups, each rank's stack folded (the suspect's
/// open), and a hostile stack shown as text, never as markup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_browser), ignore = "needs chromium and chromedriver")]
async fn the_page_shows_a_runs_stacks_the_suspect_first_and_never_as_markup() {
    let (chromium, chromedriver) = browser();
    let server = Server::start(
        StateConfig::in_memory().with_name(unique_name("web-stacks")),
        HttpConfig::default(),
    )
    .await;
    let api = Api::new(&server, None);
    let id = api.register(run_body("hangs", "12", now_ms() - MINUTE, 4, &[])).await;
    let waiting = "Current thread 0x00007f3b33e1c740 (most recent call first):
  File \"/venv/torch/distributed/distributed_c10d.py\", line 1320 in all_reduce
  File \"/job/train.py\", line 30 in main
  File \"/job/train.py\", line 44 in <module>
";
    let odd = "Current thread 0x00007f3b33e1c741 (most recent call first):
  File \"/job/train.py\", line 41 in rank_two_is_stuck
  File \"/job/train.py\", line 28 in main
  File \"/job/train.py\", line 44 in <module>
<img src=x onerror=\"document.title='owned'\"> *bold* <http://example.com|click>
";
    let ranks: Vec<Value> = (0..4)
        .map(|rank| {
            let stack = if rank == 2 { odd } else { waiting };
            json!({"rank": rank, "stack": stack, "source": "controller"})
        })
        .collect();
    api.post(
        &format!("/api/train/runs/{id}/stacks"),
        json!({"reason": "the controller saw no step for 5 minutes", "ranks": ranks}),
    )
    .await;

    let browser = Browser::start(&chromium, &chromedriver, "stacks").await;
    browser.goto(&format!("{}/runs/{id}", server.url)).await;
    let shown = browser
        .wait_for(
            "the run's stacks",
            "const stacks = document.querySelector('#stacks');
             if (!stacks) return null;
             const open = [...stacks.querySelectorAll('details.rank-stack')];
             return {
               suspects: [...stacks.querySelectorAll('ul.suspects li')].map((li) => li.textContent),
               groups: [...stacks.querySelectorAll('tr[data-group]')].map((tr) => tr.children[1].textContent),
               order: open.map((d) => Number(d.dataset.rank)),
               opened: open.filter((d) => d.open).map((d) => Number(d.dataset.rank)),
               text: open[0].querySelector('pre').textContent,
               markup: stacks.querySelectorAll('img, a').length,
               title: document.title,
             };",
        )
        .await;
    assert_eq!(shown["suspects"].as_array().unwrap().len(), 1, "{shown}");
    let suspect = shown["suspects"][0].as_str().unwrap();
    assert!(suspect.starts_with("rank 2 on "), "the suspect's node: {shown}");
    assert!(suspect.ends_with(": rank_two_is_stuck (train.py:41)"), "{shown}");
    assert_eq!(shown["groups"], json!(["0, 1, 3", "2"]), "{shown}");
    assert_eq!(shown["order"], json!([2, 0, 1, 3]), "the suspect's stack first: {shown}");
    assert_eq!(shown["opened"], json!([2]), "only the suspect's stack unfolded: {shown}");
    assert!(shown["text"].as_str().unwrap().contains("<img src=x"), "shown as text: {shown}");
    assert_eq!(shown["markup"], 0, "nothing of a stack became markup: {shown}");
    assert_ne!(shown["title"], "owned", "{shown}");
    browser.screenshot(&output_dir().join("run-stacks.png")).await;
    browser.quit().await;
    server.stop().await;
}

/// What a run cost, on the page: a run with a known goodput (a forwarded
/// run on a hub, stored as it is) shows one bar split by bucket, productive
/// first, each part as wide as its share, a legend of each bucket's time and
/// share, the ratio, the checkpoint mark and the restart loop badge; the run
/// list shows its ratio. The fleet view at `/goodput` shows the groups when
/// `GET /api/train/goodput` answers, and says clearly when it does not (503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_browser), ignore = "needs chromium and chromedriver")]
async fn the_page_shows_what_a_run_cost_and_the_fleets_goodput() {
    let (chromium, chromedriver) = browser();
    let config = StateConfig::in_memory()
        .with_name(unique_name("web-goodput"))
        .with_cluster(Some("hub".into()));
    let server = Server::start(config, HttpConfig::default()).await;
    let run = crate::process::forwarded_with_goodput("costly", now_ms() - HOUR);
    crate::process::forward(&server.url, &run).await;
    let id = run.id().as_str().to_owned();

    let browser = Browser::start(&chromium, &chromedriver, "goodput").await;
    browser.goto(&format!("{}/runs/{id}", server.url)).await;
    let shown = browser
        .wait_for(
            "the goodput bar",
            "const bar = document.querySelector('#goodput .goodput-bar');
             if (!bar) return null;
             const width = bar.getBoundingClientRect().width;
             return {
               parts: [...bar.querySelectorAll('.gp')].map((p) => [p.dataset.bucket,
                 Math.round(1000 * p.getBoundingClientRect().width / width) / 1000]),
               colours: [...bar.querySelectorAll('.gp')].map((p) => getComputedStyle(p).backgroundColor),
               legend: [...document.querySelectorAll('#goodput .goodput-legend li')].map((li) => li.textContent),
               ratio: document.querySelector('#goodput-ratio').textContent,
               summary: document.querySelector('#goodput-summary').textContent,
               checkpoint: document.querySelector('#goodput-checkpoint').textContent,
               loop: (document.querySelector('#goodput-restart-loop') || {}).textContent || null,
             };",
        )
        .await;
    // 70 s, 10 s, 20 s and 30 s of 130 s, in the bar's order.
    let parts: Vec<(String, f64)> = serde_json::from_value(shown["parts"].clone()).unwrap();
    let buckets: Vec<&str> = parts.iter().map(|(b, _)| b.as_str()).collect();
    assert_eq!(buckets, ["productive", "waiting_to_start", "restarting", "stalled"], "{shown}");
    for ((bucket, share), want) in parts.iter().zip([70.0, 10.0, 20.0, 30.0]) {
        assert!((share - want / 130.0).abs() < 0.01, "{bucket}: {share} of the bar: {shown}");
    }
    let colours = shown["colours"].as_array().unwrap();
    let distinct: std::collections::HashSet<&str> =
        colours.iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(distinct.len(), 4, "a colour per bucket: {shown}");
    assert_eq!(shown["ratio"], "53.8 %", "{shown}");
    assert!(shown["summary"].as_str().unwrap().contains("of 2m 10s"), "{shown}");
    assert_eq!(
        shown["legend"],
        json!([
            "Productive 1m 10s (53.8 %)",
            "Waiting to start 10s (7.7 %)",
            "Restarting 20s (15.4 %)",
            "Stalled 30s (23.1 %)"
        ]),
        "{shown}"
    );
    assert!(
        shown["checkpoint"].as_str().unwrap().starts_with("Checkpoint: step 40 saved at "),
        "{shown}"
    );
    assert_eq!(shown["loop"], "restart loop", "{shown}");
    browser.screenshot(&output_dir().join("run-goodput.png")).await;

    // The run list: a goodput column with the ratio.
    browser.goto(&format!("{}/", server.url)).await;
    let cell = browser
        .wait_for(
            "the run's goodput in the list",
            &format!(
                "const cell = document.querySelector('tr[data-run-id=\"{id}\"] td[data-col=\"goodput\"]');
                 return cell ? cell.textContent : null;"
            ),
        )
        .await;
    assert_eq!(cell, "53.8 %");

    // The fleet view: the groups when the route answers, else a clear
    // message naming the head's answer.
    let http = Client::builder().no_proxy().build().unwrap();
    let route = http.get(format!("{}/api/train/goodput", server.url)).send().await.unwrap();
    let status = route.status();
    browser.goto(&format!("{}/goodput?by=cluster&window=7d", server.url)).await;
    if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
        let error = browser
            .wait_for(
                "the fleet view's error",
                "const e = document.querySelector('#goodput-error'); return e ? e.textContent : null;",
            )
            .await;
        let error = error.as_str().unwrap();
        assert!(
            error.starts_with("The head cannot count the fleet's goodput right now (HTTP 503): "),
            "{error}"
        );
        assert_eq!(
            browser.execute("return document.querySelectorAll('#goodput-groups').length").await,
            0
        );
    } else {
        assert!(status.is_success(), "GET /api/train/goodput: {status}");
        let fleet = browser
            .wait_for(
                "the fleet's groups",
                "const rows = [...document.querySelectorAll('#goodput-groups tbody tr')];
                 if (!rows.length) return null;
                 return {
                   groups: rows.map((r) => [r.dataset.group, r.querySelector('.gp-ratio').textContent,
                     r.querySelectorAll('.goodput-bar .gp').length]),
                   total: document.querySelector('#goodput-groups tfoot .gp-ratio').textContent,
                 };",
            )
            .await;
        assert_eq!(fleet["groups"], json!([["c1", "53.8 %", 4]]), "{fleet}");
        assert_eq!(fleet["total"], "53.8 %", "{fleet}");
    }
    let by = browser.execute("return document.querySelector('#goodput-by').value").await;
    assert_eq!(by, "cluster");
    browser.screenshot(&output_dir().join("goodput-fleet.png")).await;
    browser.quit().await;
    server.stop().await;
}
