//! `StateError` and the HTTP API's error body: every code maps to one
//! error, every error to one code, and a retry is allowed by one rule.

use trainstate_client::StateError;
use trainstate_schema::api::{ErrorBody, ErrorCode};
use trainstate_schema::{RunId, RunStatus};

/// Every variant of `StateError`, about `id` where it names a run.
fn every_error(id: &RunId) -> Vec<StateError> {
    vec![
        StateError::NotFound { id: id.clone() },
        StateError::Conflict { id: id.clone(), reason: "other workers".into() },
        StateError::IllegalTransition {
            id: id.clone(),
            from: RunStatus::Finished,
            to: RunStatus::Running,
            reason: "terminal is final".into(),
        },
        StateError::invalid("workers[3].pid", "must be positive"),
        StateError::unavailable("store down"),
        StateError::Overloaded { in_flight: Some(12) },
        StateError::Overloaded { in_flight: None },
        StateError::TooManyLiveRuns { max: 4 },
        StateError::Unauthorized { reason: "no token".into() },
        StateError::Timeout { after: std::time::Duration::from_secs(2) },
        StateError::Forbidden { reason: "needs write".into() },
        StateError::Corrupt { reason: "bad row".into() },
        StateError::Refused { reason: "rank 3 joined twice".into() },
        StateError::Unsupported { reason: "subscriptions".into() },
        StateError::NoSuchRoute { reason: "PUT /x".into() },
        StateError::Protocol { reason: "not JSON".into() },
    ]
}

/// What an error becomes after a trip over the wire, when it is not
/// itself: the variants that share a code with another, or whose body
/// loses what they carry.
fn after_the_wire(error: &StateError, id: &RunId) -> StateError {
    let body = error.to_error_body();
    let run = match error {
        StateError::Refused { .. } => None,
        _ => Some(id),
    };
    StateError::from_error_body(body, run)
}

#[test]
fn every_error_has_the_code_and_status_of_its_body_and_survives_the_wire() {
    let id = RunId::new_v7();
    for error in every_error(&id) {
        let body = error.to_error_body();
        assert_eq!(body.code, error.code(), "{error:?}");
        assert_eq!(body.message, error.to_string(), "{error:?}");
        let back = after_the_wire(&error, &id);
        match &error {
            // Said the same way as `unavailable` (503, retry) or `overloaded`.
            StateError::Timeout { .. } => {
                assert!(matches!(back, StateError::Unavailable { .. }), "{back:?}")
            }
            StateError::TooManyLiveRuns { .. } => {
                assert_eq!(back, StateError::Overloaded { in_flight: None })
            }
            // `internal` on the wire: this client cannot tell them apart.
            StateError::Unsupported { .. } | StateError::Protocol { .. } => {
                assert!(matches!(back, StateError::Protocol { .. }), "{back:?}")
            }
            // The message on the wire is the whole display.
            StateError::Conflict { .. } => {
                assert_eq!(back, StateError::Conflict { id: id.clone(), reason: error.to_string() })
            }
            _ => assert_eq!(back.code(), error.code(), "{error:?} came back as {back:?}"),
        }
        assert_eq!(back.is_retryable(), error.is_retryable(), "{error:?} -> {back:?}");
    }
}

#[test]
fn the_fields_a_body_carries_come_back() {
    let id = RunId::new_v7();
    let invalid = StateError::invalid("workers[3].pid", "must be positive");
    let back = StateError::from_error_body(invalid.to_error_body(), Some(&id));
    assert!(matches!(&back, StateError::Invalid { field, .. } if field == "workers[3].pid"));
    let illegal = StateError::IllegalTransition {
        id: id.clone(),
        from: RunStatus::Finished,
        to: RunStatus::Running,
        reason: "terminal".into(),
    };
    let back = StateError::from_error_body(illegal.to_error_body(), Some(&id));
    assert!(
        matches!(
            back,
            StateError::IllegalTransition { from: RunStatus::Finished, to: RunStatus::Running, .. }
        ),
        "{back:?}"
    );
    let busy = StateError::Overloaded { in_flight: Some(12) };
    assert_eq!(StateError::from_error_body(busy.to_error_body(), None), busy);
}

#[test]
fn every_code_becomes_an_error_that_is_retryable_exactly_when_the_code_is() {
    let id = RunId::new_v7();
    for code in ErrorCode::ALL {
        let body = ErrorBody::new(code, "said by the head")
            .with_field("name")
            .with_transition(RunStatus::Finished, RunStatus::Running)
            .with_in_flight(1);
        for run in [Some(&id), None] {
            let error = StateError::from_error_body(body.clone(), run);
            assert_eq!(error.is_retryable(), code.is_retryable(), "{code} -> {error:?}");
            assert!(!matches!(error, StateError::Timeout { .. }), "{code}: a body is an answer");
        }
    }
}

#[test]
fn a_run_that_is_not_there_is_not_found_only_when_the_request_named_one() {
    let id = RunId::new_v7();
    let body = ErrorBody::new(ErrorCode::NotFound, "run not found");
    assert_eq!(
        StateError::from_error_body(body.clone(), Some(&id)),
        StateError::NotFound { id: id.clone() }
    );
    assert!(matches!(StateError::from_error_body(body, None), StateError::Unsupported { .. }));
    // A conflict about no run is the rendezvous refusing a rank.
    let conflict = ErrorBody::new(ErrorCode::Conflict, "group closed");
    assert_eq!(
        StateError::from_error_body(conflict, None),
        StateError::Refused { reason: "group closed".into() }
    );
}

#[test]
fn a_body_without_what_its_code_needs_is_a_protocol_error_and_nothing_is_made_up() {
    let id = RunId::new_v7();
    let bare = ErrorBody::new(ErrorCode::IllegalTransition, "no statuses");
    let error = StateError::from_error_body(bare, Some(&id));
    assert!(matches!(&error, StateError::Protocol { reason } if reason.contains("both statuses")));
    // An invalid answer that names no field is about the body.
    let invalid = ErrorBody::new(ErrorCode::BadRequest, "not JSON");
    assert_eq!(StateError::from_error_body(invalid, None), StateError::invalid("body", "not JSON"));
}

#[test]
fn only_unavailable_overloaded_and_timeout_errors_are_retryable() {
    let id = RunId::new_v7();
    let retryable: Vec<_> = every_error(&id)
        .into_iter()
        .filter(StateError::is_retryable)
        .map(|error| error.code())
        .collect();
    assert!(
        retryable.iter().all(|code| {
            matches!(code, ErrorCode::Unavailable | ErrorCode::Overloaded | ErrorCode::Timeout)
        }),
        "{retryable:?}"
    );
    assert!(retryable.contains(&ErrorCode::Timeout));
}
