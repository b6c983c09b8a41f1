//! Large answers (listings, event-stream snapshots) written a chunk at a
//! time as the client reads, under one budget of answer bytes in flight.
//!
//! A chunk is produced only when hyper asks the body for more, which it
//! does only while its write buffer (about 400 KiB) is not full; a client
//! that does not read therefore pins at most that buffer and one chunk,
//! whatever the size of the answer. The chunks of listings and snapshots
//! every connection holds are counted against [`AnswerBudget`]; past it a
//! listing is refused with 503 `overloaded` before it starts, and one in
//! progress (or a snapshot) waits.

use std::io::Write as _;
use std::sync::Arc;

use axum::body::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The size a chunk is filled to before it is handed to the connection (a
/// single run larger than this makes one chunk of its own size).
pub(crate) const CHUNK_BYTES: usize = 64 * 1024;

/// The bytes of answer chunks produced and not yet written to their
/// sockets, across all connections, bounded.
#[derive(Clone)]
pub(crate) struct AnswerBudget {
    permits: Arc<Semaphore>,
    total: u32,
}

/// A chunk and its share of the budget, returned when the connection has
/// written it (or closed).
struct Held {
    bytes: Vec<u8>,
    _permit: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl AnswerBudget {
    /// A budget of `total` bytes (at least one, at most 4 GiB).
    pub(crate) fn new(total: usize) -> Self {
        let total = u32::try_from(total.max(1)).unwrap_or(u32::MAX);
        Self { permits: Arc::new(Semaphore::new(total as usize)), total }
    }

    /// The permits a chunk costs: its length, but never more than the
    /// whole budget (a chunk larger than the budget waits for all of it).
    fn cost(&self, len: usize) -> u32 {
        u32::try_from(len).unwrap_or(u32::MAX).clamp(1, self.total)
    }

    /// The chunk, counted against the budget; `Err` (the chunk back) when
    /// the budget cannot take it now.
    pub(crate) fn try_take(&self, bytes: Vec<u8>) -> Result<Bytes, Vec<u8>> {
        match self.permits.clone().try_acquire_many_owned(self.cost(bytes.len())) {
            Ok(permit) => Ok(Bytes::from_owner(Held { bytes, _permit: permit })),
            Err(_) => Err(bytes),
        }
    }

    /// The chunk, counted against the budget once it has room.
    pub(crate) async fn take(&self, bytes: Vec<u8>) -> Bytes {
        let permit = self
            .permits
            .clone()
            .acquire_many_owned(self.cost(bytes.len()))
            .await
            .expect("the answer budget is never closed");
        Bytes::from_owner(Held { bytes, _permit: permit })
    }

    /// The bytes of chunks held by connections now.
    pub(crate) fn in_use(&self) -> usize {
        self.total as usize - self.permits.available_permits()
    }
}

/// Appends `value` as JSON on one line: a newline or carriage return
/// outside a string (only whitespace can be one; inside strings JSON
/// escapes them) becomes a space, so the text fits one SSE `data:` line.
pub(crate) fn json_line(buf: &mut Vec<u8>, value: &impl serde::Serialize) {
    let start = buf.len();
    serde_json::to_writer(&mut *buf, value).expect("API documents serialize");
    for byte in &mut buf[start..] {
        if matches!(*byte, b'\n' | b'\r') {
            *byte = b' ';
        }
    }
}

/// Appends formatted text.
pub(crate) fn text(buf: &mut Vec<u8>, args: std::fmt::Arguments<'_>) {
    buf.write_fmt(args).expect("writing to a Vec cannot fail");
}
