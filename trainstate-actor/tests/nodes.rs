//! The node ledger through the real head: `trainstate serve` on a data
//! directory, runs registered over HTTP, the ledger read over HTTP, and
//! the same answer after a restart on the same directory.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use trainstate_schema::{CauseKind, RunCause, RunId, RunStatus, TrainWorkerInfo};
use trainstate_testkit::runs::{ended, run_with, workers};

use crate::common::start_head;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A run of two ranks over `group`, ended `status` with `cause`, started
/// `start_ms`.
fn ended_run(
    group: Vec<TrainWorkerInfo>,
    start_ms: u64,
    status: RunStatus,
    cause: Option<RunCause>,
) -> Value {
    let mut draft = run_with(&RunId::new_v7(), "train", "job", start_ms, 2).into_draft();
    draft.workers = group.into_iter().map(TrainWorkerInfo::into_draft).collect();
    let run = ended(&draft.validate().unwrap(), status);
    let mut draft = run.into_draft();
    draft.cause = cause;
    serde_json::to_value(draft.validate().unwrap()).unwrap()
}

async fn get(client: &reqwest::Client, url: &str) -> (reqwest::StatusCode, String) {
    let response = client.get(url).send().await.unwrap();
    (response.status(), response.text().await.unwrap())
}

#[tokio::test]
async fn a_node_under_three_infrastructure_failures_is_the_first_suspect_and_stays_one_after_a_restart()
 {
    let dir = tempfile::tempdir().unwrap();
    let mut head = start_head(dir.path(), &[]).unwrap();
    let client = reqwest::Client::new();
    let base = head.url.clone();
    let start = now_ms() - 3_600_000;
    // Rank 1 of each of three runs is on x-node1, and is killed by the
    // kernel's out-of-memory killer there.
    let mut failed = Vec::new();
    for i in 0..3 {
        let oom = RunCause::new(CauseKind::Oom, Some(1));
        let run = ended_run(workers(2, 1, "x-"), start + i, RunStatus::Errored, Some(oom));
        failed.push(run["id"].as_str().unwrap().to_owned());
        let response =
            client.post(format!("{base}/api/train/runs")).json(&run).send().await.unwrap();
        assert!(response.status().is_success(), "{}", response.text().await.unwrap());
    }
    for i in 0..10 {
        let run =
            ended_run(workers(2, 1, &format!("c{i}-")), start + 10 + i, RunStatus::Finished, None);
        let response =
            client.post(format!("{base}/api/train/runs")).json(&run).send().await.unwrap();
        assert!(response.status().is_success(), "{}", response.text().await.unwrap());
    }

    let check = |base: String| {
        let client = client.clone();
        let failed = failed.clone();
        async move {
            let (status, text) = get(&client, &format!("{base}/api/train/nodes")).await;
            assert_eq!(status, reqwest::StatusCode::OK, "{text}");
            let list: Value = serde_json::from_str(&text).unwrap();
            let nodes = list["nodes"].as_array().unwrap();
            assert_eq!(nodes.len(), 2 + 20, "x-node0, x-node1 and two nodes of each clean run");
            assert_eq!(nodes[0]["node"], json!("x-node1"));
            assert_eq!(nodes[0]["suspect"], json!(true));
            assert_eq!(nodes[0]["failures"]["infrastructure"], json!(3));
            assert!(nodes[0]["reason"].as_str().unwrap().contains("3 OOM"), "{}", nodes[0]);
            assert!(nodes[1..].iter().all(|n| n["suspect"] == json!(false)));

            let (_, suspects) = get(&client, &format!("{base}/api/train/nodes?suspect=true")).await;
            let suspects: Value = serde_json::from_str(&suspects).unwrap();
            assert_eq!(suspects["nodes"].as_array().unwrap().len(), 1);

            let (status, exclude) =
                get(&client, &format!("{base}/api/train/nodes?format=exclude")).await;
            assert_eq!((status, exclude.as_str()), (reqwest::StatusCode::OK, "x-node1\n"));

            let (status, text) = get(&client, &format!("{base}/api/train/nodes/x-node1")).await;
            assert_eq!(status, reqwest::StatusCode::OK, "{text}");
            let detail: Value = serde_json::from_str(&text).unwrap();
            let mut runs: Vec<&str> = detail["nodes"][0]["runs"]["failures"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["run_id"].as_str().unwrap())
                .collect();
            runs.sort_unstable();
            let mut expected: Vec<&str> = failed.iter().map(String::as_str).collect();
            expected.sort_unstable();
            assert_eq!(runs, expected);
            assert_eq!(detail["nodes"][0]["runs"]["failures"][0]["kind"], json!("OOM"));
        }
    };
    check(base.clone()).await;
    let (_, text) = get(&client, &format!("{base}/api/train/nodes/x-node1")).await;
    let detail: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(detail["nodes"][0]["attempts"], json!(3));
    assert_eq!(detail["nodes"][0]["runs"]["attempts"].as_array().unwrap().len(), 3);

    // A rank joining from the suspect node is warned, and joins.
    let worker = workers(2, 1, "x-")[1].clone().into_draft();
    let join = json!({"world_size": 2, "worker": worker, "name": "again", "job_id": "j"});
    let response = client
        .post(format!("{base}/api/train/rendezvous/again-1/join"))
        .json(&join)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["joined"], json!(1));
    let warning = answer["warning"].as_str().unwrap();
    assert!(
        warning.starts_with("node x-node1 is a suspect: 3 infrastructure failures"),
        "{warning}"
    );
    assert!(warning.ends_with("see /api/train/nodes/x-node1"), "{warning}");
    // Its peer on a node that is no suspect completes the group: no warning
    // for it, and the run's record notes the suspect.
    let peer = workers(2, 1, "x-")[0].clone().into_draft();
    let join = json!({"world_size": 2, "worker": peer, "name": "again", "job_id": "j"});
    let answer: Value = client
        .post(format!("{base}/api/train/rendezvous/again-1/join"))
        .json(&join)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!((&answer["joined"], answer.get("warning")), (&json!(2), None), "{answer}");
    let id = answer["run_id"].as_str().unwrap();
    let (_, run) = get(&client, &format!("{base}/api/train/runs/{id}")).await;
    let run: Value = serde_json::from_str(&run).unwrap();
    assert_eq!(
        run["status_detail"],
        json!("ranks joined from suspect nodes: x-node1 (see /api/train/nodes)")
    );
    // A rank from a clean node is not.
    let clean = workers(2, 1, "c0-")[0].clone().into_draft();
    let join = json!({"world_size": 2, "worker": clean, "name": "clean", "job_id": "j"});
    let answer: Value = client
        .post(format!("{base}/api/train/rendezvous/clean-1/join"))
        .json(&join)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(answer.get("warning").is_none(), "{answer}");

    // Bad input: a node name past the limit, control characters, a bad since.
    let long = "n".repeat(trainstate_schema::limits::MAX_NODE_NAME_LEN + 1);
    for (url, field) in [
        (format!("{base}/api/train/nodes/{long}"), "node"),
        (format!("{base}/api/train/nodes/a%07b"), "node"),
        (format!("{base}/api/train/nodes?since=yesterday"), "since"),
        (format!("{base}/api/train/nodes/x-node1?since=2026-13-01T00:00:00Z"), "since"),
    ] {
        let (status, text) = get(&client, &url).await;
        let err: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (status.as_u16(), &err["error"]["field"]),
            (422, &json!(field)),
            "{url}: {text}"
        );
    }
    let (status, _) = get(&client, &format!("{base}/api/train/nodes/never-seen")).await;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND);
    // A window older than anything kept says so.
    let (_, text) =
        get(&client, &format!("{base}/api/train/nodes?since=2000-01-01T00:00:00Z")).await;
    let old: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(old["beyond_retention"], json!(true));
    assert_eq!(old["retained_since_ms"], json!(start));

    // The ledger is rebuilt from the store: the same answer after a restart.
    head.stop();
    let head = start_head(dir.path(), &[]).unwrap();
    let base = head.url.clone();
    check(base.clone()).await;

    // Prometheus: the suspect and its failures by class, then the bound.
    let (_, text) = get(&client, &format!("{base}/metrics")).await;
    assert_eq!(
        samples(&text, "trainstate_node_suspect")
            .iter()
            .filter(|l| l.ends_with(" 1"))
            .collect::<Vec<_>>(),
        [&r#"trainstate_node_suspect{node="x-node1",cluster=""} 1"#],
        "{text}"
    );
    assert_eq!(samples(&text, "trainstate_node_suspect").len(), 22);
    assert!(
        text.contains(
            r#"trainstate_node_failures{node="x-node1",cluster="",class="INFRASTRUCTURE"} 3"#
        ),
        "{text}"
    );
    assert_eq!(
        samples(&text, "trainstate_node_series_omitted"),
        ["trainstate_node_series_omitted 0"]
    );
    // A run over 1,000 more nodes: the series stop at 1,000, the suspect kept.
    let wide = ended_run(workers(1_000, 1, "w-"), start + 100, RunStatus::Finished, None);
    let response = client.post(format!("{base}/api/train/runs")).json(&wide).send().await.unwrap();
    assert!(response.status().is_success(), "{}", response.text().await.unwrap());
    let (_, text) = get(&client, &format!("{base}/metrics")).await;
    assert_eq!(samples(&text, "trainstate_node_suspect").len(), 1_000);
    assert!(text.contains(r#"trainstate_node_suspect{node="x-node1",cluster=""} 1"#));
    assert_eq!(
        samples(&text, "trainstate_node_series_omitted"),
        ["trainstate_node_series_omitted 22"]
    );
}

/// The lines of `metric`'s samples in Prometheus text.
fn samples<'a>(text: &'a str, metric: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|line| line.strip_prefix(metric).is_some_and(|rest| rest.starts_with(['{', ' '])))
        .collect()
}

/// Two heads on one PostgreSQL database answer the same ledger: failures
/// written through one are counted by the other (its view follows the
/// shared store), and a rank joining through the other from the suspect
/// node is warned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn two_heads_on_one_postgresql_answer_the_same_ledger() {
    let fresh = crate::stores::Store::Postgres.fresh("ledger").await;
    let url = fresh.url().unwrap().to_owned();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = start_head(dir_a.path(), &["--store", &url]).unwrap();
    let b = start_head(dir_b.path(), &["--store", &url]).unwrap();
    let client = reqwest::Client::new();
    let start = now_ms() - 3_600_000;
    for i in 0..2 {
        let oom = RunCause::new(CauseKind::Oom, Some(1));
        let run = ended_run(workers(2, 1, "pg-"), start + i, RunStatus::Errored, Some(oom));
        let response =
            client.post(format!("{}/api/train/runs", a.url)).json(&run).send().await.unwrap();
        assert!(response.status().is_success(), "{}", response.text().await.unwrap());
    }
    let exclude = |base: String| {
        let client = client.clone();
        async move { get(&client, &format!("{base}/api/train/nodes?format=exclude")).await.1 }
    };
    crate::common::eventually(
        "B to count A's failures",
        std::time::Duration::from_secs(10),
        || {
            let exclude = exclude(b.url.clone());
            async move { exclude.await == "pg-node1\n" }
        },
    )
    .await;
    assert_eq!(exclude(a.url.clone()).await, "pg-node1\n");
    // One window for both, so that their reasons name the same start.
    let since = start - 60_000;
    let (_, from_a) = get(&client, &format!("{}/api/train/nodes?since={since}", a.url)).await;
    let (_, from_b) = get(&client, &format!("{}/api/train/nodes?since={since}", b.url)).await;
    let (from_a, from_b): (Value, Value) =
        (serde_json::from_str(&from_a).unwrap(), serde_json::from_str(&from_b).unwrap());
    assert_eq!(from_a["nodes"], from_b["nodes"], "both heads count the same");

    let worker = workers(2, 1, "pg-")[1].clone().into_draft();
    let join = json!({"world_size": 2, "worker": worker, "name": "pg-again", "job_id": "j"});
    let answer: Value = client
        .post(format!("{}/api/train/rendezvous/pg-again-1/join", b.url))
        .json(&join)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["joined"], json!(1), "{answer}");
    let warning = answer["warning"].as_str().unwrap_or_default();
    assert!(warning.starts_with("node pg-node1 is a suspect"), "{answer}");
}
