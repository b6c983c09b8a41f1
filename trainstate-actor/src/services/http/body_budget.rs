//! The shared budget of request-body bytes, charged as the bytes arrive.
//!
//! A body costs nothing for what it announces, only for what it has sent:
//! sixteen uploads that announce 16 MiB and send one byte hold 16 bytes,
//! not the whole budget. Each body's first [`BODY_BYTES_OUTSIDE_BUDGET`]
//! are not charged at all, so small writes (rank heartbeats, status
//! changes, ordinary registrations) never wait on large ones. A body that
//! sends nothing for [`HttpConfig::body_read_timeout`] is cut off, and its
//! bytes go back to the budget when its request's handling ends.
//!
//! [`BODY_BYTES_OUTSIDE_BUDGET`]: super::BODY_BYTES_OUTSIDE_BUDGET
//! [`HttpConfig::body_read_timeout`]: super::HttpConfig::body_read_timeout

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use hyper::body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_http::timeout::{TimeoutBody, TimeoutError};

use super::BODY_BYTES_OUTSIDE_BUDGET;

/// The budget every request body draws on, in KiB.
pub(crate) struct BodyBudget {
    permits: Arc<Semaphore>,
    total_kib: u32,
    idle: Duration,
    bodies: Arc<AtomicUsize>,
}

/// Why a body was cut off before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its next bytes would pass the budget.
    Overloaded,
    /// It sent nothing for the body-read timeout.
    Idle,
}

/// What one request's body has drawn: held until both the body and this
/// handle are dropped, that is until the request's handling ends.
pub(crate) struct Charge(Arc<Drawn>);

struct Drawn {
    permits: Arc<Semaphore>,
    total_kib: u32,
    state: Mutex<DrawnState>,
    bodies: Arc<AtomicUsize>,
}

impl Drop for Drawn {
    fn drop(&mut self) {
        self.bodies.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct DrawnState {
    received: usize,
    held: Option<OwnedSemaphorePermit>,
    refusal: Option<Refusal>,
}

impl BodyBudget {
    pub(crate) fn new(max_bytes: usize, idle: Duration) -> Self {
        let total_kib = kib(max_bytes).max(1);
        Self {
            permits: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
            idle,
            bodies: Arc::default(),
        }
    }

    /// The request bodies being received or handled now.
    pub(crate) fn bodies(&self) -> usize {
        self.bodies.load(Ordering::Relaxed)
    }

    /// The bytes charged to the budget now, in whole KiB.
    pub(crate) fn charged_bytes(&self) -> usize {
        (self.total_kib as usize).saturating_sub(self.permits.available_permits()) * 1024
    }

    /// Gives `request` a body that draws on the budget as its bytes arrive
    /// and is cut off when it sends nothing for the body-read timeout.
    pub(crate) fn meter(&self, request: Request) -> (Request, Charge) {
        self.bodies.fetch_add(1, Ordering::Relaxed);
        let drawn = Arc::new(Drawn {
            permits: self.permits.clone(),
            total_kib: self.total_kib,
            state: Mutex::default(),
            bodies: self.bodies.clone(),
        });
        let (parts, body) = request.into_parts();
        let metered =
            Metered { inner: Box::pin(TimeoutBody::new(self.idle, body)), drawn: drawn.clone() };
        (Request::from_parts(parts, Body::new(metered)), Charge(drawn))
    }
}

impl Charge {
    /// Why the body was cut off, if it was.
    pub(crate) fn refusal(&self) -> Option<Refusal> {
        self.0.lock().refusal
    }
}

impl Drawn {
    fn lock(&self) -> std::sync::MutexGuard<'_, DrawnState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Draws for `len` more bytes received; refuses (and remembers why)
    /// when the budget has no room for them.
    fn draw(&self, len: usize) -> Result<(), Refusal> {
        let mut state = self.lock();
        state.received += len;
        let charged = state.received.saturating_sub(BODY_BYTES_OUTSIDE_BUDGET);
        // A body larger than the whole budget needs all of it.
        let needed = kib(charged).min(self.total_kib);
        let held = state.held.as_ref().map_or(0, |p| p.num_permits() as u32);
        if needed <= held {
            return Ok(());
        }
        match self.permits.clone().try_acquire_many_owned(needed - held) {
            Ok(more) => {
                match state.held.as_mut() {
                    Some(held) => held.merge(more),
                    None => state.held = Some(more),
                }
                Ok(())
            }
            Err(_) => {
                state.refusal = Some(Refusal::Overloaded);
                Err(Refusal::Overloaded)
            }
        }
    }

    fn refuse(&self, refusal: Refusal) {
        self.lock().refusal.get_or_insert(refusal);
    }
}

/// `bytes` in whole KiB, rounded up (0 for 0): the unit of the budget (a
/// semaphore's permits fit in a `u32`).
fn kib(bytes: usize) -> u32 {
    bytes.div_ceil(1024).min(u32::MAX as usize >> 4) as u32
}

/// A request body that draws on the budget frame by frame.
struct Metered {
    inner: Pin<Box<TimeoutBody<Body>>>,
    drawn: Arc<Drawn>,
}

/// The error a cut-off body ends with; the middleware answers for it.
#[derive(Debug)]
struct CutOff(Refusal);

impl std::fmt::Display for CutOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Refusal::Overloaded => f.write_str("the budget of request-body bytes is spent"),
            Refusal::Idle => f.write_str("the body sent nothing for the body-read timeout"),
        }
    }
}

impl std::error::Error for CutOff {}

impl HttpBody for Metered {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = ready!(self.inner.as_mut().poll_frame(cx));
        Poll::Ready(match frame {
            Some(Ok(frame)) => {
                let len = frame.data_ref().map_or(0, Bytes::len);
                match self.drawn.draw(len) {
                    Ok(()) => Some(Ok(frame)),
                    Err(refusal) => Some(Err(Box::new(CutOff(refusal)))),
                }
            }
            Some(Err(err)) => {
                if err.is::<TimeoutError>() {
                    self.drawn.refuse(Refusal::Idle);
                    Some(Err(Box::new(CutOff(Refusal::Idle))))
                } else {
                    Some(Err(err))
                }
            }
            None => None,
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_draw_what_they_received_past_their_free_share() {
        let budget = BodyBudget::new(100 * 1024, Duration::from_secs(10));
        let (_, a) = budget.meter(Request::new(Body::empty()));
        let (_, b) = budget.meter(Request::new(Body::empty()));
        // The first 64 KiB of each body cost nothing.
        a.0.draw(BODY_BYTES_OUTSIDE_BUDGET).unwrap();
        assert_eq!(budget.permits.available_permits(), 100);
        a.0.draw(1).unwrap();
        assert_eq!(budget.permits.available_permits(), 99);
        a.0.draw(60 * 1024).unwrap();
        assert_eq!(budget.permits.available_permits(), 39);
        // Small bodies pass while the budget is nearly spent...
        b.0.draw(BODY_BYTES_OUTSIDE_BUDGET).unwrap();
        // ...and a body past its share is refused when no room is left.
        assert_eq!(b.0.draw(40 * 1024), Err(Refusal::Overloaded));
        assert_eq!(b.refusal(), Some(Refusal::Overloaded));
        assert_eq!(a.refusal(), None);
        // The bytes go back when the request's handling ends.
        assert_eq!(budget.bodies(), 2);
        drop(a);
        assert_eq!(budget.permits.available_permits(), 100);
        assert_eq!(budget.bodies(), 1);
    }

    #[test]
    fn a_body_larger_than_the_budget_needs_all_of_it() {
        let budget = BodyBudget::new(10 * 1024, Duration::from_secs(10));
        let (_, a) = budget.meter(Request::new(Body::empty()));
        a.0.draw(BODY_BYTES_OUTSIDE_BUDGET + 20 * 1024).unwrap();
        assert_eq!(budget.permits.available_permits(), 0);
    }
}
