//! The remote handle retries what a retry can fix, within the call's
//! deadline, and nothing else.

use std::time::Duration;

use trainstate_client::{StateError, StateHandle};
use trainstate_schema::RunId;
use trainstate_schema::api::{ErrorBody, ErrorCode, VersionResponse};

use crate::scripted::{Answer, Scripted};

/// A deadline only a hung test reaches: the calls below end long before.
const PATIENT: Duration = Duration::from_secs(60);

fn version() -> Answer {
    let body = VersionResponse::new("9.9.9".into(), "1".into(), 7);
    Answer::new(200, serde_json::to_string(&body).unwrap())
}

fn handle(server: &Scripted, timeout: Duration) -> StateHandle {
    StateHandle::connect(&server.url, None).unwrap().with_timeout(timeout)
}

#[tokio::test]
async fn answers_503_then_200_are_retried_until_the_answer() {
    let busy = ErrorBody::new(ErrorCode::Overloaded, "busy").with_in_flight(3);
    let down = ErrorBody::new(ErrorCode::Unavailable, "store down");
    let server = Scripted::start(vec![Answer::error(&down), Answer::error(&busy), version()]).await;
    let answer = handle(&server, PATIENT).head_version().await.unwrap();
    assert_eq!(answer.version, "9.9.9");
    assert_eq!(answer.store_schema_version, 7);
    assert_eq!(server.requests(), 3, "{:?}", server.request_lines());
    assert!(server.request_lines().iter().all(|line| line == "GET /api/version"));
}

#[tokio::test]
async fn a_503_that_is_not_a_trainstate_answer_is_retried_too() {
    let server = Scripted::start(vec![Answer::new(503, "<html>proxy</html>"), version()]).await;
    handle(&server, PATIENT).head_version().await.unwrap();
    assert_eq!(server.requests(), 2);
}

#[tokio::test]
async fn a_final_error_is_answered_at_once_without_a_retry() {
    let id = RunId::new_v7();
    for (body, expected) in [
        (
            ErrorBody::new(ErrorCode::NotFound, "no such run"),
            StateError::NotFound { id: id.clone() },
        ),
        (
            ErrorBody::new(ErrorCode::Invalid, "too long").with_field("name"),
            StateError::invalid("name", "too long"),
        ),
        (
            ErrorBody::new(ErrorCode::Corrupt, "bad row"),
            StateError::Corrupt { reason: "bad row".into() },
        ),
    ] {
        let server = Scripted::start(vec![Answer::error(&body), version()]).await;
        let error = handle(&server, PATIENT).get_run(id.clone()).await.unwrap_err();
        assert_eq!(error, expected);
        assert_eq!(server.requests(), 1, "{} was retried", body.code);
    }
}

#[tokio::test]
async fn a_404_that_is_not_a_trainstate_answer_is_no_such_route_and_not_retried() {
    let server = Scripted::start(vec![Answer::new(404, "<html>not here</html>"), version()]).await;
    let error = handle(&server, PATIENT).get_run(RunId::new_v7()).await.unwrap_err();
    assert!(matches!(error, StateError::NoSuchRoute { .. }), "{error}");
    assert_eq!(server.requests(), 1);
}

/// A head that stays unavailable is asked again and again, with backoff
/// (50 ms doubling), until the deadline; then the last error is answered.
#[tokio::test]
async fn a_head_that_stays_unavailable_is_retried_until_the_deadline() {
    let down = ErrorBody::new(ErrorCode::Unavailable, "store down");
    let server = Scripted::start(vec![Answer::error(&down)]).await;
    let error = handle(&server, Duration::from_secs(2)).head_version().await.unwrap_err();
    assert_eq!(error, StateError::unavailable("store down"));
    assert!(error.is_retryable());
    assert!(server.requests() >= 2, "asked {} times", server.requests());
}

#[tokio::test]
async fn a_head_that_is_not_there_is_unavailable_after_the_deadline() {
    // A port that was free a moment ago: nothing listens on it.
    let url = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let handle = StateHandle::connect(&url, None).unwrap().with_timeout(Duration::from_millis(300));
    let error = handle.head_version().await.unwrap_err();
    assert!(matches!(error, StateError::Unavailable { .. }), "{error}");
}

#[test]
fn a_url_without_a_scheme_is_refused_naming_the_url() {
    let error = StateHandle::connect("127.0.0.1:8266", None).unwrap_err();
    assert!(matches!(&error, StateError::Invalid { field, .. } if field == "url"), "{error}");
}
