//! The fleet's goodput through a real hub: runs of two clusters forwarded
//! with their goodput, summed by cluster, node and name (GPU-weighted,
//! scaled to the window), a live run counted to the hub's manual clock,
//! the metrics, bad input, and the CLI against the same hub.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::ManualClock;
use trainstate_actor::http::HttpConfig;
use trainstate_client::StateError;
use trainstate_client::api::GoodputQuery;
use trainstate_schema::{
    GoodputBucket, Resources, RunAttemptDraft, RunGoodput, RunId, RunStatus, TrainRunInfo,
    TrainRunInfoDraft, TrainWorkerInfo,
};

use crate::common::{Server, workers};
use crate::contract::send;
use crate::stores::Store;

const T0: u64 = 1_760_000_000_000;
const S: u64 = 1_000;
/// The hub's time when the test reads: about 28 hours after `T0`.
const NOW: u64 = T0 + 100_000 * S;

/// A run of `cluster` named `name` over `group`, started at `start_ms`,
/// ended at `end_ms` (live when `None`), with attempts starting at
/// `attempts` (each but the last on `earlier`), and goodput `buckets`
/// (seconds) counted to `as_of_ms`.
#[allow(clippy::too_many_arguments)]
fn forwarded(
    cluster: &str,
    name: &str,
    group: Vec<TrainWorkerInfo>,
    start_ms: u64,
    end_ms: Option<u64>,
    attempts: &[u64],
    earlier: &[TrainWorkerInfo],
    buckets: &[(GoodputBucket, u64)],
    as_of_ms: u64,
) -> TrainRunInfo {
    let id = RunId::new_v7().to_string();
    let mut draft = TrainRunInfoDraft::new(id, name, "job", "controller", start_ms);
    draft.cluster = Some(cluster.to_owned());
    draft.workers = group.into_iter().map(TrainWorkerInfo::into_draft).collect();
    if let Some(end) = end_ms {
        draft.run_status = RunStatus::Finished;
        draft.status = None;
        draft.end_time_ms = Some(end);
    }
    draft.attempts = attempts
        .iter()
        .enumerate()
        .map(|(i, start)| RunAttemptDraft {
            end_time_ms: match attempts.get(i + 1) {
                Some(next) => Some(next - S),
                None => end_ms,
            },
            workers: attempts
                .get(i + 1)
                .map(|_| earlier.iter().cloned().map(TrainWorkerInfo::into_draft).collect()),
            ..RunAttemptDraft::new(i.to_string(), *start)
        })
        .collect();
    let mut goodput = RunGoodput::starting_at(start_ms);
    for (bucket, seconds) in buckets {
        goodput.add(*bucket, seconds * S);
    }
    goodput.as_of_ms = as_of_ms;
    draft.validate().unwrap().with_goodput(goodput).unwrap()
}

/// `n` workers on nodes of `per_node`, with no GPU.
fn cpu_workers(n: u32, per_node: u32, prefix: &str) -> Vec<TrainWorkerInfo> {
    workers(n, per_node, prefix)
        .into_iter()
        .map(|w| {
            let mut draft = w.into_draft();
            draft.gpu_ids.clear();
            draft.resources = Resources::from_iter([("CPU", 1.0)]);
            draft.validate().unwrap()
        })
        .collect()
}

async fn put(http: &Client, base: &str, run: &TrainRunInfo) {
    let url = format!("{base}/api/train/forwarded/{}", run.id());
    let body = Some(("application/json", serde_json::to_vec(run).unwrap()));
    let (status, answer) = send(http, Method::PUT, &url, body, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

async fn goodput(http: &Client, base: &str, query: &str) -> Value {
    let url = format!("{base}/api/train/goodput?{query}");
    let (status, answer) = send(http, Method::GET, &url, None, None).await;
    assert_eq!(status, StatusCode::OK, "{query}: {answer}");
    answer
}

/// GPU-seconds as the answers' GPU-ms.
fn gpu_ms(gpu_seconds: f64) -> Value {
    json!((gpu_seconds * 1000.0).round() as u64)
}

/// A group's key, cluster, runs, wall and productive GPU-ms.
fn row(group: &Value) -> (Value, Value, Value, Value, Value) {
    (
        group["key"].clone(),
        group.get("cluster").cloned().unwrap_or(Value::Null),
        group["runs"].clone(),
        group["wall_gpu_ms"].clone(),
        group["productive_gpu_ms"].clone(),
    )
}

fn expect(
    key: &str,
    cluster: Option<&str>,
    runs: u64,
    wall: f64,
    productive: f64,
) -> (Value, Value, Value, Value, Value) {
    (
        json!(key),
        cluster.map_or(Value::Null, |c| json!(c)),
        json!(runs),
        gpu_ms(wall),
        gpu_ms(productive),
    )
}

async fn cli(args: Vec<String>) -> (bool, String, String) {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_trainstate")).args(&args).output().unwrap()
    })
    .await
    .unwrap();
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
    (output.status.success(), text(output.stdout), text(output.stderr))
}

/// The lines of `metric`'s samples in Prometheus text.
fn samples<'a>(text: &'a str, metric: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|line| line.strip_prefix(metric).is_some_and(|rest| rest.starts_with(['{', ' '])))
        .collect()
}

#[tokio::test]
async fn a_hub_sums_two_clusters_runs_by_cluster_node_and_name_weighted_by_gpus_and_scaled_to_the_window()
 {
    let fresh = Store::Sqlite.fresh("goodput-fleet").await;
    let clock = Arc::new(ManualClock::new(NOW));
    let config = fresh
        .config()
        .with_clock(clock.clone())
        .with_sweep_interval(Duration::from_secs(3600))
        .with_cluster(Some("hub".into()));
    let server = Server::start(config, HttpConfig::default()).await;
    let http = Client::new();
    let base = server.url.clone();
    use GoodputBucket::*;

    // A: east, "llm", 8 GPUs, 1,000 s: 700 productive, 100 waiting, 200
    // restarting; its first attempt at 100 s on f-node0 (8 GPUs), its
    // second at 600 s on e-node0 and e-node1 (4 GPUs each).
    let a = forwarded(
        "east",
        "llm",
        workers(8, 4, "e-"),
        T0,
        Some(T0 + 1_000 * S),
        &[T0 + 100 * S, T0 + 600 * S],
        &workers(8, 8, "f-"),
        &[(Productive, 700), (WaitingToStart, 100), (Restarting, 200)],
        T0 + 1_000 * S,
    );
    // B: east, "eval", 2 workers and no GPU on b-node0, 2,000 s: 1,000
    // productive, 1,000 stalled; one attempt from its start.
    let b = forwarded(
        "east",
        "eval",
        cpu_workers(2, 2, "b-"),
        T0,
        Some(T0 + 2_000 * S),
        &[T0],
        &[],
        &[(Productive, 1_000), (Stalled, 1_000)],
        T0 + 2_000 * S,
    );
    // C: west, "llm", 4 GPUs on w-node0, 500 s all productive.
    let c = forwarded(
        "west",
        "llm",
        workers(4, 4, "w-"),
        T0 + 1_000 * S,
        Some(T0 + 1_500 * S),
        &[T0 + 1_000 * S],
        &[],
        &[(Productive, 500)],
        T0 + 1_500 * S,
    );
    for run in [&a, &b, &c] {
        put(&http, &base, run).await;
    }

    // By cluster, from T0: A is 8 GPUs × 1,000 s (5,600 productive), B 2
    // workers × 2,000 s (2,000 productive), C 4 GPUs × 500 s.
    let answer = goodput(&http, &base, &format!("since={T0}")).await;
    assert_eq!(answer["by"], json!("cluster"));
    assert_eq!((answer["since_ms"].clone(), answer["until_ms"].clone()), (json!(T0), json!(NOW)));
    assert_eq!(answer["retained_since_ms"], json!(T0));
    assert_eq!(answer["beyond_retention"], json!(false));
    let groups: Vec<_> = answer["groups"].as_array().unwrap().iter().map(row).collect();
    assert_eq!(
        groups,
        [
            (
                json!("east"),
                Value::Null,
                json!(2),
                gpu_ms(8_000.0 + 4_000.0),
                gpu_ms(5_600.0 + 2_000.0)
            ),
            (json!("west"), Value::Null, json!(1), gpu_ms(2_000.0), gpu_ms(2_000.0)),
        ]
    );
    let east = &answer["groups"][0];
    assert_eq!(east["badput_gpu_ms"]["waiting_to_start_ms"], gpu_ms(8.0 * 100.0));
    assert_eq!(east["badput_gpu_ms"]["restarting_ms"], gpu_ms(8.0 * 200.0));
    assert_eq!(east["badput_gpu_ms"]["stalled_ms"], gpu_ms(2.0 * 1_000.0));
    assert_eq!(east["ratio"].as_f64().unwrap(), 7_600.0 / 12_000.0);
    assert_eq!(answer["total"]["runs"], json!(3));
    assert_eq!(answer["total"]["wall_gpu_ms"], gpu_ms(14_000.0));
    assert_eq!(answer["total"]["productive_gpu_ms"], gpu_ms(9_600.0));

    // By name: one group per name and cluster, most GPU time lost first
    // (llm in east lost 2,400 GPU-s, eval 2,000, llm in west none).
    let answer = goodput(&http, &base, &format!("since={T0}&by=name")).await;
    let groups: Vec<_> = answer["groups"].as_array().unwrap().iter().map(row).collect();
    assert_eq!(
        groups,
        [
            expect("llm", Some("east"), 1, 8_000.0, 5_600.0),
            expect("eval", Some("east"), 1, 4_000.0, 2_000.0),
            expect("llm", Some("west"), 1, 2_000.0, 2_000.0),
        ]
    );

    // By node: A's attempts span 100→600 s (to the next attempt's start)
    // and 600→1,000 s: 0.5 and 0.4 of its 1,000 s (the 100 s before the
    // first attempt are on no node). f-node0 holds the first: 0.5 × 8 ×
    // 1,000 = 4,000 GPU-s, 0.5 × 5,600 = 2,800 productive; the second is
    // spread over two nodes of 4 GPUs: 0.4 × 8 × 1,000 / 2 = 1,600 GPU-s
    // each, 0.4 × 5,600 / 2 = 1,120 productive.
    let answer = goodput(&http, &base, &format!("since={T0}&by=node")).await;
    let groups: Vec<_> = answer["groups"].as_array().unwrap().iter().map(row).collect();
    assert_eq!(
        groups,
        [
            expect("b-node0", Some("east"), 1, 4_000.0, 2_000.0),
            expect("f-node0", Some("east"), 1, 4_000.0, 2_800.0),
            expect("e-node0", Some("east"), 1, 1_600.0, 1_120.0),
            expect("e-node1", Some("east"), 1, 1_600.0, 1_120.0),
            expect("w-node0", Some("west"), 1, 2_000.0, 2_000.0),
        ]
    );
    assert_eq!(answer["total"]["wall_gpu_ms"], gpu_ms(14_000.0), "the total is every run's");

    // A window from 500 s after T0 holds half of A's span and three
    // quarters of B's: every bucket scaled alike.
    let since = T0 + 500 * S;
    let answer = goodput(&http, &base, &format!("since={since}&cluster=east")).await;
    let groups: Vec<_> = answer["groups"].as_array().unwrap().iter().map(row).collect();
    assert_eq!(
        groups,
        [(
            json!("east"),
            Value::Null,
            json!(2),
            gpu_ms(4_000.0 + 3_000.0),
            gpu_ms(2_800.0 + 1_500.0)
        )]
    );
    assert_eq!(answer["groups"][0]["badput_gpu_ms"]["stalled_ms"], gpu_ms(0.75 * 2_000.0));
    assert_eq!(answer["total"]["runs"], json!(2), "west's run is not asked for");

    // The default window is the last 7 days: everything here; a window
    // from before the oldest retained run says so.
    let answer = goodput(&http, &base, "").await;
    assert_eq!(answer["since_ms"], json!(NOW - 7 * 24 * 3_600 * S));
    assert_eq!(answer["beyond_retention"], json!(true));
    assert_eq!(answer["total"]["wall_gpu_ms"], gpu_ms(14_000.0));

    // D: west, live, 2 GPUs, started an hour ago, counted to 10 minutes
    // ago (3,000 s productive): read now, its last 600 s count as
    // productive (it is RUNNING), then 1,000 s more on the clock.
    let d = forwarded(
        "west",
        "live",
        workers(2, 2, "d-"),
        NOW - 3_600 * S,
        None,
        &[NOW - 3_600 * S],
        &[],
        &[(Productive, 3_000)],
        NOW - 600 * S,
    );
    put(&http, &base, &d).await;
    let answer = goodput(&http, &base, &format!("since={T0}&cluster=west&by=name")).await;
    let live =
        answer["groups"].as_array().unwrap().iter().find(|g| g["key"] == json!("live")).unwrap();
    assert_eq!(
        (live["live"].clone(), live["wall_gpu_ms"].clone()),
        (json!(1), gpu_ms(2.0 * 3_600.0))
    );
    clock.advance_ms(1_000 * S);
    let answer = goodput(&http, &base, &format!("since={T0}&cluster=west")).await;
    assert_eq!(answer["until_ms"], json!(NOW + 1_000 * S));
    assert_eq!(answer["total"]["live"], json!(1));
    assert_eq!(answer["total"]["wall_gpu_ms"], gpu_ms(2_000.0 + 2.0 * 4_600.0));
    assert_eq!(answer["total"]["productive_gpu_ms"], gpu_ms(2_000.0 + 2.0 * 4_600.0));

    // Prometheus: the live run's ratio and badput, each cluster's figures.
    let (status, text) = send_text(&http, &format!("{base}/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        samples(&text, "trainstate_run_goodput_ratio"),
        [format!(
            r#"trainstate_run_goodput_ratio{{run_id="{}",name="live",cluster="west"}} 1.0"#,
            d.id()
        )],
        "{text}"
    );
    assert_eq!(samples(&text, "trainstate_run_badput_seconds").len(), 6, "one per badput bucket");
    assert!(text.contains(&format!(
        r#"trainstate_run_badput_seconds{{run_id="{}",bucket="stalled"}} 0.0"#,
        d.id()
    )));
    let east_ratio = samples(&text, r#"trainstate_cluster_goodput_ratio{cluster="east"}"#);
    assert_eq!(east_ratio.len(), 1, "{text}");
    let value: f64 = east_ratio[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert!((value - 7_600.0 / 12_000.0).abs() < 1e-9, "{value}");
    assert!(
        text.contains(
            r#"trainstate_cluster_badput_gpu_seconds{cluster="east",bucket="stalled"} 2000.0"#
        ),
        "{text}"
    );
    assert!(text.contains("# HELP trainstate_cluster_badput_gpu_seconds GPU time"), "{text}");

    // Bad input: 422 naming the field, and nothing changes.
    for (query, field) in
        [("since=yesterday", "since"), ("by=rack", "by"), ("cluster=a%07b", "cluster")]
    {
        let url = format!("{base}/api/train/goodput?{query}");
        let (status, body) = send(&http, Method::GET, &url, None, None).await;
        assert_eq!(
            (status, &body["error"]["code"], &body["error"]["field"]),
            (StatusCode::UNPROCESSABLE_ENTITY, &json!("invalid"), &json!(field)),
            "{query}: {body}"
        );
    }

    // The same answer in process, from the same view, with the same checks.
    let handle = server.service.handle();
    let mut query = GoodputQuery::default();
    query.since = Some(T0.to_string());
    let local = handle.goodput(query).await.unwrap();
    assert_eq!(local.total.runs, 4);
    assert_eq!(local.total.wall_gpu_ms, 1_000 * (14_000 + 2 * 4_600));
    let mut bad = GoodputQuery::default();
    bad.since = Some("yesterday".into());
    match handle.goodput(bad).await {
        Err(StateError::Invalid { field, .. }) => assert_eq!(field, "since"),
        other => panic!("a bad since is refused naming it: {other:?}"),
    }

    // The CLI against the same hub: a table by name, its JSON, and the
    // line that says the window is beyond retention.
    let args = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["goodput", "--url", &base].map(String::from).to_vec();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args
    };
    let (ok, out, err) =
        cli(args(&["--since", &T0.to_string(), "--by", "name", "--cluster", "east"])).await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{out}");
    assert!(
        lines[1].starts_with("llm") && lines[1].contains("east") && lines[1].contains("70.0%"),
        "{out}"
    );
    assert!(lines[1].contains("restarting"), "the largest badput bucket is named: {out}");
    assert!(
        lines[2].starts_with("eval") && lines[2].contains("50.0%") && lines[2].contains("stalled"),
        "{out}"
    );
    assert!(!out.contains("beyond"), "{out}");
    let (ok, out, err) = cli(args(&["--since", &T0.to_string(), "--json"])).await;
    assert!(ok, "{err}");
    let parsed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(parsed["total"]["runs"], json!(4));
    let (ok, out, _) = cli(args(&["--since", "2000-01-01T00:00:00Z"])).await;
    assert!(ok);
    assert!(out.lines().next().unwrap().contains("before what the head retains"), "{out}");
    let (ok, _, err) = cli(args(&["--by", "rack"])).await;
    assert!(!ok && err.contains("rack"), "{err}");
    server.stop().await;
}

async fn send_text(http: &Client, url: &str) -> (StatusCode, String) {
    let response = http.get(url).send().await.unwrap();
    (response.status(), response.text().await.unwrap())
}
