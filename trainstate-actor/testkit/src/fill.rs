//! Filling a store with runs.

use trainstate_client::{StateError, StateHandle};
use trainstate_schema::{RunId, TrainRunInfo};

/// Registers every run through `state` (a local actor's handle, or a
/// remote head's), in order, and returns their ids. The first refusal is
/// the error.
pub async fn fill(
    state: &StateHandle,
    runs: impl IntoIterator<Item = TrainRunInfo>,
) -> Result<Vec<RunId>, StateError> {
    let mut ids = Vec::new();
    for run in runs {
        let id = run.id().clone();
        state.register(run).await?;
        ids.push(id);
    }
    Ok(ids)
}
