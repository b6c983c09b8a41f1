//! Registering a run: what is stored (`NewRun`) and what a repeat must
//! match (`static_difference`).

use serde_json::{Value, json};
use trainstate_schema::{NewRun, Rule, TrainRunInfo, TrainRunInfoDraft};

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

const START: u64 = 1_760_000_000_000;

/// A run's end and its attempts as (id, start, end), offsets from `START`.
type Stored = (Option<u64>, Vec<(&'static str, u64, Option<u64>)>);

#[test]
fn a_registration_records_the_first_attempt_drops_the_heartbeat_and_stamps_an_end() {
    let ended = |d: &mut Value| d["run_status"] = "FINISHED".into();
    // (what is registered, how, the actor's "now" as an offset, what is stored)
    let cases: &[(&str, Mutation, u64, Stored)] = &[
        ("a live run", |_| {}, 5, (None, vec![("0", 0, None)])),
        (
            "a live run with a heartbeat",
            |d| d["last_heartbeat_ms"] = json!(START + 3),
            5,
            (None, vec![("0", 0, None)]),
        ),
        (
            "an ended run with its end",
            |d| {
                d["run_status"] = "ABORTED".into();
                d["end_time_ms"] = json!(START + 2);
            },
            5,
            (Some(2), vec![("0", 0, Some(2))]),
        ),
        ("an ended run without an end: now", ended, 5, (Some(5), vec![("0", 0, Some(5))])),
        (
            "an ended run without an end, now before its start: its start",
            |d| {
                d["run_status"] = "ERRORED".into();
                d["start_time_ms"] = json!(START + 9);
            },
            5,
            (Some(9), vec![("0", 9, Some(9))]),
        ),
        (
            "a live run listing its attempts: kept",
            |d| d["attempts"] = json!([{"attempt_id": "a", "start_time_ms": START + 1}]),
            5,
            (None, vec![("a", 1, None)]),
        ),
        (
            "an ended run whose current attempt started after its end",
            |d| {
                d["run_status"] = "FINISHED".into();
                d["end_time_ms"] = json!(START + 2);
                d["attempts"] = json!([
                    {"attempt_id": "a", "start_time_ms": START, "end_time_ms": START + 1, "workers": []},
                    {"attempt_id": "b", "start_time_ms": START + 4}
                ]);
            },
            5,
            (Some(2), vec![("a", 0, Some(1)), ("b", 4, Some(4))]),
        ),
    ];
    for (what, mutate, now, (end, attempts)) in cases {
        let mut doc = valid_run();
        mutate(&mut doc);
        let given = run(&doc);
        let registration = NewRun::from(given.clone());
        assert_eq!(registration.run().static_difference(&given), None, "{what}");
        let stored = registration.into_run(START + now);

        assert_eq!(stored.end_time_ms().map(|t| t - START), *end, "{what}");
        let got: Vec<_> = stored
            .attempts()
            .iter()
            .map(|a| {
                (a.attempt_id(), a.start_time_ms() - START, a.end_time_ms().map(|t| t - START))
            })
            .collect();
        assert_eq!(got, *attempts, "{what}");
        assert_eq!(stored.last_heartbeat_ms(), None, "{what}");
        // Normalising keeps every rule, and normalising twice changes nothing.
        assert_eq!(stored.clone().into_draft().validate().as_ref(), Ok(&stored), "{what}");
        assert_eq!(NewRun::from(stored.clone()).into_run(START + 99), stored, "{what}");
        // From the draft: the same, through one validation; but a client may
        // not end a run before its current attempt's start (issue 10, item 11).
        let from_draft = NewRun::try_from(given.into_draft());
        if what.contains("started after its end") {
            let err = from_draft.unwrap_err();
            assert_eq!((err.field(), err.rule()), ("end_time_ms", &Rule::EndBeforeAttemptStart));
        } else {
            assert_eq!(from_draft.unwrap().into_run(START + now), stored, "{what}");
        }
    }
}

#[test]
fn a_registration_from_a_draft_breaks_the_run_s_rules() {
    let mut doc = valid_run();
    doc["workers"][3]["world_rank"] = json!(2);
    let draft: TrainRunInfoDraft = serde_json::from_value(doc).unwrap();
    let err = NewRun::try_from(draft).unwrap_err();
    assert_eq!(err.field(), "workers[3].world_rank");
}

#[test]
fn a_recorded_status_history_keeps_the_first_change_and_the_latest() {
    use trainstate_schema::limits::{MAX_STATUS_CHANGE_DETAIL_LEN, MAX_STATUS_HISTORY};
    use trainstate_schema::{RunStatus, StatusChange};

    let mut doc = valid_run();
    doc["status_detail"] = "é".repeat(MAX_STATUS_CHANGE_DETAIL_LEN + 10).into();
    let mut stored = NewRun::new(run(&doc)).into_run(1_760_000_000_000);
    assert!(stored.status_history().is_empty(), "the state machine records, not the schema");
    for i in 0..(MAX_STATUS_HISTORY as u64 + 5) {
        stored = stored.with_status_recorded(1_760_000_000_000 + i);
    }
    let history = stored.status_history();
    assert_eq!(history.len(), MAX_STATUS_HISTORY);
    assert_eq!(history[0].at_ms, 1_760_000_000_000, "the first change is kept");
    assert_eq!(history[1].at_ms, 1_760_000_000_006, "the oldest but the first are dropped");
    assert_eq!(history.last().unwrap().at_ms, 1_760_000_000_000 + MAX_STATUS_HISTORY as u64 + 4);
    let last: &StatusChange = history.last().unwrap();
    assert_eq!(last.status, RunStatus::Running);
    assert_eq!(last.attempt_id.as_deref(), Some(NewRun::FIRST_ATTEMPT_ID));
    assert_eq!(last.detail.chars().count(), MAX_STATUS_CHANGE_DETAIL_LEN);
    // What the head records reads back as the same run.
    let json = serde_json::to_string(&stored).unwrap();
    assert_eq!(read_run(&json).unwrap(), stored);
}

#[test]
fn a_causes_report_is_bounded_and_names_its_field() {
    use trainstate_schema::limits::MAX_CAUSE_REPORT_LEN;
    use trainstate_schema::{CauseKind, RunCause, validate_client_cause};
    let mut cause = RunCause::new(CauseKind::UserError, Some(1));
    cause.report = Some("x".repeat(MAX_CAUSE_REPORT_LEN));
    assert!(validate_client_cause("cause", Some(cause.clone()), true, 2).is_ok());
    cause.report = Some("x".repeat(MAX_CAUSE_REPORT_LEN + 1));
    let err = validate_client_cause("cause", Some(cause), true, 2).unwrap_err();
    assert_eq!(err.field(), "cause.report");
    assert_eq!(err.rule(), &Rule::TooLong { max: MAX_CAUSE_REPORT_LEN });
}
