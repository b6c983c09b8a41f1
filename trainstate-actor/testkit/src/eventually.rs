//! Waiting for a condition instead of for time.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often [`eventually`] looks again.
pub const POLL: Duration = Duration::from_millis(5);

/// What a condition answers: `true`/`false`, or `Some(value)`/`None`.
pub trait Outcome {
    /// What the wait gives back once the condition holds.
    type Value;

    /// `Some` once the condition holds.
    fn holds(self) -> Option<Self::Value>;
}

impl Outcome for bool {
    type Value = ();

    fn holds(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;

    fn holds(self) -> Option<T> {
        self
    }
}

/// Waits until `condition` holds, looking again every [`POLL`], and
/// returns what it gave; fails the test, naming `what`, when `deadline`
/// (wall-clock time) passes first. A synchronous condition is written
/// `|| std::future::ready(…)`.
pub async fn eventually<F, Fut, O>(what: &str, deadline: Duration, mut condition: F) -> O::Value
where
    F: FnMut() -> Fut,
    Fut: Future<Output = O>,
    O: Outcome,
{
    let until = Instant::now() + deadline;
    loop {
        if let Some(value) = condition().await.holds() {
            return value;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}
