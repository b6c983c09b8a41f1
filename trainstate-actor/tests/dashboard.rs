//! The Grafana dashboard (`deploy/grafana/trainstate.json`) against the
//! real head: `trainstate serve` made to export every metric family it
//! has (a run with progress, a node ledger, goodput, a notification target,
//! forwarding to a second head), then every metric name in the dashboard's
//! PromQL checked against the samples `/metrics` answers with. A metric
//! renamed in the head, or misspelt in the dashboard, fails here instead of
//! leaving an empty panel; a family added to the head without a panel
//! fails too.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use trainstate_schema::{CauseKind, RunCause, RunId, RunStatus, TrainWorkerInfo};
use trainstate_testkit::runs::{ended, run_with, workers};

use crate::common::{eventually, start_head};

/// The suffixes Prometheus adds to a family's name in its samples
/// (counters, histograms and summaries, OpenMetrics' `_created`).
const SAMPLE_SUFFIXES: [&str; 5] = ["_total", "_bucket", "_sum", "_count", "_created"];

fn dashboard_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/trainstate.json")
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The metric names of a PromQL expression: the identifiers that start
/// with `trainstate_`, outside string literals (label values, regexes).
/// Label names, functions and keywords never start so.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                // A string: skip to its closing quote (backslash escapes
                // but in backquoted strings).
                while let Some(s) = chars.next() {
                    if s == '\\' && c != '`' {
                        chars.next();
                    } else if s == c {
                        break;
                    }
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let mut ident = String::from(c);
                while let Some(&n) = chars.peek() {
                    if n.is_ascii_alphanumeric() || n == '_' || n == ':' {
                        ident.push(n);
                        chars.next();
                    } else {
                        break;
                    }
                }
                if ident.starts_with("trainstate_") {
                    names.push(ident);
                }
            }
            // A number's digits (`1e9`, `0x1f`) never start an identifier.
            c if c.is_ascii_digit() => {
                while chars.peek().is_some_and(|n| n.is_ascii_alphanumeric() || *n == '.') {
                    chars.next();
                }
            }
            _ => {}
        }
    }
    names
}

#[test]
fn the_tokenizer_finds_metric_names_and_skips_strings_labels_and_functions() {
    let expr = r#"histogram_quantile(0.99, sum by (le) (rate(trainstate_http_request_duration_seconds_bucket{instance=~"trainstate_x.*", route!='a\'trainstate_y'}[5m]))) / on (instance) group_left trainstate_runs + 1e9"#;
    assert_eq!(
        metric_names(expr),
        ["trainstate_http_request_duration_seconds_bucket", "trainstate_runs"]
    );
    assert!(metric_names("time() - vector(0)").is_empty());
}

/// What the dashboard queries, and where: each PromQL expression with the
/// title of its panel (or the variable's name). Fails on any panel without
/// a title, a datasource of the `${datasource}` variable, or a query.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let mut queries = Vec::new();
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "schemaVersion");
    assert!(dashboard["uid"].as_str().is_some_and(|u| !u.is_empty()), "uid");
    let variables = dashboard["templating"]["list"].as_array().expect("templating.list");
    let datasource = variables.iter().find(|v| v["name"] == "datasource");
    assert!(
        datasource.is_some_and(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        "a `datasource` variable of Prometheus data sources: {variables:?}"
    );
    for variable in variables.iter().filter(|v| v["type"] == "query") {
        let name = variable["name"].as_str().unwrap_or_default().to_owned();
        if variable["datasource"]["uid"] != "${datasource}" {
            problems.push(format!("variable {name}: no ${{datasource}}"));
        }
        let query = variable["query"]["query"].as_str().or(variable["query"].as_str());
        match query {
            Some(query) => queries.push((format!("variable {name}"), query.to_owned())),
            None => problems.push(format!("variable {name}: no query")),
        }
    }
    let mut panels: Vec<&Value> = dashboard["panels"].as_array().expect("panels").iter().collect();
    // Collapsed rows hold their panels.
    let nested: Vec<&Value> =
        panels.iter().filter_map(|p| p["panels"].as_array()).flatten().collect();
    panels.extend(nested);
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default().to_owned();
        if title.trim().is_empty() {
            problems.push(format!("panel {}: no title", panel["id"]));
        }
        if panel["type"] == "row" {
            continue;
        }
        if panel["datasource"]["uid"] != "${datasource}" {
            problems.push(format!("panel {title:?}: no ${{datasource}} datasource"));
        }
        let targets = panel["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
        if targets.is_empty() {
            problems.push(format!("panel {title:?}: no query"));
        }
        for target in targets {
            match target["expr"].as_str() {
                Some(expr) if !metric_names(expr).is_empty() => {
                    queries.push((format!("panel {title:?}"), expr.to_owned()));
                }
                _ => problems.push(format!("panel {title:?}: a query of no trainstate metric")),
            }
            if target["datasource"]["uid"] != "${datasource}" {
                problems.push(format!("panel {title:?}: a query without ${{datasource}}"));
            }
        }
    }
    assert!(problems.is_empty(), "the dashboard:\n{}", problems.join("\n"));
    queries
}

/// The families a Prometheus text exposition declares (`# TYPE`), and the
/// names its samples carry.
fn exposition(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut families = BTreeSet::new();
    let mut samples = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            families.insert(rest.split(' ').next().unwrap().to_owned());
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            samples.insert(line[..end].to_owned());
        }
    }
    (families, samples)
}

/// Whether `sample` is a sample name of `family`.
fn of_family(sample: &str, family: &str) -> bool {
    sample == family
        || sample.strip_prefix(family).is_some_and(|suffix| SAMPLE_SUFFIXES.contains(&suffix))
}

/// A run of two ranks on `prefix`'s nodes, started `start_ms`, as JSON.
fn run_json(prefix: &str, start_ms: u64, end: Option<(RunStatus, RunCause)>) -> Value {
    let mut draft = run_with(&RunId::new_v7(), "dash", "job", start_ms, 2).into_draft();
    draft.workers = workers(2, 1, prefix).into_iter().map(TrainWorkerInfo::into_draft).collect();
    let run = draft.validate().unwrap();
    let Some((status, cause)) = end else {
        return serde_json::to_value(run).unwrap();
    };
    let mut draft = ended(&run, status).into_draft();
    draft.cause = Some(cause);
    serde_json::to_value(draft.validate().unwrap()).unwrap()
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) {
    let response = client.post(url).json(body).send().await.unwrap();
    let status = response.status();
    assert!(status.is_success(), "{url}: {status} {}", response.text().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_is_one_the_head_exports() {
    let path = dashboard_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let dashboard: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let queries = dashboard_queries(&dashboard);

    // A hub, and a head of cluster c1 forwarding to it, telling a webhook
    // (the hub's address: it answers 404, which is a failed delivery),
    // showing each rank's step.
    let hub_dir = tempfile::tempdir().unwrap();
    let hub = start_head(hub_dir.path(), &[]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let webhook = format!("{}/hook", hub.url);
    let head = start_head(
        dir.path(),
        &[
            "--cluster",
            "c1",
            "--forward-to",
            &hub.url,
            "--notify-webhook",
            &webhook,
            "--prometheus-rank-series",
            "16",
        ],
    )
    .unwrap();
    let base = head.url.clone();
    let client = reqwest::Client::new();

    // A live run ten minutes old whose ranks report steps, and one that
    // failed on a node: the runs, their health and goodput, each rank, the
    // node ledger and a notification to send.
    let start = now_ms() - 600_000;
    let live = run_json("live-", start, None);
    let id = live["id"].as_str().unwrap().to_owned();
    post(&client, &format!("{base}/api/train/runs"), &live).await;
    let progress = json!({"ranks": [
        {"rank": 0, "progress": {"step": 12, "metrics": {"loss": 1.5}}},
        {"rank": 1, "progress": {"step": 9}}]});
    post(&client, &format!("{base}/api/train/runs/{id}/progress"), &progress).await;
    let failed = run_json(
        "bad-",
        start - 1,
        Some((RunStatus::Errored, RunCause::new(CauseKind::Oom, Some(1)))),
    );
    post(&client, &format!("{base}/api/train/runs"), &failed).await;

    // Every family the head declares has samples (the forwarding and the
    // notification settle on their own threads).
    let (families, samples) =
        eventually("every family of /metrics to have samples", Duration::from_secs(60), || {
            let client = client.clone();
            let url = format!("{base}/metrics");
            async move {
                let text = client.get(url).send().await.ok()?.text().await.ok()?;
                let (families, samples) = exposition(&text);
                families
                    .iter()
                    .all(|f| samples.iter().any(|s| of_family(s, f)))
                    .then_some((families, samples))
            }
        })
        .await;
    for family in
        ["trainstate_forward_pending", "trainstate_notify_pending", "trainstate_rank_step"]
    {
        assert!(families.contains(family), "{family} is not on /metrics: {families:?}");
    }

    // Every metric the dashboard queries is a sample name of /metrics.
    let mut unknown = Vec::new();
    let mut used = BTreeSet::new();
    for (place, expr) in &queries {
        for name in metric_names(expr) {
            if !samples.contains(&name) {
                unknown.push(format!("{place}: {name}"));
            }
            used.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "{} queries metrics the head does not export:\n{}\n(the head exports: {samples:?})",
        path.display(),
        unknown.join("\n")
    );
    // And every family the head exports is on the dashboard.
    let unshown: Vec<&String> =
        families.iter().filter(|f| !used.iter().any(|u| of_family(u, f))).collect();
    assert!(
        unshown.is_empty(),
        "families /metrics has that the dashboard never queries: {unshown:?}"
    );
}
