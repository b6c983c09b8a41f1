//! `GET /api/train/events`: Server-Sent Events with resume.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use serde::Deserialize;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use trainstate_client::{RunDocument, RunQuery, StateEvent, StateHandle};

use super::AppState;
use super::body::QueryParams;
use super::error::ApiError;

#[derive(Debug, Deserialize)]
pub(crate) struct EventParams {
    last_event_id: Option<String>,
}

/// One committed change as an SSE event; its id is the sequence number.
fn change(event: &StateEvent) -> Event {
    let mut data = format!(
        "{{\"seq\":{},\"kind\":\"{}\",\"run_id\":\"{}\",\"run\":",
        event.seq,
        event.kind.as_str(),
        event.run_id
    );
    match &event.run {
        Some(run) => run.write_json(&mut data),
        None => data.push_str("null"),
    }
    data.push('}');
    Event::default().id(event.seq.to_string()).event(event.kind.as_str()).data(data)
}

/// Every run, as of `seq`.
async fn snapshot(handle: &StateHandle, seq: u64) -> Event {
    match handle.list(RunQuery::all()).await {
        Ok(page) => {
            let mut data = format!("{{\"seq\":{seq},\"train_runs\":");
            RunDocument::write_json_list(&mut data, &page.runs);
            data.push('}');
            Event::default().id(seq.to_string()).event("snapshot").data(data)
        }
        Err(err) => Event::default().event("error").data(err.to_string()),
    }
}

pub(crate) async fn events(
    State(app): State<AppState>,
    headers: HeaderMap,
    QueryParams(params): QueryParams<EventParams>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let permit = app.subscribers.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "too_many_subscribers",
            "too many event subscribers; retry later",
        )
    })?;
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or(params.last_event_id);
    let after = match last_event_id {
        Some(text) => Some(text.trim().parse::<u64>().map_err(|_| {
            ApiError::invalid("last_event_id", "must be the id of an earlier event (an integer)")
        })?),
        None => None,
    };
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
