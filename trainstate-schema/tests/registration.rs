//! Registering a run: what a repeat must match (`static_difference`).

use serde_json::{Value, json};
use trainstate_schema::TrainRunInfo;

use crate::common::{read_run, valid_run};
use crate::invalid::Mutation;

fn run(doc: &Value) -> TrainRunInfo {
    read_run(&doc.to_string()).unwrap()
}

#[test]
fn static_difference_names_the_first_static_field_that_differs() {
    // (what changes, how, the field named, or None for dynamic fields)
    let cases: &[(&str, Mutation, Option<&str>)] = &[
        ("nothing", |_| {}, None),
        ("name", |d| d["name"] = "other".into(), Some("name")),
        ("id", |d| d["id"] = "ffff".into(), Some("id")),
        ("job id", |d| d["job_id"] = "j2".into(), Some("job_id")),
        ("controller", |d| d["controller_actor_id"] = "c2".into(), Some("controller_actor_id")),
        ("dataset name", |d| d["datasets"][0]["dataset_name"] = Value::Null, Some("datasets")),
        ("start", |d| d["start_time_ms"] = json!(1u64), Some("start_time_ms")),
        ("a worker's pid", |d| d["workers"][1]["pid"] = json!(7), Some("workers")),
        (
            "a worker fewer",
            |d| {
                d["workers"].as_array_mut().unwrap().pop();
                d["resources"].as_array_mut().unwrap().pop();
            },
            Some("workers"),
        ),
        (
            "name and job id: the first",
            |d| {
                d["name"] = "other".into();
                d["job_id"] = "j2".into();
            },
            Some("name"),
        ),
        // What changes over a run's life is not static metadata.
        ("a worker's status", |d| d["workers"][0]["status"] = "DEAD".into(), None),
        (
            "run status",
            |d| {
                d["run_status"] = "FINISHED".into();
                d["end_time_ms"] = json!(1_760_000_000_001u64);
            },
            None,
        ),
        ("status detail", |d| d["status_detail"] = "warming up".into(), None),
        ("heartbeat", |d| d["last_heartbeat_ms"] = json!(1_760_000_000_001u64), None),
        (
            "a later attempt: the first attempt's workers still match",
            |d| {
                let first = d["workers"].clone();
                d["workers"][0]["pid"] = json!(7);
                d["attempts"] = json!([
                    {"attempt_id": "0", "start_time_ms": 1_760_000_000_000u64,
                     "end_time_ms": 1_760_000_000_001u64, "workers": first},
                    {"attempt_id": "1", "start_time_ms": 1_760_000_000_001u64}
                ]);
            },
            None,
        ),
    ];
    let stored = run(&valid_run());
    for (what, mutate, field) in cases {
        let mut doc = valid_run();
        mutate(&mut doc);
        let other = run(&doc);
        assert_eq!(stored.static_difference(&other), *field, "{what}");
        assert_eq!(other.static_difference(&stored), *field, "{what}, reversed");
        assert_eq!(stored.same_static_metadata(&other), field.is_none(), "{what}");
    }
}
