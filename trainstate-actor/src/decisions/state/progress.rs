//! The progress a run's controller reports for its ranks: the board of the
//! run's current attempt, which the actor creates at the first report,
//! replaces when the attempt changes and removes when the run ends or is
//! gone (as it does a run's beat), and the checks of a report the
//! connection could not take itself (see `reader.rs`).

use std::sync::Arc;

use trainstate_client::StateError;
use trainstate_schema::api::{ProgressReport, ProgressResponse};
use trainstate_schema::{NewRun, RunId, RunStatus};

use super::Runs;
use crate::decisions::progress::{ProgressBoard, Reporter};
use crate::decisions::record::{CONTROLLER_PREFIX, RunRecord};

impl Runs {
    /// Takes a controller's progress report of live run `id`, received at
    /// `now_ms` (wall): recorded on the board of the run's current attempt
    /// while the run is RUNNING, and a sign of life of the run at every
    /// live status (its lease is renewed, as by a heartbeat). Refuses,
    /// changing nothing, an unknown run (404), an ended one, a run of the
    /// rendezvous (whose ranks report with their heartbeats), an attempt
    /// that is not the current one, a rank that is not one of its workers
    /// and a step that goes back (409).
    pub(crate) fn report_progress(
        &mut self,
        id: &RunId,
        report: &ProgressReport,
        now_ms: u64,
    ) -> Result<ProgressResponse, StateError> {
        let record = self.entry(id)?.record.clone();
        if record.status.is_terminal() {
            return Err(StateError::IllegalTransition {
                id: id.clone(),
                from: record.status,
                to: record.status,
                reason: "the run has ended; progress is for live runs".into(),
            });
        }
        if record.controller_actor_id().starts_with(CONTROLLER_PREFIX) {
            return Err(StateError::Conflict {
                id: id.clone(),
                reason: "the run was assembled by the rendezvous: its ranks report their progress \
                         with their heartbeats (POST /api/train/runs/{id}/ranks/{rank}/heartbeat)"
                    .into(),
            });
        }
        let board = match self.controller_board(id) {
            Some(board) => board,
            None => {
                let board = Arc::new(board_of(&record)?);
                self.liveness.put_progress(id.clone(), board.clone());
                board
            }
        };
        if let Some(attempt_id) = report.attempt_id.as_deref()
            && attempt_id != board.attempt_id()
        {
            return Err(StateError::Conflict {
                id: id.clone(),
                reason: format!(
                    "attempt {attempt_id:?} is not the run's current attempt {:?}",
                    board.attempt_id()
                ),
            });
        }
        let recorded = record.status == RunStatus::Running;
        if recorded {
            board.report_ranks(id, &report.ranks, now_ms)?;
        } else {
            board.check_ranks(id, &report.ranks)?;
        }
        let lease = self.heartbeat(id, now_ms)?;
        Ok(ProgressResponse::new(
            board.attempt_id(),
            board.world_size(),
            recorded,
            lease.as_millis() as u64,
        ))
    }

    /// The board run `id`'s controller reports to, if it reported.
    pub(super) fn controller_board(&self, id: &RunId) -> Option<Arc<ProgressBoard>> {
        self.liveness.progress(id).filter(|board| board.reporter() == Reporter::Controller)
    }

    /// Keeps the board run `record`'s controller reports to, if it
    /// reported, in step with the run: removed once the run ended,
    /// replaced by an empty one when its current attempt (or its number of
    /// workers) changed.
    pub(super) fn follow_progress(&self, record: &RunRecord) {
        let Some(board) = self.controller_board(&record.id) else { return };
        if record.status.is_terminal() {
            self.liveness.remove_progress(&record.id);
            return;
        }
        match board_of(record) {
            Ok(next)
                if next.attempt_id() == board.attempt_id()
                    && next.world_size() == board.world_size() => {}
            Ok(next) => self.liveness.put_progress(record.id.clone(), Arc::new(next)),
            Err(_) => self.liveness.remove_progress(&record.id),
        }
    }
}

/// An empty board of run `record`'s current attempt, whose ranks are its
/// workers.
fn board_of(record: &RunRecord) -> Result<ProgressBoard, StateError> {
    let run = record.run()?;
    let attempt_id = run.attempts().last().map_or(NewRun::FIRST_ATTEMPT_ID, |a| a.attempt_id());
    let world_size = run.workers().len() as u32;
    Ok(ProgressBoard::new(attempt_id, world_size, Reporter::Controller, None))
}
