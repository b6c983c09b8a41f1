//! Ray Train V2: its lifecycle in our model, its route as Ray serves it,
//! its whole-object writes, and a store written by an earlier release.

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::StateConfig;
use trainstate_actor::http::HttpConfig;
use trainstate_schema::RunId;

use crate::common::{Server, run_with, unique_name};
use crate::contract::send;

const T0: u64 = 1_760_000_000_000;

pub(crate) fn fixture(path: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(path);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

async fn server() -> Server {
    Server::start(StateConfig::in_memory().with_name(unique_name("v2")), HttpConfig::default())
        .await
}

fn body(value: &Value) -> Option<(&'static str, Vec<u8>)> {
    Some(("application/json", serde_json::to_vec(value).unwrap()))
}

/// A V2 run document from a dashboard run: its own fields, with `status`.
fn v2_run(dashboard_run: &Value, status: &str, ended: bool) -> Value {
    let mut run = json!({});
    for key in [
        "id",
        "name",
        "job_id",
        "controller_actor_id",
        "start_time_ns",
        "controller_log_file_path",
        "framework_versions",
        "run_settings",
    ] {
        run[key] = dashboard_run[key].clone();
    }
    run["status"] = status.into();
    if ended {
        run["status_detail"] = dashboard_run["status_detail"].clone();
        run["end_time_ns"] = dashboard_run["end_time_ns"].clone();
    }
    run
}

/// A V2 attempt document from a dashboard attempt, at `status`.
fn v2_attempt(attempt: &Value, status: &str, with_workers: bool, ended: bool) -> Value {
    let mut doc = json!({
        "run_id": attempt["run_id"],
        "attempt_id": attempt["attempt_id"],
        "status": status,
        "start_time_ns": attempt["start_time_ns"],
        "resources": [],
        "workers": [],
    });
    if with_workers {
        let workers: Vec<Value> = attempt["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                let mut w = w.clone();
                let object = w.as_object_mut().unwrap();
                object.remove("processStats");
                object.remove("gpus");
                object.insert("status".into(), "ALIVE".into());
                w
            })
            .collect();
        doc["resources"] = attempt["resources"].clone();
        doc["workers"] = workers.into();
    }
    if ended {
        doc["status_detail"] = attempt["status_detail"].clone();
        doc["end_time_ns"] = attempt["end_time_ns"].clone();
    }
    doc
}

/// Writes every run of Ray's dashboard answer the way Ray's controller
/// does: the run as it starts, each attempt pending, running, ended, then
/// the run's end. Oldest run first.
async fn write_like_ray(client: &Client, url: &str, dashboard: &Value) {
    let put = |path: String, doc: Value| async move {
        let (status, answer) =
            send(client, Method::PUT, &format!("{url}{path}"), body(&doc), None).await;
        assert_eq!(status, StatusCode::OK, "PUT {path}: {answer}");
        answer
    };
    for run in dashboard["train_runs"].as_array().unwrap().iter().rev() {
        let id = run["id"].as_str().unwrap();
        put(format!("/api/train/v2/runs/{id}"), v2_run(run, "INITIALIZING", false)).await;
        put(format!("/api/train/v2/runs/{id}"), v2_run(run, "SCHEDULING", false)).await;
        for attempt in run["attempts"].as_array().unwrap() {
            let path = format!(
                "/api/train/v2/runs/{id}/attempts/{}",
                attempt["attempt_id"].as_str().unwrap()
            );
            put(path.clone(), v2_attempt(attempt, "PENDING", false, false)).await;
            put(path.clone(), v2_attempt(attempt, "RUNNING", true, false)).await;
            put(format!("/api/train/v2/runs/{id}"), v2_run(run, "RUNNING", false)).await;
            let end = attempt["status"].as_str().unwrap();
            put(path, v2_attempt(attempt, end, true, true)).await;
        }
        let end = run["status"].as_str().unwrap();
        let answer = put(format!("/api/train/v2/runs/{id}"), v2_run(run, end, true)).await;
        // The V1 view of the same run.
        assert_eq!(answer["run_status"], end);
    }
}

/// The fields Ray's dashboard and trainstate both carry, times to the ms.
pub(crate) fn shared_fields(run: &Value) -> Value {
    let ms = |v: &Value| v.as_u64().map(|ns| ns / 1_000_000);
    let attempts: Vec<Value> = run["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let workers: Vec<Value> = a["workers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| {
                    json!({
                        "world_rank": w["world_rank"], "local_rank": w["local_rank"],
                        "node_rank": w["node_rank"], "actor_id": w["actor_id"],
                        "node_id": w["node_id"], "node_ip": w["node_ip"], "pid": w["pid"],
                        "gpu_ids": w["gpu_ids"], "status": w["status"],
                        "resources": w["resources"], "log_file_path": w["log_file_path"],
                    })
                })
                .collect();
            json!({
                "attempt_id": a["attempt_id"], "status": a["status"],
                "status_detail": a["status_detail"], "start_ms": ms(&a["start_time_ns"]),
                "end_ms": ms(&a["end_time_ns"]), "resources": a["resources"], "workers": workers,
            })
        })
        .collect();
    json!({
        "id": run["id"], "name": run["name"], "job_id": run["job_id"],
        "controller_actor_id": run["controller_actor_id"], "status": run["status"],
        "status_detail": run["status_detail"], "start_ms": ms(&run["start_time_ns"]),
        "end_ms": ms(&run["end_time_ns"]),
        "controller_log_file_path": run["controller_log_file_path"],
        "framework_versions": run["framework_versions"], "run_settings": run["run_settings"],
        "attempts": attempts,
    })
}

/// Validates an answer of the V2 route under the JSON Schema of Ray's own
/// pydantic model (`fixtures/ray-v2/TrainRunsResponse.schema.json`).
pub(crate) fn assert_valid_under_rays_model(answer: &Value) {
    let schema = fixture("ray-v2/TrainRunsResponse.schema.json");
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> =
        validator.iter_errors(answer).map(|e| format!("{e} at {}", e.instance_path())).collect();
    assert!(errors.is_empty(), "Ray's TrainRunsResponse refuses the answer: {errors:?}");
}

#[test]
fn rays_own_dashboard_answer_is_valid_under_the_committed_schema_of_its_model() {
    // The oracle itself must refuse what Ray refuses, or it proves nothing.
    let answer = fixture("ray-v2/dashboard-v2-runs.json");
    assert_valid_under_rays_model(&answer);
    let schema = fixture("ray-v2/TrainRunsResponse.schema.json");
    let validator = jsonschema::validator_for(&schema).unwrap();
    for (what, mutate) in [
        (
            "no run_settings",
            (|r: &mut Value| drop(r.as_object_mut().unwrap().remove("run_settings")))
                as fn(&mut Value),
        ),
        ("no framework_versions", |r| {
            drop(r.as_object_mut().unwrap().remove("framework_versions"))
        }),
        ("a V1 status", |r| r["status"] = "STARTED".into()),
        ("a time in text", |r| r["start_time_ns"] = "1".into()),
        ("an attempt without workers", |r| {
            drop(r["attempts"][0].as_object_mut().unwrap().remove("workers"))
        }),
    ] {
        let mut broken = answer.clone();
        mutate(&mut broken["train_runs"][0]);
        assert!(!validator.is_valid(&broken), "the schema accepts {what}");
    }
}

#[tokio::test]
async fn ray_v2_writes_replayed_from_rays_dashboard_give_back_rays_answer() {
    let server = server().await;
    let client = Client::new();
    let dashboard = fixture("ray-v2/dashboard-v2-runs.json");
    write_like_ray(&client, &server.url, &dashboard).await;

    let (status, answer) =
        send(&client, Method::GET, &format!("{}/api/train/v2/runs/v1", server.url), None, None)
            .await;
    assert_eq!(status, StatusCode::OK);
    assert_valid_under_rays_model(&answer);
    let ours: Vec<Value> =
        answer["train_runs"].as_array().unwrap().iter().map(shared_fields).collect();
    let rays: Vec<Value> =
        dashboard["train_runs"].as_array().unwrap().iter().map(shared_fields).collect();
    assert_eq!(ours.len(), 3);
    for (ours, rays) in ours.iter().zip(&rays) {
        assert_eq!(ours, rays, "run {}", rays["name"]);
    }

    // Ray's V1 route answers too (Ray's own answers HTTP 500 on a V2 cluster).
    let (status, v1) =
        send(&client, Method::GET, &format!("{}/api/train/v2/runs", server.url), None, None).await;
    assert_eq!(status, StatusCode::OK);
    let statuses: Vec<&Value> =
        v1["train_runs"].as_array().unwrap().iter().map(|r| &r["run_status"]).collect();
    assert_eq!(statuses, [&json!("ERRORED"), &json!("FINISHED"), &json!("FINISHED")]);
    let bad = &v1["train_runs"][0];
    assert_eq!(
        bad["cause"],
        json!({"kind": "USER_ERROR", "class": "APPLICATION", "failed_world_rank": 0})
    );
    assert!(bad["workers"].as_array().unwrap().iter().all(|w| w["status"] == "DEAD"));
    server.stop().await;
}

#[tokio::test]
async fn v2_writes_are_idempotent_and_never_move_a_terminal_run_or_attempt_back() {
    let server = server().await;
    let client = Client::new();
    let dashboard = fixture("ray-v2/dashboard-v2-runs.json");
    write_like_ray(&client, &server.url, &dashboard).await;
    let run = &dashboard["train_runs"][1];
    let id = run["id"].as_str().unwrap();
    let url = |path: &str| format!("{}/api/train/v2/runs/{id}{path}", server.url);
    let (_, before) =
        send(&client, Method::GET, &format!("{}/api/train/runs/{id}", server.url), None, None)
            .await;

    // The same whole document again changes nothing.
    let (status, again) =
        send(&client, Method::PUT, &url(""), body(&v2_run(run, "FINISHED", true)), None).await;
    assert_eq!((status, &again), (StatusCode::OK, &before));
    // Back to live: refused, naming both statuses.
    let (status, refused) =
        send(&client, Method::PUT, &url(""), body(&v2_run(run, "RUNNING", false)), None).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(refused["error"]["code"], "illegal_transition");
    assert_eq!(
        (&refused["error"]["from"], &refused["error"]["to"]),
        (&json!("FINISHED"), &json!("RUNNING"))
    );
    let attempt = &run["attempts"][0];
    let path = format!("/attempts/{}", attempt["attempt_id"].as_str().unwrap());
    let (status, _) = send(
        &client,
        Method::PUT,
        &url(&path),
        body(&v2_attempt(attempt, "RUNNING", true, false)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    // Static metadata never changes.
    let mut renamed = v2_run(run, "FINISHED", true);
    renamed["name"] = "other".into();
    let (status, refused) = send(&client, Method::PUT, &url(""), body(&renamed), None).await;
    assert_eq!((status, &refused["error"]["code"]), (StatusCode::CONFLICT, &json!("conflict")));
    // The path and the body must name the same run.
    let mut elsewhere = v2_run(run, "FINISHED", true);
    elsewhere["id"] = "0192f0c5a4e27c3db1c1a2b3c4d5e6f7".into();
    let (status, refused) = send(&client, Method::PUT, &url(""), body(&elsewhere), None).await;
    assert_eq!(
        (status, &refused["error"]["field"]),
        (StatusCode::UNPROCESSABLE_ENTITY, &json!("id"))
    );

    let (_, after) =
        send(&client, Method::GET, &format!("{}/api/train/runs/{id}", server.url), None, None)
            .await;
    assert_eq!(after, before, "refused writes changed nothing");
    server.stop().await;
}

#[tokio::test]
async fn runs_registered_the_v1_way_get_what_rays_v2_models_require() {
    let server = server().await;
    let client = Client::new();
    let runs = format!("{}/api/train/runs", server.url);
    let live = serde_json::to_value(run_with(&RunId::new_v7(), "v1-live", "job1", T0, 4)).unwrap();
    send(&client, Method::POST, &runs, body(&live), None).await;
    let ended =
        serde_json::to_value(run_with(&RunId::new_v7(), "v1-ended", "job1", T0 + 1, 4)).unwrap();
    send(&client, Method::POST, &runs, body(&ended), None).await;
    let id = ended["id"].as_str().unwrap();
    let status = json!({"status": "ERRORED", "detail": "boom", "cause": {"kind": "USER_ERROR", "failed_world_rank": 2}});
    send(&client, Method::POST, &format!("{runs}/{id}/status"), body(&status), None).await;

    let (_, answer) =
        send(&client, Method::GET, &format!("{}/api/train/v2/runs/v1", server.url), None, None)
            .await;
    assert_valid_under_rays_model(&answer);
    let errored = &answer["train_runs"][0];
    assert_eq!(errored["status"], "ERRORED");
    assert_eq!(errored["attempts"][0]["status"], "ERRORED");
    assert_eq!(errored["attempts"][0]["workers"].as_array().unwrap().len(), 4);
    assert_eq!(errored["run_settings"]["scaling_config"]["num_workers"], 4);
    assert_eq!(answer["train_runs"][1]["attempts"][0]["status"], "RUNNING");
    server.stop().await;
}

#[tokio::test]
async fn live_sub_statuses_show_as_running_to_v1_readers_and_filters() {
    let server = server().await;
    let client = Client::new();
    let runs = format!("{}/api/train/runs", server.url);
    let run =
        serde_json::to_value(run_with(&RunId::new_v7(), "restarting", "job1", T0, 2)).unwrap();
    let id = run["id"].as_str().unwrap().to_owned();
    send(&client, Method::POST, &runs, body(&run), None).await;
    let (status, changed) = send(
        &client,
        Method::POST,
        &format!("{runs}/{id}/status"),
        body(&json!({"status": "RESTARTING"})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(
        (&changed["run_status"], &changed["status"]),
        (&json!("RUNNING"), &json!("RESTARTING"))
    );
    assert!(changed["end_time_ms"].is_null());

    for (filter, expected) in
        [("RUNNING", 1), ("RESTARTING", 1), ("SCHEDULING", 0), ("FINISHED", 0)]
    {
        let (_, page) =
            send(&client, Method::GET, &format!("{runs}?status={filter}"), None, None).await;
        assert_eq!(page["total"], expected, "status={filter}");
    }
    let (_, v1) =
        send(&client, Method::GET, &format!("{}/api/train/v2/runs", server.url), None, None).await;
    assert_eq!(v1["train_runs"][0]["run_status"], "RUNNING");

    // A live status moves to any other, and ends; then it is final.
    for next in ["SCHEDULING", "RUNNING", "RESIZING", "FINISHED"] {
        let (status, answer) = send(
            &client,
            Method::POST,
            &format!("{runs}/{id}/status"),
            body(&json!({"status": next})),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{next}: {answer}");
    }
    let (status, _) = send(
        &client,
        Method::POST,
        &format!("{runs}/{id}/status"),
        body(&json!({"status": "SCHEDULING"})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    server.stop().await;
}

#[tokio::test]
async fn an_ended_run_and_a_replaced_attempt_list_their_workers_dead() {
    let server = server().await;
    let client = Client::new();
    let runs = format!("{}/api/train/runs", server.url);
    let run = serde_json::to_value(run_with(&RunId::new_v7(), "elastic", "job1", T0, 2)).unwrap();
    let id = run["id"].as_str().unwrap().to_owned();
    send(&client, Method::POST, &runs, body(&run), None).await;
    let attempt = json!({"attempt_id": "1", "start_time_ms": T0 + 10, "workers": run["workers"]});
    let (_, resized) =
        send(&client, Method::POST, &format!("{runs}/{id}/attempts"), body(&attempt), None).await;
    let first = &resized["attempts"][0];
    assert_eq!(first["status"], "ABORTED");
    assert!(first["workers"].as_array().unwrap().iter().all(|w| w["status"] == "DEAD"));
    assert!(resized["workers"].as_array().unwrap().iter().all(|w| w["status"] == "ALIVE"));

    let errored = json!({"status": "ERRORED", "detail": "boom", "cause": {"kind": "USER_ERROR", "failed_world_rank": 1}});
    let (_, ended) =
        send(&client, Method::POST, &format!("{runs}/{id}/status"), body(&errored), None).await;
    assert!(ended["workers"].as_array().unwrap().iter().all(|w| w["status"] == "DEAD"));
    let current = &ended["attempts"][1];
    assert_eq!(current["status"], "ERRORED");
    assert_eq!(
        current["cause"],
        json!({"kind": "USER_ERROR", "class": "APPLICATION", "failed_world_rank": 1})
    );
    assert!(current["end_time_ms"].is_u64());
    server.stop().await;
}

#[tokio::test]
async fn a_store_written_by_release_0_1_0_opens_and_takes_v2_writes() {
    let dir = tempfile::tempdir().unwrap();
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-v0.1.0.db");
    std::fs::copy(fixture, dir.path().join("trainstate.db")).unwrap();
    let config =
        StateConfig::sqlite(dir.path().join("trainstate.db")).with_name(unique_name("old-store"));
    let server = Server::start(config, HttpConfig::default()).await;
    let client = Client::new();
    let runs = format!("{}/api/train/runs", server.url);
    let (_, page) = send(&client, Method::GET, &runs, None, None).await;
    let names: Vec<&Value> =
        page["train_runs"].as_array().unwrap().iter().map(|r| &r["name"]).collect();
    assert_eq!(names, [&json!("old-resized"), &json!("old-errored"), &json!("run-0")]);
    let resized = &page["train_runs"][0];
    assert_eq!(resized["attempts"][0]["status"], "ABORTED", "a replaced attempt");
    assert_eq!(resized["attempts"][1]["status"], "FINISHED", "the attempt that ended the run");
    let (_, answer) =
        send(&client, Method::GET, &format!("{}/api/train/v2/runs/v1", server.url), None, None)
            .await;
    assert_valid_under_rays_model(&answer);
    // The live run of the old store moves on.
    let live = "00000000000000000000000000005000";
    let (status, _) = send(
        &client,
        Method::POST,
        &format!("{runs}/{live}/status"),
        body(&json!({"status": "RESIZING"})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}

/// Round three: Ray V2 runs were never swept (20 live V2 runs stayed
/// RUNNING after 2.5 leases). A V2 run is leased like any other: each
/// write and each heartbeat of its source (`trainstate ingest
/// ray-export` renews the runs it follows) renews its lease, and a run
/// nothing told about for longer than the lease is aborted
/// `LOST_CONTROLLER`, in words that name Ray Train V2 and the ingester.
/// (Round one's finding, a V2 run aborted while Ray trained it without a
/// change, is now the ingester's renewals: while they come, it lives.)
#[tokio::test]
async fn regression_ray_v2_runs_nothing_tells_about_past_their_lease_are_aborted_with_their_cause()
{
    use std::sync::Arc;
    use std::time::Duration;
    let clock = Arc::new(trainstate_actor::ManualClock::new(T0));
    let config = StateConfig::in_memory()
        .with_name(unique_name("v2-lease"))
        .with_clock(clock.clone())
        .with_lease(Duration::from_secs(60))
        // The test sweeps itself.
        .with_sweep_interval(Duration::from_secs(3600));
    let service = trainstate_actor::launch_state_actor(config).await.unwrap();
    let state = service.handle();
    let dashboard = fixture("ray-v2/dashboard-v2-runs.json");
    let mut run: trainstate_schema::ray_v2::TrainRun =
        serde_json::from_value(v2_run(&dashboard["train_runs"][0], "RUNNING", false)).unwrap();
    run.start_time_ns = T0 * 1_000_000;
    let v2 = state.upsert_ray_run(run).await.unwrap().parse().unwrap();
    let v1 = run_with(&RunId::new_v7(), "v1-silent", "job1", T0, 2);
    state.register(v1.clone()).await.unwrap();

    // Its source renews it (as the ingester does): it lives on.
    clock.advance_ms(50_000);
    state.heartbeat(v2.id().clone()).await.unwrap();
    clock.advance_ms(50_000);
    let aborted = state.sweep_leases().await.unwrap();
    assert_eq!(aborted, [v1.id().clone()], "the V2 run was renewed 50 s ago");
    let still = state.get_run(v2.id().clone()).await.unwrap();
    assert_eq!(still.status(), trainstate_schema::RunStatus::Running);

    // Nothing tells about it for longer than the lease: aborted.
    clock.advance_ms(11_000);
    let aborted = state.sweep_leases().await.unwrap();
    assert_eq!(aborted, [v2.id().clone()]);
    let lost = state.get_run(v2.id().clone()).await.unwrap();
    assert_eq!(lost.status(), trainstate_schema::RunStatus::Aborted);
    assert_eq!(lost.cause().unwrap().kind, trainstate_schema::CauseKind::LostController);
    let detail = lost.status_detail();
    assert!(
        detail.contains("Nothing was heard about this Ray Train V2 run for 61 s")
            && detail.contains("trainstate ingest")
            && detail.contains("lease of 60 s"),
        "{detail}"
    );
    service.shutdown().await;
}

/// Issue 10, item 9: a V2 time that is not in nanoseconds (here Unix ms
/// written as ns) is refused naming the field; Ray's own ns times are kept.
#[tokio::test]
async fn regression_a_ray_v2_time_not_in_nanoseconds_is_refused_naming_the_field() {
    let server = server().await;
    let client = Client::new();
    let dashboard = fixture("ray-v2/dashboard-v2-runs.json");
    let mut run = v2_run(&dashboard["train_runs"][0], "RUNNING", false);
    let id = run["id"].as_str().unwrap().to_owned();
    let url = format!("{}/api/train/v2/runs/{id}", server.url);
    let ns = run["start_time_ns"].as_u64().unwrap();
    run["start_time_ns"] = json!(ns / 1_000_000);
    let (status, answer) = send(&client, Method::PUT, &url, body(&run), None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["error"]["field"], "start_time_ns", "{answer}");
    run["start_time_ns"] = json!(ns);
    let (status, answer) = send(&client, Method::PUT, &url, body(&run), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    server.stop().await;
}

/// A writer that knows when a change happened (the ingester of Ray's
/// export events) says so with `at_ms`: the history records it, and the
/// end of a run ended without one is stamped at it. A time in seconds is
/// refused, naming `at_ms`, and changes nothing.
#[tokio::test]
async fn the_time_a_writer_gives_is_the_time_the_history_records() {
    let server = server().await;
    let client = Client::new();
    let dashboard = fixture("ray-v2/dashboard-v2-runs.json");
    let run = v2_run(&dashboard["train_runs"][0], "RUNNING", false);
    let id = run["id"].as_str().unwrap().to_owned();
    let start_ms = run["start_time_ns"].as_u64().unwrap() / 1_000_000;
    let url = |query: &str| format!("{}/api/train/v2/runs/{id}{query}", server.url);

    let (status, answer) =
        send(&client, Method::PUT, &url(&format!("?at_ms={}", start_ms / 1000)), body(&run), None)
            .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["error"]["field"], "at_ms", "{answer}");
    let (status, answer) =
        send(&client, Method::PUT, &url(&format!("?at_ms={}", start_ms + 1_000)), body(&run), None)
            .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["status_history"], json!([{"status": "RUNNING", "at_ms": start_ms + 1_000}]));

    let status_url = format!("{}/api/train/runs/{id}/status", server.url);
    let in_seconds = json!({"status": "ABORTED", "at_ms": (start_ms + 60_000) / 1000});
    let (status, answer) = send(&client, Method::POST, &status_url, body(&in_seconds), None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["error"]["field"], "at_ms", "{answer}");
    let aborted = json!({"status": "ABORTED", "detail": "stopped", "at_ms": start_ms + 60_000});
    let (status, answer) = send(&client, Method::POST, &status_url, body(&aborted), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["end_time_ms"], start_ms + 60_000, "{answer}");
    let history = answer["status_history"].as_array().unwrap();
    assert_eq!(history.len(), 2, "{answer}");
    assert_eq!(history[1]["status"], "ABORTED");
    assert_eq!(history[1]["at_ms"], start_ms + 60_000);
    assert_eq!(history[1]["detail"], "stopped");
    server.stop().await;
}

/// Round two, finding 5: a V2 write rewrote an ended run's attempt from
/// FINISHED to ERRORED, and the run's workers with it. An attempt of an
/// ended run is final like the run: a change of its status is refused
/// (409, naming the attempt and the field) and changes nothing, while the
/// identical document again is a no-op.
#[tokio::test]
async fn regression_an_attempt_of_an_ended_run_is_final_and_its_repeat_a_no_op() {
    let server = server().await;
    let client = Client::new();
    let dashboard = fixture("ray-v2/dashboard-v2-runs.json");
    write_like_ray(&client, &server.url, &dashboard).await;
    let run = &dashboard["train_runs"][1];
    let id = run["id"].as_str().unwrap();
    let run_url = format!("{}/api/train/runs/{id}", server.url);
    let (_, before) = send(&client, Method::GET, &run_url, None, None).await;
    assert!(before["end_time_ms"].is_u64(), "the run has ended: {before}");
    let attempt = run["attempts"].as_array().unwrap().last().unwrap();
    let attempt_id = attempt["attempt_id"].as_str().unwrap();
    let url = format!("{}/api/train/v2/runs/{id}/attempts/{attempt_id}", server.url);
    let ended = attempt["status"].as_str().unwrap();
    let other = if ended == "ERRORED" { "FINISHED" } else { "ERRORED" };

    let mut rewritten = v2_attempt(attempt, other, true, true);
    rewritten["status_detail"] = "[Rank 0 Error Snippet]: rewritten".into();
    let (status, refused) = send(&client, Method::PUT, &url, body(&rewritten), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["code"], "conflict");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("attempt {attempt_id:?}")), "{message}");
    assert!(message.contains("status") && message.contains(ended), "{message}");
    let (_, after) = send(&client, Method::GET, &run_url, None, None).await;
    assert_eq!(after, before, "the refused write changed nothing, workers included");

    let (status, again) =
        send(&client, Method::PUT, &url, body(&v2_attempt(attempt, ended, true, true)), None).await;
    assert_eq!((status, &again), (StatusCode::OK, &before), "an identical repeat is a no-op");
    server.stop().await;
}

/// Round two, finding 5: a start time in 2199 was accepted. A time more
/// than a day ahead of the head's clock (here injected) is refused, naming
/// the field, on V1 and V2 writes alike; a time within the day is kept.
#[tokio::test]
async fn regression_a_time_more_than_a_day_ahead_of_the_heads_clock_is_refused_naming_the_field() {
    use std::sync::Arc;
    let clock = Arc::new(trainstate_actor::ManualClock::new(T0));
    let config = StateConfig::in_memory().with_name(unique_name("ahead")).with_clock(clock);
    let server = Server::start(config, HttpConfig::default()).await;
    let client = Client::new();
    const DAY_MS: u64 = 24 * 3600 * 1000;
    let refused_naming = |status: StatusCode, answer: &Value, field: &str| {
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
        assert_eq!(answer["error"]["field"], field, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("ahead of the head's clock"), "{message}");
    };
    let runs_url = format!("{}/api/train/runs", server.url);

    // V1: a registration starting in two days, then within the day.
    let far = run_with(&RunId::new_v7(), "far", "job1", T0 + 2 * DAY_MS, 2);
    let (status, answer) =
        send(&client, Method::POST, &runs_url, body(&crate::common::json(&far)), None).await;
    refused_naming(status, &answer, "start_time_ms");
    let near = run_with(&RunId::new_v7(), "near", "job1", T0 + DAY_MS - 1, 2);
    let (status, answer) =
        send(&client, Method::POST, &runs_url, body(&crate::common::json(&near)), None).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    // A status change with an end (or a time of change) in 2199.
    let status_url = format!("{runs_url}/{}/status", near.id());
    let in_2199 = 7_226_582_400_000_u64;
    for (doc, field) in [
        (json!({"status": "FINISHED", "end_time_ms": in_2199}), "end_time_ms"),
        (json!({"status": "FINISHED", "at_ms": in_2199}), "at_ms"),
    ] {
        let (status, answer) = send(&client, Method::POST, &status_url, body(&doc), None).await;
        refused_naming(status, &answer, field);
    }
    let attempt = json!({"attempt_id": "1", "start_time_ms": in_2199, "workers": []});
    let (status, answer) = send(
        &client,
        Method::POST,
        &format!("{runs_url}/{}/attempts", near.id()),
        body(&attempt),
        None,
    )
    .await;
    refused_naming(status, &answer, "start_time_ms");

    // V2: a run starting in 2199, an attempt ending then.
    let dashboard = fixture("ray-v2/dashboard-v2-runs.json");
    let mut run = v2_run(&dashboard["train_runs"][0], "RUNNING", false);
    let id = run["id"].as_str().unwrap().to_owned();
    run["start_time_ns"] = json!(in_2199 * 1_000_000);
    let v2_url = format!("{}/api/train/v2/runs/{id}", server.url);
    let (status, answer) = send(&client, Method::PUT, &v2_url, body(&run), None).await;
    refused_naming(status, &answer, "start_time_ns");
    run["start_time_ns"] = json!(T0 * 1_000_000);
    let (status, answer) = send(&client, Method::PUT, &v2_url, body(&run), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let attempt = json!({
        "run_id": id, "attempt_id": "a1", "status": "FINISHED",
        "start_time_ns": T0 * 1_000_000, "end_time_ns": in_2199 * 1_000_000,
    });
    let (status, answer) =
        send(&client, Method::PUT, &format!("{v2_url}/attempts/a1"), body(&attempt), None).await;
    refused_naming(status, &answer, "end_time_ns");

    let (_, listed) = send(&client, Method::GET, &runs_url, None, None).await;
    assert_eq!(listed["total"], 2, "only the two runs within the day were stored: {listed}");
    server.stop().await;
}

/// A V2 attempt document of `n` workers, eight to a node (about 200 bytes
/// each).
fn big_attempt(run_id: &str, attempt_id: &str, n: u32) -> Value {
    let workers: Vec<Value> = (0..n)
        .map(|rank| {
            json!({
                "world_rank": rank, "local_rank": rank % 8, "node_rank": rank / 8,
                "actor_id": format!("actor{rank:06}"), "node_id": format!("node{:05}", rank / 8),
                "node_ip": format!("10.{}.{}.{}", rank / 8 / 62500, rank / 8 / 250 % 250, rank / 8 % 250 + 1),
                "pid": 1000 + rank, "gpu_ids": [rank % 8], "status": "ALIVE",
                "resources": {"resources": {"CPU": 1.0, "GPU": 1.0}},
            })
        })
        .collect();
    json!({
        "run_id": run_id, "attempt_id": attempt_id, "status": "RUNNING",
        "start_time_ns": T0 * 1_000_000 + 1_000_000, "workers": workers,
    })
}

/// Round two, finding 9: V2 bodies were converted and validated inside
/// the actor, so `/healthz` waited seconds behind four 13 MiB bodies. Each
/// is now converted and validated off the actor's turn: with four bodies
/// of about 4 MiB held in their preparation, `/healthz`, a small
/// registration and a small V2 write to one of their runs are answered
/// before any of the large writes completes; released, the large writes
/// are stored whole, the one whose run changed meanwhile prepared again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_large_v2_writes_are_prepared_off_the_actors_turn() {
    use std::time::Duration;
    let config = StateConfig::in_memory().with_name(unique_name("v2-off-turn"));
    let faults = config.faults.clone();
    let server = Server::start(config, HttpConfig::default()).await;
    let client = Client::new();
    let ids: Vec<String> = (0..4).map(|_| RunId::new_v7().to_string()).collect();
    let run_doc = |id: &str, status: &str| {
        json!({"id": id, "name": "big", "job_id": "01000000", "controller_actor_id": "c0ffee",
               "status": status, "start_time_ns": T0 * 1_000_000})
    };
    let run_url = |id: &str| format!("{}/api/train/v2/runs/{id}", server.url);
    for id in &ids {
        let (status, answer) =
            send(&client, Method::PUT, &run_url(id), body(&run_doc(id, "SCHEDULING")), None).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }

    faults.hold_ray_preparations();
    let large: Vec<_> = ids
        .iter()
        .map(|id| {
            let doc = serde_json::to_vec(&big_attempt(id, "a1", 20_000)).unwrap();
            assert!(doc.len() > 4 << 20, "several MiB: {}", doc.len());
            let request = client
                .put(format!("{}/attempts/a1", run_url(id)))
                .header("content-type", "application/json")
                .body(doc);
            tokio::spawn(async move { request.send().await.unwrap().status() })
        })
        .collect();
    crate::common::eventually("four preparations held", Duration::from_secs(120), || {
        std::future::ready(faults.ray_preparations_waiting() == 4)
    })
    .await;

    let (status, answer) =
        send(&client, Method::GET, &format!("{}/healthz", server.url), None, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let small = run_with(&RunId::new_v7(), "small", "job1", T0, 2);
    let (status, answer) = send(
        &client,
        Method::POST,
        &format!("{}/api/train/runs", server.url),
        body(&crate::common::json(&small)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    // A write changes a run whose large write is being prepared: that
    // preparation is stale, and is made again on the run's new version.
    let (status, answer) = send(
        &client,
        Method::POST,
        &format!("{}/api/train/runs/{}/status", server.url, ids[0]),
        body(&json!({"status": "RUNNING"})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(large.iter().all(|write| !write.is_finished()), "no large write completed yet");
    faults.release_ray_preparations();

    for write in large {
        assert_eq!(write.await.unwrap(), StatusCode::OK);
    }
    for id in &ids {
        let (_, stored) =
            send(&client, Method::GET, &format!("{}/api/train/runs/{id}", server.url), None, None)
                .await;
        assert_eq!(stored["workers"].as_array().unwrap().len(), 20_000, "stored whole");
        assert_eq!(stored["attempts"][0]["attempt_id"], "a1");
    }
    let (_, changed) = send(
        &client,
        Method::GET,
        &format!("{}/api/train/runs/{}", server.url, ids[0]),
        None,
        None,
    )
    .await;
    assert!(
        changed.get("status").is_none(),
        "the change made meanwhile is kept: {}",
        changed["status"]
    );
    server.stop().await;
}
