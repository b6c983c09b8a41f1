//! The rendezvous requests a head reads: `Join::from_request` and
//! `RankEnd::try_from` accept what the rules allow and refuse the rest,
//! naming the field.

use trainstate_client::{Join, RankEnd, StateError};
use trainstate_schema::api::{JoinRequest, RankEndRequest};
use trainstate_schema::{CauseKind, RunStatus, TrainWorkerInfo, TrainWorkerInfoDraft};

const T0: u64 = 1_760_000_000_000;

/// A change to a request that breaks one rule.
type Change<T> = fn(&mut T);

/// Rank `rank` of a group of four on one node.
fn worker(rank: u32) -> TrainWorkerInfoDraft {
    trainstate_testkit::runs::workers(4, 4, "").swap_remove(rank as usize).into_draft()
}

fn join_request() -> JoinRequest {
    JoinRequest::new(4, worker(1), "pretrain", "job1")
}

/// The field a refusal names.
fn field(error: StateError) -> String {
    match error {
        StateError::Invalid { field, .. } => field,
        other => panic!("not an invalid-field refusal: {other:?}"),
    }
}

#[test]
fn a_join_survives_its_trip_over_http() {
    let worker: TrainWorkerInfo = worker(2).validate().unwrap();
    let join = Join::new("group-1", 4, worker, "pretrain", "job1")
        .unwrap()
        .with_attempt(3)
        .with_process_start(T0)
        .unwrap();
    assert_eq!(Join::from_request("group-1", join.to_request()).unwrap(), join);
}

#[test]
fn a_join_that_breaks_a_rule_is_refused_naming_the_field() {
    let cases: Vec<(&str, Change<JoinRequest>, &str)> = vec![
        ("bad key!", |_| {}, "key"),
        ("group-1", |r| r.world_size = 0, "world_size"),
        ("group-1", |r| r.world_size = 1, "worker.world_rank"),
        ("group-1", |r| r.worker.node_ip = "not an address".into(), "worker.node_ip"),
        ("group-1", |r| r.name = String::new(), "name"),
        ("group-1", |r| r.job_id = "a\nb".into(), "job_id"),
        ("group-1", |r| r.join_timeout_ms = Some(0), "join_timeout_ms"),
        ("group-1", |r| r.join_timeout_ms = Some(24 * 3600 * 1000 + 1), "join_timeout_ms"),
        ("group-1", |r| r.process_start_ms = Some(5), "process_start_ms"),
    ];
    for (key, change, expected) in cases {
        let mut request = join_request();
        change(&mut request);
        let refused = Join::from_request(key, request.clone())
            .expect_err(&format!("{key} {request:?} must be refused"));
        assert_eq!(field(refused), expected, "{request:?}");
    }
    assert!(Join::from_request("group-1", join_request()).is_ok());
}

#[test]
fn a_rank_end_survives_its_trip_over_http() {
    for end in [
        RankEnd::finished("0"),
        RankEnd::errored("1", "Traceback: boom").at(T0, None).with_restarts_remaining(2),
        RankEnd::aborted("2", "SIGTERM"),
    ] {
        let request = RankEndRequest::from(end.clone());
        assert_eq!(RankEnd::try_from(request).unwrap(), end);
    }
}

#[test]
fn a_rank_end_that_breaks_a_rule_is_refused_naming_the_field() {
    let cases: Vec<(Change<RankEndRequest>, &str)> = vec![
        (|r| r.status = RunStatus::Running, "status"),
        (|r| r.cause = Some(CauseKind::UserError), "cause"),
        (|r| r.detail = "x".repeat(1 << 20), "detail"),
        (|r| r.attempt_id = String::new(), "attempt_id"),
        (|r| r.ended_at_ms = Some(u64::MAX), "ended_at_ms"),
    ];
    for (change, expected) in cases {
        let mut request = RankEndRequest::new("0", RunStatus::Finished);
        change(&mut request);
        let refused =
            RankEnd::try_from(request.clone()).expect_err(&format!("{request:?} must be refused"));
        assert_eq!(field(refused), expected);
    }
}

#[test]
fn a_finished_rank_says_no_failure_and_a_failed_one_says_how() {
    let finished = RankEnd::try_from(RankEndRequest::new("0", RunStatus::Finished)).unwrap();
    assert_eq!(finished.failure_mode(), None);
    assert_eq!(finished.cause_kind(), None);
    let errored = RankEnd::try_from(RankEndRequest::new("0", RunStatus::Errored)).unwrap();
    assert!(errored.failure_mode().is_some());
    assert_eq!(errored.cause_kind(), Some(CauseKind::UserError));
}
