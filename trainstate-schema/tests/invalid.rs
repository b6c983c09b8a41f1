//! A table of invalid documents: one per rule, each naming the right field.

use serde_json::{Value, json};

use crate::common::{read_run, valid_run};

pub(crate) type Mutation = fn(&mut Value);

/// (what is wrong, how to break the valid run, the field the error must name,
/// a word the message must contain)
pub(crate) const CASES: &[(&str, Mutation, &str, &str)] = &[
    ("run id with a slash", |d| d["id"] = "a/b".into(), "id", "[A-Za-z0-9_-]{1,128}$"),
    ("empty run id", |d| d["id"] = "".into(), "id", "[A-Za-z0-9_-]{1,128}$"),
    ("run id over 128", |d| d["id"] = "a".repeat(129).into(), "id", "[A-Za-z0-9_-]{1,128}$"),
    ("run id qualified twice", |d| d["id"] = "a:b:c".into(), "id", "[A-Za-z0-9_-]{1,128}$"),
    ("empty job id", |d| d["job_id"] = "".into(), "job_id", "empty"),
    ("control char in name", |d| d["name"] = "a\u{7}b".into(), "name", "control"),
    ("name over 1,024", |d| d["name"] = "é".repeat(1025).into(), "name", "1024"),
    (
        "empty controller id",
        |d| d["controller_actor_id"] = "".into(),
        "controller_actor_id",
        "empty",
    ),
    ("NUL in status detail", |d| d["status_detail"] = "a\u{0}".into(), "status_detail", "NUL"),
    (
        "status detail over 50,100",
        |d| d["status_detail"] = "x".repeat(50_101).into(),
        "status_detail",
        "50100",
    ),
    (
        "duplicate world rank",
        |d| d["workers"][3]["world_rank"] = 2.into(),
        "workers[3].world_rank",
        "more than one",
    ),
    (
        "world rank gap",
        |d| d["workers"][3]["world_rank"] = 7.into(),
        "workers[3].world_rank",
        "out of range",
    ),
    (
        "duplicate local rank on a node",
        |d| d["workers"][1]["local_rank"] = 0.into(),
        "workers[1].local_rank",
        "twice",
    ),
    (
        "two node ranks on one node",
        |d| d["workers"][1]["node_rank"] = 5.into(),
        "workers[1].node_rank",
        "one node_rank",
    ),
    (
        "one node rank on two nodes",
        |d| {
            d["workers"][2]["node_rank"] = 0.into();
            d["workers"][3]["node_rank"] = 0.into();
        },
        "workers[2].node_rank",
        "more than one node_id",
    ),
    (
        "bad node ip",
        |d| d["workers"][0]["node_ip"] = "10.0.0.300".into(),
        "workers[0].node_ip",
        "IPv4",
    ),
    ("pid zero", |d| d["workers"][2]["pid"] = 0.into(), "workers[2].pid", "greater than 0"),
    (
        "duplicate gpu id",
        |d| d["workers"][0]["gpu_ids"] = json!([1, 1]),
        "workers[0].gpu_ids[1]",
        "twice",
    ),
    (
        "negative resource",
        |d| {
            d["workers"][1]["resources"]["CPU"] = json!(-1.0);
            d.as_object_mut().unwrap().remove("resources");
        },
        "workers[1].resources.CPU",
        "zero or more",
    ),
    (
        "resources disagree with workers",
        |d| d["resources"][0]["CPU"] = json!(2.0),
        "resources",
        "each worker's resources",
    ),
    (
        "duplicate dataset name",
        |d| {
            d["datasets"] =
                json!([{"name": "t", "dataset_uuid": "a"}, {"name": "t", "dataset_uuid": "b"}])
        },
        "datasets[1].name",
        "unique",
    ),
    (
        "empty dataset uuid",
        |d| d["datasets"][0]["dataset_uuid"] = "".into(),
        "datasets[0].dataset_uuid",
        "empty",
    ),
    (
        "running with an end time",
        |d| d["end_time_ms"] = json!(1_760_000_000_001u64),
        "end_time_ms",
        "RUNNING",
    ),
    (
        "end before start",
        |d| {
            d["run_status"] = "FINISHED".into();
            d["end_time_ms"] = json!(1u64);
        },
        "end_time_ms",
        "before",
    ),
    // Pydantic's lax coercions are not Ray's wire format.
    (
        "pid as a string",
        |d| d["workers"][0]["pid"] = "4000".into(),
        "workers[0].pid",
        "invalid type",
    ),
    (
        "pid as a float",
        |d| d["workers"][0]["pid"] = json!(4000.0),
        "workers[0].pid",
        "invalid type",
    ),
    ("negative pid", |d| d["workers"][0]["pid"] = json!(-4), "workers[0].pid", "invalid value"),
    ("unknown run status", |d| d["run_status"] = "PENDING".into(), "run_status", "unknown variant"),
    (
        "unknown worker status",
        |d| d["workers"][0]["status"] = "alive".into(),
        "workers[0].status",
        "unknown variant",
    ),
    (
        "missing job id",
        |d| {
            d.as_object_mut().unwrap().remove("job_id");
        },
        ".",
        "job_id",
    ),
    ("workers not a list", |d| d["workers"] = json!({}), "workers", "invalid type"),
    (
        "attempt ids repeat",
        |d| {
            d["attempts"] = json!([
                {"attempt_id": "a", "start_time_ms": 1_760_000_000_000u64, "end_time_ms": 1_760_000_000_001u64, "workers": []},
                {"attempt_id": "a", "start_time_ms": 1_760_000_000_002u64}
            ]);
        },
        "attempts[1].attempt_id",
        "unique",
    ),
    (
        "current attempt lists workers",
        |d| {
            d["attempts"] =
                json!([{"attempt_id": "a", "start_time_ms": 1_760_000_000_000u64, "workers": []}])
        },
        "attempts[0].workers",
        "current",
    ),
    (
        "status history over 64",
        |d| {
            let change = json!({"status": "RUNNING", "at_ms": 1_760_000_000_000u64});
            d["status_history"] = Value::Array(vec![change; 65]);
        },
        "status_history",
        "64",
    ),
    (
        "status history detail over 256",
        |d| {
            d["status_history"] = json!([
                {"status": "RUNNING", "at_ms": 1_760_000_000_000u64},
                {"status": "FINISHED", "at_ms": 1_760_000_000_001u64, "detail": "é".repeat(257)}
            ])
        },
        "status_history[1].detail",
        "256",
    ),
    (
        "NUL in a status history detail",
        |d| {
            d["status_history"] =
                json!([{"status": "RUNNING", "at_ms": 1_760_000_000_000u64, "detail": "a\u{0}"}])
        },
        "status_history[0].detail",
        "NUL",
    ),
    (
        "empty status history attempt id",
        |d| {
            d["status_history"] =
                json!([{"status": "RUNNING", "at_ms": 1_760_000_000_000u64, "attempt_id": ""}])
        },
        "status_history[0].attempt_id",
        "empty",
    ),
    (
        "unknown status in the status history",
        |d| d["status_history"] = json!([{"status": "PAUSED", "at_ms": 1_760_000_000_000u64}]),
        "status_history[0].status",
        "PAUSED",
    ),
    (
        "bad restored_from",
        |d| d["restored_from"] = "no way".into(),
        "restored_from",
        "[A-Za-z0-9_-]{1,128}$",
    ),
    (
        "health naming over 1,024 stragglers",
        |d| {
            let straggler = |rank: u32| json!({"rank": rank, "step_time_ms": 2.0, "peers_step_time_ms": 1.0, "ratio": 2.0});
            d["health"] = json!({"state": "PROGRESSING", "since_ms": 1_760_000_000_000_u64,
                "stragglers": (0..1025).map(straggler).collect::<Vec<_>>()});
        },
        "health.stragglers",
        "1024",
    ),
    (
        "a health change naming over 1,024 stragglers",
        |d| {
            d["health_history"] = json!([{"state": "PROGRESSING", "at_ms": 1_760_000_000_000_u64,
                "stragglers": (0..1025).collect::<Vec<u32>>()}]);
        },
        "health_history[0].stragglers",
        "1024",
    ),
];

#[test]
fn each_broken_rule_names_its_field() {
    for (what, mutate, field, word) in CASES {
        let mut doc = valid_run();
        mutate(&mut doc);
        let rejection = match read_run(&doc.to_string()) {
            Ok(_) => panic!("{what}: accepted"),
            Err(rejection) => rejection,
        };
        assert_eq!(rejection.field, *field, "{what}: {rejection:?}");
        assert!(rejection.message.contains(word), "{what}: {rejection:?} lacks `{word}`");
    }
}

#[test]
fn duplicate_keys_are_rejected() {
    let base = valid_run().to_string();
    // A repeated field of the run.
    let twice =
        base.replacen("\"name\":\"pretrain\"", "\"name\":\"pretrain\",\"name\":\"other\"", 1);
    assert_ne!(twice, base);
    let err = read_run(&twice).unwrap_err();
    assert!(err.message.contains("duplicate field `name`"), "{err:?}");
    // A repeated key of a resources map.
    let twice = base.replacen("\"CPU\":1.0", "\"CPU\":1.0,\"CPU\":2.0", 1);
    assert_ne!(twice, base);
    let err = read_run(&twice).unwrap_err();
    assert!(err.message.contains("duplicate resource name `CPU`"), "{err:?}");
}

#[test]
fn unknown_keys_are_ignored() {
    let mut doc = valid_run();
    doc["job_details"] = json!({"type": "DRIVER"});
    doc["workers"][0]["gpus"] = json!([]);
    assert!(read_run(&doc.to_string()).is_ok());
}
