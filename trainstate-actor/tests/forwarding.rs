//! Many clusters, one history: heads forward their runs to a hub, which
//! keeps them as they are, resumes after either side restarts, and keeps
//! them after their cluster is gone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::http::HttpConfig;
use trainstate_actor::{ManualClock, launch_state_actor};
use trainstate_client::RunQuery;
use trainstate_schema::{RunId, RunStatus, TrainRunInfo};

use crate::common::{Server, eventually, run, run_with, start_head};
use crate::contract::send;
use crate::process::without_heartbeat;
use crate::stores::on_both_stores;

const T0: u64 = 1_760_000_000_000;

/// `run` as the head of cluster `cluster` stores it.
fn in_cluster(run: &TrainRunInfo, cluster: &str) -> TrainRunInfo {
    let mut draft = run.clone().into_draft();
    draft.cluster = Some(cluster.to_owned());
    draft.validate().unwrap()
}

fn json_body(value: &impl serde::Serialize) -> Option<(&'static str, Vec<u8>)> {
    Some(("application/json", serde_json::to_vec(value).unwrap()))
}

/// Every run a head lists (of `cluster`, if given), by id, without the
/// heartbeat time; fails if a run is listed twice.
async fn runs_of(http: &Client, base: &str, cluster: Option<&str>) -> HashMap<String, Value> {
    let filter = cluster.map(|c| format!("&cluster={c}")).unwrap_or_default();
    let url = format!("{base}/api/train/runs?limit=1000{filter}");
    let (status, page) = send(http, Method::GET, &url, None, None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let runs = page["train_runs"].as_array().unwrap();
    let by_id: HashMap<String, Value> = runs
        .iter()
        .map(|r| (r["id"].as_str().unwrap().to_owned(), without_heartbeat(r.clone())))
        .collect();
    assert_eq!(by_id.len(), runs.len(), "a run is listed once");
    assert_eq!(page["total"].as_u64(), Some(runs.len() as u64));
    by_id
}

on_both_stores! {
    async fn the_hub_stores_forwarded_runs_as_they_are_and_never_takes_one_back(store) {
        let fresh = store.fresh("hub-rules").await;
        let clock = Arc::new(ManualClock::new(T0 + 1_000));
        let config = fresh
            .config()
            .with_clock(clock.clone())
            .with_sweep_interval(Duration::from_secs(3600))
            .with_cluster(Some("hub".into()));
        let server = Server::start(config, HttpConfig::default()).await;
        let http = Client::new();
        let live = in_cluster(&run("forwarded", T0), "c1");
        let url = format!("{}/api/train/forwarded/{}", server.url, live.id());
        let put = |body: Value| {
            let (http, url) = (http.clone(), url.clone());
            async move { send(&http, Method::PUT, &url, json_body(&body), None).await }
        };

        let (status, stored) = put(serde_json::to_value(&live).unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{stored}");
        assert_eq!(stored, serde_json::to_value(&live).unwrap(), "stored as it is");
        let (status, again) = put(serde_json::to_value(&live).unwrap()).await;
        assert_eq!((status, &again), (StatusCode::OK, &stored), "a repeat changes nothing");

        // The hub never aborts another cluster's run, nor lets anyone but
        // its head change it.
        clock.advance_ms(3_600_000);
        assert!(server.service.handle().sweep_leases().await.unwrap().is_empty());
        let (status, refused) = send(
            &http,
            Method::POST,
            &format!("{}/api/train/runs/{}/status", server.url, live.id()),
            json_body(&json!({"status": "FINISHED"})),
            None,
        )
        .await;
        assert_eq!((status, &refused["error"]["code"]), (StatusCode::CONFLICT, &json!("conflict")));

        let finished = trainstate_testkit::runs::ended(&live, RunStatus::Finished);
        let (status, stored) = put(serde_json::to_value(&finished).unwrap()).await;
        assert_eq!((status, &stored["run_status"]), (StatusCode::OK, &json!("FINISHED")));

        // Going back, another name, another cluster, no cluster: refused.
        let (status, body) = put(serde_json::to_value(&live).unwrap()).await;
        assert_eq!((status, &body["error"]["code"]), (StatusCode::CONFLICT, &json!("illegal_transition")));
        let mut renamed = serde_json::to_value(&finished).unwrap();
        renamed["name"] = json!("renamed");
        let (status, body) = put(renamed).await;
        assert_eq!((status, &body["error"]["code"]), (StatusCode::CONFLICT, &json!("conflict")));
        // Another cluster's run with the same id is that cluster's own,
        // under its qualified id: the hub keys runs by cluster and id.
        let mut moved = serde_json::to_value(&finished).unwrap();
        moved["cluster"] = json!("c2");
        let (status, body) = put(moved).await;
        assert_eq!((status, &body["id"]), (StatusCode::OK, &json!(format!("c2:{}", live.id()))), "{body}");
        let mut nameless = serde_json::to_value(&finished).unwrap();
        nameless.as_object_mut().unwrap().remove("cluster");
        let (status, body) = put(nameless).await;
        assert_eq!((status, &body["error"]["field"]), (StatusCode::UNPROCESSABLE_ENTITY, &json!("cluster")));
        let mut own = serde_json::to_value(&finished).unwrap();
        own["cluster"] = json!("hub");
        let (status, _) = put(own).await;
        assert_eq!(status, StatusCode::CONFLICT, "a hub's own runs are not forwarded to it");

        // Listed by cluster.
        assert_eq!(runs_of(&http, &server.url, Some("c1")).await.len(), 1);
        assert_eq!(runs_of(&http, &server.url, Some("c2")).await.len(), 1);
        server.stop().await;
    }

    async fn a_head_stamps_its_cluster_on_every_run_it_registers(store) {
        let fresh = store.fresh("stamp").await;
        let service = launch_state_actor(fresh.config().with_cluster(Some("c1".into()))).await.unwrap();
        let state = service.handle();
        let mut elsewhere = run("named-elsewhere", T0).into_draft();
        elsewhere.cluster = Some("other".into());
        for r in [run("plain", T0), elsewhere.validate().unwrap()] {
            let stored = state.register(r).await.unwrap().run.parse().unwrap();
            assert_eq!(stored.cluster(), Some("c1"));
        }
        let page = state.list(RunQuery::all().cluster("c1")).await.unwrap();
        assert_eq!(page.total, 2);
        service.shutdown().await;
    }
}

/// Registers `n` runs through `head` (`first` numbers their names) and
/// finishes every third; returns their ids.
async fn write_runs(http: &Client, head: &str, first: u64, n: u64) -> Vec<RunId> {
    let mut ids = Vec::new();
    for i in first..first + n {
        let r = run_with(&RunId::new_v7(), &format!("run{i}"), "job", T0 + i, 4);
        let url = format!("{head}/api/train/runs");
        let (status, body) = send(http, Method::POST, &url, json_body(&r), None).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        if i.is_multiple_of(3) {
            let url = format!("{head}/api/train/runs/{}/status", r.id());
            let (status, body) =
                send(http, Method::POST, &url, json_body(&json!({"status": "FINISHED"})), None)
                    .await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        ids.push(r.id().clone());
    }
    ids
}

/// Waits until the hub holds exactly the head's runs, once each, equal.
async fn wait_until_forwarded(http: &Client, head: &str, hub: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let want = runs_of(http, head, None).await;
        let have = runs_of(http, hub, Some("c1")).await;
        if want == have {
            assert!(want.values().all(|r| r["cluster"] == "c1"));
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the hub has {} of the head's {} runs (or other versions)",
            have.iter().filter(|(id, run)| want.get(*id) == Some(run)).count(),
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

on_both_stores! {
    multi_thread:

    /// The hub's store is the parameter; the head keeps SQLite.
    async fn a_hub_that_stops_and_starts_again_ends_with_every_run_once_equal_to_the_heads(store) {
        let fresh = store.fresh("hub").await;
        let token = fresh.dir().join("hub.token");
        std::fs::write(&token, "hub-secret\n").unwrap();
        let token = token.to_str().unwrap().to_owned();
        let hub_dir = fresh.dir().join("hub");
        let mut hub_args = vec!["--token-file", &token];
        if let Some(url) = fresh.url() {
            hub_args.extend(["--store", url]);
        }
        let mut hub = start_head(&hub_dir, &hub_args).unwrap();
        let hub_listen = format!("127.0.0.1:{}", hub.port());
        let hub_url = hub.url.clone();
        let head_dir = tempfile::tempdir().unwrap();
        let head_args = [
            "--cluster", "c1", "--forward-to", &hub_url, "--forward-token-file", &token,
        ];
        let mut head = start_head(head_dir.path(), &head_args).unwrap();
        let http = Client::new();

        write_runs(&http, &head.url, 0, 20).await;
        wait_until_forwarded(&http, &head.url, &hub_url).await;

        // The hub goes away; the head keeps taking writes, and restarts.
        hub.signal("-KILL");
        hub.wait();
        let earlier = write_runs(&http, &head.url, 20, 30).await;
        for id in &earlier[1..10] {
            let url = format!("{}/api/train/runs/{id}/status", head.url);
            let _ = send(&http, Method::POST, &url, json_body(&json!({"status": "FINISHED"})), None).await;
        }
        head.signal("-KILL");
        head.wait();
        let head = start_head(head_dir.path(), &head_args).unwrap();
        write_runs(&http, &head.url, 50, 10).await;

        // Back on its address: everything arrives, once, as the head has it.
        let _hub = crate::common::serve(&hub_dir).listen(&hub_listen).args(&hub_args).start().unwrap();
        wait_until_forwarded(&http, &head.url, &hub_url).await;
        assert_eq!(runs_of(&http, &hub_url, Some("c1")).await.len(), 60);

        // The cluster goes away: its runs stay on the hub.
        drop(head);
        drop(head_dir);
        assert_eq!(runs_of(&http, &hub_url, Some("c1")).await.len(), 60);
    }
}

on_both_stores! {
    multi_thread:

    /// The hub's store is the parameter; the heads keep SQLite.
    async fn regression_a_head_forwards_with_its_clusters_token_and_another_clusters_token_forwards_nothing(store) {
        use trainstate_actor::forward::{ForwardConfig, start_forwarding};
        use trainstate_client::api::TokenScope;

        use crate::tokens::{create, hub};

        let fresh = store.fresh("bound-forward").await;
        let hub = hub(&fresh, false).await;
        let (_, token_a) = create(&hub.url, &[TokenScope::Write], Some("a")).await;
        let head = |cluster: &str, dir: &std::path::Path| {
            trainstate_actor::StateConfig::sqlite(dir.join("head.db"))
                .with_name(crate::common::unique_name(cluster))
                .with_cluster(Some(cluster.to_owned()))
        };
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let head_a = Server::start(head("a", dir_a.path()), HttpConfig::default()).await;
        // Cluster b's head was given a's token by mistake (or stole it).
        let head_b = Server::start(head("b", dir_b.path()), HttpConfig::default()).await;
        let run_a = run("of-a", T0);
        let run_b = run("of-b", T0);
        head_a.service.handle().register(run_a.clone()).await.unwrap();
        head_b.service.handle().register(run_b.clone()).await.unwrap();
        let forward = |service: &trainstate_actor::StateService, cluster: &str| {
            let config = ForwardConfig::new(hub.url.clone(), cluster.to_owned())
                .with_token(Some(token_a.clone()));
            start_forwarding(service, config).unwrap()
        };
        let forwarder_a = forward(&head_a.service, "a");
        let forwarder_b = forward(&head_b.service, "b");

        let http = Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let hub_runs = runs_of(&http, &hub.url, None).await;
            let b_refused = forwarder_b.stats().retries.load(std::sync::atomic::Ordering::Relaxed);
            if hub_runs.contains_key(run_a.id().as_str()) && b_refused >= 2 {
                assert_eq!(hub_runs[run_a.id().as_str()]["cluster"], "a");
                break;
            }
            assert!(Instant::now() < deadline, "a's run forwarded and b's refused: {hub_runs:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // b's run, refused as forbidden each time, never reached the hub.
        let hub_runs = runs_of(&http, &hub.url, None).await;
        assert_eq!(hub_runs.len(), 1, "{hub_runs:?}");
        assert_eq!(forwarder_b.stats().forwarded.load(std::sync::atomic::Ordering::Relaxed), 0);
        forwarder_a.stop().await;
        forwarder_b.stop().await;
        head_a.stop().await;
        head_b.stop().await;
        hub.stop().await;
    }
}

/// One reading of the head's `/metrics`.
async fn metric(http: &Client, base: &str, name: &str) -> f64 {
    let text = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in {text}"))
}

/// Waits until the head's `/metrics` `name` satisfies `condition`.
async fn wait_for_metric(
    http: &Client,
    base: &str,
    name: &str,
    condition: impl Fn(f64) -> bool,
) -> f64 {
    eventually(name, Duration::from_secs(60), || async {
        let value = metric(http, base, name).await;
        condition(value).then_some(value)
    })
    .await
}

/// Finding 11 of round two (forwarding): a head that forwards showed
/// nothing of it on `/metrics`, so a hub that stopped taking runs went
/// unnoticed. Now `trainstate_forward_pending` (runs read and not yet
/// accepted), `…_sent_total`, `…_failures_total` and
/// `…_last_success_timestamp_seconds` say how forwarding goes: while the
/// hub cannot take writes (its store writer held), runs wait and failures
/// grow; once it can, they are sent and nothing waits.
#[tokio::test(flavor = "multi_thread")]
async fn regression_forwarding_shows_pending_sent_failures_and_last_success_on_metrics() {
    use trainstate_actor::forward::{ForwardConfig, start_forwarding};
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(trainstate_actor::Faults::default());
    let hub_config = trainstate_actor::StateConfig::sqlite(dir.path().join("hub.db"))
        .with_name(format!("hub-{}", RunId::new_v7()))
        .with_cluster(Some("hub".into()))
        .with_faults(faults.clone());
    let hub = Server::start(hub_config, HttpConfig::default()).await;
    let head_config = trainstate_actor::StateConfig::sqlite(dir.path().join("head.db"))
        .with_name(format!("head-{}", RunId::new_v7()))
        .with_cluster(Some("c1".into()));
    let head = Server::start(head_config, HttpConfig::default()).await;
    let forward =
        ForwardConfig::new(hub.url.clone(), "c1").with_call_timeout(Duration::from_millis(300));
    let forwarder = start_forwarding(&head.service, forward).unwrap();
    let http = Client::new();
    let (sent, pending, failures, last) = (
        "trainstate_forward_sent_total",
        "trainstate_forward_pending",
        "trainstate_forward_failures_total",
        "trainstate_forward_last_success_timestamp_seconds",
    );

    write_runs(&http, &head.url, 0, 3).await;
    wait_until_forwarded(&http, &head.url, &hub.url).await;
    let sent_before = wait_for_metric(&http, &head.url, sent, |v| v >= 3.0).await;
    assert_eq!(metric(&http, &head.url, pending).await, 0.0);
    assert_eq!(metric(&http, &head.url, failures).await, 0.0);
    let last_before = metric(&http, &head.url, last).await;
    assert!(last_before > 1.0e9, "a Unix time in seconds: {last_before}");

    // The hub stops taking writes: runs wait, failures grow.
    faults.hold_writer();
    write_runs(&http, &head.url, 3, 2).await;
    wait_for_metric(&http, &head.url, failures, |v| v >= 2.0).await;
    assert!(metric(&http, &head.url, pending).await >= 1.0);
    assert_eq!(metric(&http, &head.url, last).await, last_before, "no success while down");

    // Back: everything is sent and nothing waits.
    faults.release_writer();
    wait_until_forwarded(&http, &head.url, &hub.url).await;
    wait_for_metric(&http, &head.url, pending, |v| v == 0.0).await;
    assert!(metric(&http, &head.url, sent).await >= sent_before + 2.0);
    assert!(metric(&http, &head.url, last).await >= last_before);

    forwarder.stop().await;
    head.stop().await;
    hub.stop().await;
}

/// Finding 11c of round three: `trainstate_forward_pending` counted only
/// the batch being sent. With the hub unreachable, a head that had read
/// its first run showed 1 pending however many runs changed behind it.
/// Now every run with a change waiting is counted, each once however
/// often it changed (the forwarder sends a run once, as it is now).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_forward_pending_counts_every_run_waiting_not_only_the_batch_in_flight() {
    use trainstate_actor::forward::{ForwardConfig, start_forwarding};
    let dir = tempfile::tempdir().unwrap();
    // A hub no one listens on.
    let hub = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let head_config = trainstate_actor::StateConfig::sqlite(dir.path().join("head.db"))
        .with_name(format!("head-{}", RunId::new_v7()))
        .with_cluster(Some("c1".into()));
    let head = Server::start(head_config, HttpConfig::default()).await;
    let forward = ForwardConfig::new(hub, "c1").with_call_timeout(Duration::from_millis(300));
    let forwarder = start_forwarding(&head.service, forward).unwrap();
    let http = Client::new();
    let (pending, failures) = ("trainstate_forward_pending", "trainstate_forward_failures_total");

    // The first run is read and tried: the forwarder holds it.
    write_runs(&http, &head.url, 0, 1).await;
    wait_for_metric(&http, &head.url, failures, |v| v >= 1.0).await;
    // Nine more change behind it, three of them twice (registered, then
    // finished), as did the first.
    write_runs(&http, &head.url, 1, 9).await;
    // Ten runs wait, with fourteen changes among them: ten, each run is
    // sent once, as it is now.
    wait_for_metric(&http, &head.url, pending, |v| v == 10.0).await;
    assert_eq!(forwarder.stats().forwarded.load(std::sync::atomic::Ordering::Relaxed), 0);

    forwarder.stop().await;
    head.stop().await;
}
