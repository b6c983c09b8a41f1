//! `GET /api/train/events`: Server-Sent Events with resume.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use trainstate_client::api::{ErrorCode, ErrorResponse, EventsQuery, RunEvent, SnapshotEvent};
use trainstate_client::{RunQuery, StateEvent, StateHandle};

use super::AppState;
use super::body::QueryParams;
use super::error::ApiError;

/// An SSE event whose data is `data` as JSON.
fn json_event(name: &str, id: Option<u64>, data: &impl serde::Serialize) -> Event {
    let event = Event::default().event(name);
    let event = match id {
        Some(id) => event.id(id.to_string()),
        None => event,
    };
    event.json_data(data).expect("API documents serialize")
}

/// One committed change as an SSE event; its id is the sequence number.
fn change(event: &StateEvent) -> Event {
    let data = RunEvent::new(event.seq, event.kind, event.run_id.clone(), event.run.as_ref());
    json_event(event.kind.as_str(), Some(event.seq), &data)
}

/// Every run, as of `seq`.
async fn snapshot(handle: &StateHandle, seq: u64) -> Event {
    match handle.list(RunQuery::all()).await {
        Ok(page) => json_event("snapshot", Some(seq), &SnapshotEvent::new(seq, page.runs)),
        Err(err) => json_event("error", None, &ErrorResponse::new(err.to_error_body())),
    }
}

pub(crate) async fn events(
    State(app): State<AppState>,
    headers: HeaderMap,
    QueryParams(params): QueryParams<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let permit = app.subscribers.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(ErrorCode::TooManySubscribers, "too many event subscribers; retry later")
    })?;
    let header = match headers.get("last-event-id") {
        Some(value) => {
            Some(value.to_str().ok().and_then(|text| text.trim().parse::<u64>().ok()).ok_or_else(
                || {
                    ApiError::invalid(
                        "Last-Event-ID",
                        "must be the id of an earlier event (an integer)",
                    )
                },
            )?)
        }
        None => None,
    };
    let after = header.or(params.last_event_id);
    let subscription = app.handle.subscribe(after).await?;
    let first: Vec<Event> = match subscription.backlog {
        Some(backlog) => backlog.iter().map(change).collect(),
        None => vec![snapshot(&app.handle, subscription.last_seq).await],
    };

    let handle = app.handle.clone();
    let live = BroadcastStream::new(subscription.receiver).then(move |item| {
        let handle = handle.clone();
        async move {
            match item {
                Ok(event) => change(&event),
                // Fell behind: what was missed is gone, so start over from a snapshot.
                Err(BroadcastStreamRecvError::Lagged(_)) => {
                    let seq = handle.subscribe(None).await.map(|s| s.last_seq).unwrap_or(0);
                    snapshot(&handle, seq).await
                }
            }
        }
    });
    let mut shutdown = app.shutdown.clone();
    let stream = stream::iter(first)
        .chain(live)
        .map(move |event| {
            let _held = &permit;
            Ok::<_, Infallible>(event)
        })
        .take_until(async move {
            let _ = shutdown.wait_for(|stopping| *stopping).await;
        });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
