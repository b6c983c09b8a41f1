//! `GET /api/train/events`: Server-Sent Events with resume.
//!
//! A subscriber is served from the committed view directly, never through
//! the actor's mailbox: where it starts (a snapshot, or the events after
//! its `Last-Event-ID`) is decided under the view's read lock, the lock the
//! writer publishes under, so no event falls between the two. A snapshot
//! is a shared list of references to the committed records (see
//! [`Snapshot`]), serialized a chunk at a time as the socket
//! takes bytes; change events are read from the view's backlog, the one
//! copy every subscriber shares. A subscriber whose next event is no
//! longer kept gets a fresh snapshot at the current sequence number S and
//! then only events above S: ids on the wire always increase.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use tokio::sync::{OwnedSemaphorePermit, watch};
use trainstate_client::StateEvent;
use trainstate_client::api::{ErrorCode, EventsQuery, RunEvent};

use super::AppState;
use super::answer::{AnswerBudget, CHUNK_BYTES, json_line, text};
use super::body::QueryParams;
use crate::engine::error::ApiError;
use crate::engine::supervisor::{EventFeed, Snapshot, Start};

/// How long a quiet stream waits before it sends a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The most events read from the backlog under one read lock.
const EVENTS_PER_READ: usize = 256;

/// Appends one committed change as an SSE event; its id is the sequence number.
fn write_change(buf: &mut Vec<u8>, event: &StateEvent) {
    let data = RunEvent::new(event.seq, event.kind, event.run_id.clone(), event.run.as_ref());
    text(buf, format_args!("event: {}\nid: {}\ndata: ", event.kind.as_str(), event.seq));
    json_line(buf, &data);
    buf.extend_from_slice(b"\n\n");
}

/// One subscriber's position in the stream.
struct Follower {
    feed: EventFeed,
    /// The last sequence number published, to wait for the next one.
    notify: watch::Receiver<u64>,
    /// The last event sent (or the snapshot's sequence number).
    position: u64,
    /// A snapshot being sent, and the index of its next run.
    snapshot: Option<(Snapshot, usize)>,
    shutdown: watch::Receiver<bool>,
    budget: AnswerBudget,
    _place: OwnedSemaphorePermit,
}

impl Follower {
    /// The next bytes of the stream; `None` ends it (shutdown).
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if *self.shutdown.borrow() {
                return None;
            }
            let mut buf = Vec::new();
            if let Some((snapshot, next)) = &mut self.snapshot {
                self.position = snapshot.seq;
                if *next == 0 {
                    let seq = snapshot.seq;
                    text(
                        &mut buf,
                        format_args!(
                            "event: snapshot\nid: {seq}\ndata: {{\"seq\":{seq},\"train_runs\":["
                        ),
                    );
                }
                while *next < snapshot.runs.len() && buf.len() < CHUNK_BYTES {
                    if *next > 0 {
                        buf.push(b',');
                    }
                    json_line(&mut buf, snapshot.runs[*next].json());
                    *next += 1;
                }
                if *next == snapshot.runs.len() {
                    buf.extend_from_slice(b"]}\n\n");
                    self.snapshot = None;
                }
                return Some(self.budget.take(buf).await);
            }
            // Seen before reading, so a publish after the read wakes us.
            self.notify.borrow_and_update();
            match self.feed.events_after(self.position, EVENTS_PER_READ) {
                // Fell behind: what was missed is gone. Start over from a
                // snapshot at S, then only events above S.
                Err(snapshot) => self.snapshot = Some((snapshot, 0)),
                Ok(events) if !events.is_empty() => {
                    for event in &events {
                        write_change(&mut buf, event);
                        self.position = event.seq;
                        if buf.len() >= CHUNK_BYTES {
                            break;
                        }
                    }
                    // Not under the budget: slow listing readers holding it
                    // must not hold up live events. What a stream can hold
                    // is bounded by its connection's buffer anyway.
                    return Some(Bytes::from(buf));
                }
                Ok(_) => {
                    tokio::select! {
                        changed = self.notify.changed() => {
                            if changed.is_err() {
                                return None;
                            }
                        }
                        () = tokio::time::sleep(KEEP_ALIVE) => {
                            return Some(Bytes::from_static(b":\n\n"));
                        }
                        _ = self.shutdown.wait_for(|stopping| *stopping) => return None,
                    }
                }
            }
        }
    }
}

/// The event id to resume after: the `Last-Event-ID` header, or the
/// `last_event_id` query parameter.
fn resume_after(headers: &HeaderMap, query: &EventsQuery) -> Result<Option<u64>, ApiError> {
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
    Ok(header.or(query.last_event_id))
}

pub(crate) async fn events(
    State(app): State<AppState>,
    headers: HeaderMap,
    QueryParams(params): QueryParams<EventsQuery>,
) -> Result<Response, ApiError> {
    let place = app.subscribers.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(ErrorCode::TooManySubscribers, "too many event subscribers; retry later")
    })?;
    let after = resume_after(&headers, &params)?;
    let (feed, start, notify) = app.service.follow_events(after);
    let (position, snapshot) = match start {
        Start::After(after) => (after, None),
        Start::Snapshot(snapshot) => (snapshot.seq, Some((snapshot, 0))),
    };
    let follower = Follower {
        feed,
        notify,
        position,
        snapshot,
        shutdown: app.shutdown.clone(),
        budget: app.budget.clone(),
        _place: place,
    };
    let body = stream::unfold(follower, |mut follower| async move {
        let bytes = follower.next().await?;
        Some((Ok::<_, Infallible>(bytes), follower))
    });
    let mut response = Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}
