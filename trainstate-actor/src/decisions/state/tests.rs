//! The run state machine, table-driven.
//!
//! The status transitions are read from the table in
//! `docs/state-actor.md` ("Transitions"): every (from, to) pair of statuses
//! is tried on a fresh machine and must come out as the table's cell says,
//! so the document and the code cannot drift apart unnoticed. Attempts,
//! heartbeats, deletes and the lease sweep have tables of their own, from
//! the rules listed under the table.
//!
//! Every call goes through [`Machine`], which holds the clock (`now_ms`):
//! a change of a transition's signature is fixed there, once.

use std::collections::HashSet;
use std::time::Duration;

use trainstate_client::{NewAttempt, StateError, StatusUpdate};
use trainstate_schema::{
    ActorStatus, AttemptStatus, CauseKind, NewRun, Resources, Rule, RunCause, RunId, RunStatus,
    TrainRunInfo, TrainRunInfoDraft, TrainWorkerInfo, TrainWorkerInfoDraft,
};

use super::{Outcome, Runs};
use crate::decisions::retention::Retention;

const T0: u64 = 1_760_000_000_000;
const LEASE: Duration = Duration::from_secs(60);

/// The transition table, as documented.
const STATE_ACTOR_MD: &str = include_str!("../../../../docs/state-actor.md");

/// The state machine and its clock.
struct Machine {
    runs: Runs,
    now_ms: u64,
}

/// What a request came to, in the terms of the tables.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    /// Accepted: a change to commit.
    Changed,
    /// A repeat: nothing to write.
    Unchanged,
    Illegal {
        from: RunStatus,
        to: RunStatus,
    },
    Invalid {
        field: String,
        message: String,
    },
    Conflict,
    NotFound,
    Other(String),
}

fn got<T>(result: Result<Outcome<T>, StateError>) -> Got {
    match result {
        Ok(Outcome::Changed(_)) => Got::Changed,
        Ok(Outcome::Unchanged(_)) => Got::Unchanged,
        Err(err) => refused(err),
    }
}

fn refused(err: StateError) -> Got {
    match err {
        StateError::IllegalTransition { from, to, .. } => Got::Illegal { from, to },
        StateError::Invalid { field, message } => Got::Invalid { field, message },
        StateError::Conflict { .. } => Got::Conflict,
        StateError::NotFound { .. } => Got::NotFound,
        other => Got::Other(other.to_string()),
    }
}

fn invalid(field: &str, rule: Rule) -> Got {
    Got::Invalid { field: field.to_owned(), message: rule.to_string() }
}

impl Machine {
    fn new() -> Self {
        Self { runs: Runs::load(Vec::new(), T0, LEASE, Retention::default()), now_ms: T0 }
    }

    fn advance(&mut self, by: Duration) {
        self.now_ms += by.as_millis() as u64;
    }

    fn register(&mut self, run: TrainRunInfo) -> Got {
        got(self.runs.register(NewRun::new(run), self.now_ms))
    }

    fn set_status(&mut self, id: &RunId, update: StatusUpdate) -> Got {
        got(self.runs.set_status(id, update, self.now_ms))
    }

    fn start_attempt(&mut self, id: &RunId, attempt: NewAttempt) -> Got {
        got(self.runs.start_attempt(id, attempt, self.now_ms))
    }

    fn heartbeat(&mut self, id: &RunId) -> Result<Duration, Got> {
        self.runs.heartbeat(id, self.now_ms).map_err(refused)
    }

    fn delete(&mut self, id: &RunId) -> Got {
        got(self.runs.delete(id))
    }

    /// The runs the lease sweep aborted.
    fn sweep(&mut self) -> Vec<RunId> {
        self.runs.sweep(self.now_ms).answer
    }

    /// The run as stored in the working state.
    fn run(&self, id: &RunId) -> TrainRunInfo {
        self.runs.entry(id).unwrap().record.run().unwrap()
    }

    fn last_heard(&self, id: &RunId) -> Option<u64> {
        let record = self.runs.entry(id).unwrap().record.clone();
        self.runs.heartbeat_of(&record)
    }

    fn contains(&self, id: &RunId) -> bool {
        self.runs.entry(id).is_ok()
    }
}

fn workers(n: u32, first_pid: u32) -> Vec<TrainWorkerInfo> {
    (0..n)
        .map(|rank| {
            TrainWorkerInfoDraft {
                actor_id: format!("actor{first_pid}-{rank}"),
                world_rank: rank,
                local_rank: rank,
                node_rank: 0,
                node_id: "node0".into(),
                node_ip: "10.0.0.1".into(),
                pid: first_pid + rank,
                gpu_ids: vec![rank],
                status: ActorStatus::Alive,
                resources: Resources::from_iter([("GPU", 1.0)]),
                worker_log_file_path: None,
                node_name: None,
            }
            .validate()
            .unwrap()
        })
        .collect()
}

/// A live run of two workers, started at `T0`.
fn live_run() -> TrainRunInfo {
    TrainRunInfoDraft {
        workers: workers(2, 100).into_iter().map(TrainWorkerInfo::into_draft).collect(),
        ..TrainRunInfoDraft::new(RunId::new_v7().to_string(), "run", "job", "controller", T0)
    }
    .validate()
    .unwrap()
}

/// A row of the tables: the state a run is in before the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Row {
    Live(RunStatus),
    Finished,
    Errored,
    Aborted,
    /// Aborted by the head's lease sweep (`LOST_CONTROLLER`).
    LostController,
}

impl Row {
    fn status(self) -> RunStatus {
        match self {
            Row::Live(status) => status,
            Row::Finished => RunStatus::Finished,
            Row::Errored => RunStatus::Errored,
            Row::Aborted | Row::LostController => RunStatus::Aborted,
        }
    }

    /// Every state a run can be in: each live status, each way of ending.
    fn all() -> Vec<Row> {
        let mut all: Vec<Row> = live_statuses().into_iter().map(Row::Live).collect();
        all.extend([Row::Finished, Row::Errored, Row::Aborted, Row::LostController]);
        all
    }
}

fn live_statuses() -> Vec<RunStatus> {
    RunStatus::ALL.iter().copied().filter(|s| s.is_live()).collect()
}

/// The cause the ERRORED row's run was stored with.
fn errored_same() -> StatusUpdate {
    StatusUpdate::errored(Some(0), CauseKind::UserError, "ValueError: loss is NaN")
}

/// The cause the ABORTED row's run was stored with.
fn aborted_same() -> StatusUpdate {
    StatusUpdate::aborted(CauseKind::UserInterrupt, "interrupted")
}

/// A fresh machine with one run in state `from`.
fn enter(from: Row) -> (Machine, RunId) {
    let mut m = Machine::new();
    let run = live_run();
    let id = run.id().clone();
    assert_eq!(m.register(run), Got::Changed);
    move_to(&mut m, &id, from);
    (m, id)
}

/// One update a column of the table stands for, and whether it repeats
/// the status and cause the run is stored with.
struct Try {
    update: StatusUpdate,
    same_cause: bool,
}

/// The updates a column stands for, asked of a run in `from`.
fn column(heading: &str, from: Row) -> Vec<Try> {
    let stored_cause = match from {
        Row::Errored => errored_same().cause,
        Row::Aborted => aborted_same().cause,
        Row::LostController => Some(RunCause::new(CauseKind::LostController, None)),
        _ => None,
    };
    let tries = |updates: Vec<StatusUpdate>| {
        updates
            .into_iter()
            .map(|update| Try {
                same_cause: update.status == from.status() && update.cause == stored_cause,
                update,
            })
            .collect()
    };
    let live = |keep: &dyn Fn(RunStatus) -> bool| {
        live_statuses()
            .into_iter()
            .filter(|&s| keep(s))
            .map(|s| StatusUpdate::live(s, ""))
            .collect()
    };
    match (heading, from) {
        ("the same live status", Row::Live(status)) => tries(live(&|s| s == status)),
        ("another live status", Row::Live(status)) => tries(live(&|s| s != status)),
        // For an ended run, every live status is "another" one.
        ("the same live status" | "another live status", _) => tries(live(&|_| true)),
        ("FINISHED", _) => tries(vec![StatusUpdate::finished()]),
        ("ERRORED", _) => tries(vec![
            errored_same(),
            StatusUpdate::errored(None, CauseKind::SystemError, "node lost"),
        ]),
        ("ABORTED", _) => {
            let mut updates = vec![
                aborted_same(),
                StatusUpdate::aborted(CauseKind::SystemError, "stopped by the system"),
            ];
            if from == Row::LostController {
                updates.push(StatusUpdate::aborted(CauseKind::LostController, "again"));
            }
            tries(updates)
        }
        _ => panic!("a column the tests do not know: {heading:?}"),
    }
}

/// The row a label of the documented table names.
fn rows(label: &str) -> Vec<Row> {
    match label {
        "live" => live_statuses().into_iter().map(Row::Live).collect(),
        "FINISHED" => vec![Row::Finished],
        "ERRORED" => vec![Row::Errored],
        "ABORTED" => vec![Row::Aborted],
        "ABORTED (lost controller)" => vec![Row::LostController],
        _ => panic!("a row the tests do not know: {label:?}"),
    }
}

/// The transition table of `docs/state-actor.md`: its column headings and
/// its rows of (label, cells).
fn documented_table() -> (Vec<String>, Vec<(String, Vec<String>)>) {
    let cells = |line: &str| -> Vec<String> {
        line.trim().trim_matches('|').split('|').map(|c| c.trim().to_owned()).collect()
    };
    let mut lines = STATE_ACTOR_MD.lines().skip_while(|l| !l.starts_with("| from \\ to |"));
    let header = cells(lines.next().expect("the transition table in docs/state-actor.md"));
    let separator = lines.next().unwrap();
    assert!(separator.starts_with("|---"), "{separator}");
    let rows: Vec<(String, Vec<String>)> = lines
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let mut row = cells(l);
            let label = row.remove(0);
            (label, row)
        })
        .collect();
    (header[1..].to_vec(), rows)
}

/// Checks one cell: `expected` is the table's text for `heading` from `from`.
fn check_cell(from: Row, heading: &str, expected: &str) -> Vec<(RunStatus, RunStatus)> {
    let mut tried = Vec::new();
    for Try { update, same_cause } in column(heading, from) {
        let to = update.status;
        let what = format!("{from:?} -> {to} ({heading}: {expected}; {:?})", update.cause);
        tried.push((from.status(), to));
        let (mut m, id) = enter(from);
        let illegal = Got::Illegal { from: from.status(), to };
        let result = m.set_status(&id, update.clone());
        match expected {
            "no-op" => assert_eq!(result, Got::Unchanged, "{what}"),
            "no-op (same cause)" if same_cause => assert_eq!(result, Got::Unchanged, "{what}"),
            "no-op (same cause)" | "✗" => {
                assert_eq!(result, illegal, "{what}");
                assert_eq!(m.run(&id).status(), from.status(), "{what}: nothing changed");
            }
            "✓" => {
                assert_eq!(result, Got::Changed, "{what}");
                check_entered(&m, &id, from, to, &what);
            }
            // Only the head's sweep writes LOST_CONTROLLER: a client asking
            // for it is refused as invalid, naming the field.
            "✓ once (another cause)" if same_cause => {
                assert_eq!(result, invalid("cause.kind", Rule::CauseReservedForHead), "{what}");
            }
            "✓ once" | "✓ once (another cause)" => {
                assert_eq!(result, Got::Changed, "{what}");
                check_entered(&m, &id, from, to, &what);
                // Once: the run has ended for good. Its repeat is a no-op,
                // anything else illegal.
                assert_eq!(m.set_status(&id, update), Got::Unchanged, "{what}: repeated");
                let other = if to == RunStatus::Finished {
                    aborted_same()
                } else {
                    StatusUpdate::finished()
                };
                let other_to = other.status;
                assert_eq!(
                    m.set_status(&id, other),
                    Got::Illegal { from: to, to: other_to },
                    "{what}: then {other_to}"
                );
            }
            _ => panic!("a cell the tests do not know: {expected:?}"),
        }
    }
    tried
}

/// A run that entered `to`: as the rules under the table say.
fn check_entered(m: &Machine, id: &RunId, from: Row, to: RunStatus, what: &str) {
    let run = m.run(id);
    assert_eq!(run.status(), to, "{what}");
    if to.is_live() {
        assert_eq!(run.end_time_ms(), None, "{what}");
        assert_eq!(run.run_status(), RunStatus::Running, "{what}: V1 sees RUNNING");
        return;
    }
    // Entering a terminal status stamps the end (now), ends the current
    // attempt with the matching status, and marks the workers DEAD.
    assert_eq!(run.end_time_ms(), Some(m.now_ms), "{what}");
    let current = run.attempts().last().unwrap();
    assert_eq!(current.end_time_ms(), Some(m.now_ms), "{what}");
    if from == Row::LostController {
        // The attempt the sweep ended keeps that end: the controller's
        // late report replaces the run's status, detail and cause only.
        assert_eq!(current.status(), AttemptStatus::Aborted, "{what}");
        assert_eq!(current.cause().map(|c| c.kind), Some(CauseKind::LostController), "{what}");
    } else {
        assert_eq!(Some(current.status()), AttemptStatus::ending(to), "{what}");
        assert_eq!(current.cause(), run.cause(), "{what}");
    }
    assert!(run.workers().iter().all(|w| w.status() == ActorStatus::Dead), "{what}");
}

#[test]
fn status_transitions_are_the_documented_table() {
    let (headings, table) = documented_table();
    assert_eq!(
        headings,
        ["the same live status", "another live status", "FINISHED", "ERRORED", "ABORTED"],
        "the columns of the table in docs/state-actor.md"
    );
    let labels: Vec<&str> = table.iter().map(|(label, _)| label.as_str()).collect();
    assert_eq!(labels, ["live", "FINISHED", "ERRORED", "ABORTED", "ABORTED (lost controller)"]);

    let mut pairs = HashSet::new();
    for (label, cells) in &table {
        assert_eq!(cells.len(), headings.len(), "row {label}");
        for from in rows(label) {
            for (heading, cell) in headings.iter().zip(cells) {
                for (from_status, to) in check_cell(from, heading, cell) {
                    pairs.insert((from == Row::LostController, from_status, to));
                }
            }
        }
    }
    // Every (from, to) pair of statuses was tried, from every way of ending.
    let statuses = RunStatus::ALL.len();
    assert_eq!(pairs.len(), (statuses + 1) * statuses, "{pairs:?}");
}

#[test]
fn a_status_update_breaking_a_client_rule_is_refused_naming_the_field() {
    let table: Vec<(StatusUpdate, Got)> = vec![
        (
            {
                let mut finished = StatusUpdate::finished();
                finished.cause = Some(RunCause::new(CauseKind::UserError, None));
                finished
            },
            // The rule is CauseWithoutFailure; `set_status` words it itself.
            Got::Invalid {
                field: "cause".into(),
                message: "only an ERRORED or ABORTED run has a cause".into(),
            },
        ),
        (
            StatusUpdate::errored(Some(2), CauseKind::UserError, "rank 2 of 2 workers"),
            invalid("cause.failed_world_rank", Rule::FailedRankOutOfRange { rank: 2, workers: 2 }),
        ),
        (
            StatusUpdate::aborted(CauseKind::LostController, "not a client's to say"),
            invalid("cause.kind", Rule::CauseReservedForHead),
        ),
        (
            StatusUpdate::finished().ended_at(T0 / 1000),
            invalid("end_time_ms", Rule::ImplausibleTime),
        ),
    ];
    for (update, expected) in table {
        let (mut m, id) = enter(Row::Live(RunStatus::Running));
        let what = format!("{update:?}");
        assert_eq!(m.set_status(&id, update), expected, "{what}");
        assert_eq!(m.run(&id).status(), RunStatus::Running, "{what}: nothing changed");
    }
    // Unknown runs are not found.
    let mut m = Machine::new();
    assert_eq!(m.set_status(&RunId::new_v7(), StatusUpdate::finished()), Got::NotFound);
}

/// What a new attempt comes to, per state and kind of attempt.
#[test]
fn attempts_are_legal_on_live_runs_only_and_repeats_are_no_ops() {
    #[derive(Debug, Clone, Copy)]
    enum Ask {
        /// A new attempt `1` with four new workers, 10 s after the start.
        New,
        /// Attempt `1` again, as first asked (on a run that had it before
        /// reaching this state).
        Repeat,
        /// Attempt `1` again with other workers.
        RepeatOtherWorkers,
        /// Attempt `1` again with another start.
        RepeatOtherStart,
        /// Attempt `0` (the first), no longer current, again.
        Earlier,
        /// A new attempt whose start is in seconds, not milliseconds.
        SecondsStart,
    }
    let first = || NewAttempt::new("1", T0 + 10_000, workers(4, 200));
    let ended = |from: Row| !matches!(from, Row::Live(_));
    for from in Row::all() {
        // An ended run starts no new attempt; the status stays as it was.
        let new = match ended(from) {
            true => Got::Illegal { from: from.status(), to: from.status() },
            false => Got::Changed,
        };
        let table = [
            (Ask::New, new),
            (Ask::Repeat, Got::Unchanged),
            (Ask::RepeatOtherWorkers, Got::Conflict),
            (Ask::RepeatOtherStart, Got::Conflict),
            (Ask::Earlier, Got::Conflict),
            (Ask::SecondsStart, invalid("start_time_ms", Rule::ImplausibleTime)),
        ];
        for (ask, expected) in table {
            let what = format!("{ask:?} on {from:?}");
            // A run that already has attempt 1 before it reaches `from`.
            let had_attempt = !matches!(ask, Ask::New | Ask::SecondsStart);
            let mut m = Machine::new();
            let run = live_run();
            let id = run.id().clone();
            assert_eq!(m.register(run), Got::Changed);
            if had_attempt {
                assert_eq!(m.start_attempt(&id, first()), Got::Changed, "{what}");
            }
            move_to(&mut m, &id, from);
            let attempt = match ask {
                Ask::New | Ask::Repeat => first(),
                Ask::RepeatOtherWorkers => NewAttempt::new("1", T0 + 10_000, workers(3, 300)),
                Ask::RepeatOtherStart => NewAttempt::new("1", T0 + 20_000, workers(4, 200)),
                Ask::Earlier => NewAttempt::new("0", T0, workers(2, 100)),
                Ask::SecondsStart => NewAttempt::new("1", T0 / 1000, workers(4, 200)),
            };
            let before = m.run(&id);
            let result = m.start_attempt(&id, attempt);
            assert_eq!(result, expected, "{what}");
            if result != Got::Changed {
                assert_eq!(m.run(&id), before, "{what}: nothing changed");
                continue;
            }
            // The new attempt is current; the one it replaces ends at its
            // start, ABORTED, keeping its workers, marked DEAD.
            let run = m.run(&id);
            assert_eq!(run.workers().len(), 4, "{what}");
            let attempts = run.attempts();
            assert_eq!(attempts.len(), 2, "{what}");
            assert_eq!(attempts[1].attempt_id(), "1");
            assert_eq!(attempts[1].start_time_ms(), T0 + 10_000);
            assert_eq!(attempts[0].end_time_ms(), Some(T0 + 10_000), "{what}");
            assert_eq!(attempts[0].status(), AttemptStatus::Aborted, "{what}");
            assert_eq!(attempts[0].status_detail(), "replaced by attempt 1", "{what}");
            let previous = attempts[0].workers().unwrap();
            assert_eq!(previous.len(), 2, "{what}");
            assert!(previous.iter().all(|w| w.status() == ActorStatus::Dead), "{what}");
        }
    }
    let mut m = Machine::new();
    assert_eq!(m.start_attempt(&RunId::new_v7(), first()), Got::NotFound);
}

/// Moves a live run of `m` to `from`, as [`enter`] does on a fresh machine.
fn move_to(m: &mut Machine, id: &RunId, from: Row) {
    let update = match from {
        Row::Live(RunStatus::Running) => None,
        Row::Live(status) => Some(StatusUpdate::live(status, "")),
        Row::Finished => Some(StatusUpdate::finished()),
        Row::Errored => Some(errored_same()),
        Row::Aborted => Some(aborted_same()),
        Row::LostController => {
            m.advance(LEASE + Duration::from_millis(1));
            assert_eq!(m.sweep(), std::slice::from_ref(id));
            None
        }
    };
    if let Some(update) = update {
        assert_eq!(m.set_status(id, update), Got::Changed, "moving to {from:?}");
    }
    assert_eq!(m.run(id).status(), from.status());
}

#[test]
fn heartbeats_are_legal_on_live_runs_only() {
    for from in Row::all() {
        let (mut m, id) = enter(from);
        m.advance(Duration::from_secs(1));
        let what = format!("a heartbeat on {from:?}");
        match from {
            Row::Live(_) => {
                assert_eq!(m.heartbeat(&id), Ok(LEASE), "{what}");
                assert_eq!(m.last_heard(&id), Some(m.now_ms), "{what}");
            }
            _ => {
                let illegal = Got::Illegal { from: from.status(), to: RunStatus::Running };
                assert_eq!(m.heartbeat(&id), Err(illegal), "{what}");
                assert_eq!(m.last_heard(&id), None, "{what}: an ended run has no lease");
                assert_eq!(m.run(&id).status(), from.status(), "{what}: nothing changed");
            }
        }
    }
    let mut m = Machine::new();
    assert_eq!(m.heartbeat(&RunId::new_v7()), Err(Got::NotFound));
}

#[test]
fn the_sweep_aborts_live_runs_past_their_lease_only() {
    for from in Row::all() {
        let (mut m, id) = enter(from);
        let what = format!("a sweep of {from:?}");
        // Heard from within the lease: kept.
        if from.status().is_live() {
            assert_eq!(m.heartbeat(&id), Ok(LEASE), "{what}");
        }
        m.advance(LEASE / 2);
        assert_eq!(m.sweep(), [], "{what}");
        // Silent past the lease: only a live run is aborted, as its
        // controller lost.
        m.advance(LEASE);
        let aborted = m.sweep();
        if from.status().is_live() {
            assert_eq!(aborted, std::slice::from_ref(&id), "{what}");
            let run = m.run(&id);
            assert_eq!(run.status(), RunStatus::Aborted, "{what}");
            assert_eq!(run.cause().unwrap().kind, CauseKind::LostController, "{what}");
        } else {
            assert_eq!(aborted, [], "{what}");
            assert_eq!(m.run(&id).status(), from.status(), "{what}");
        }
    }
}

#[test]
fn delete_is_legal_on_ended_runs_only() {
    for from in Row::all() {
        let (mut m, id) = enter(from);
        let what = format!("deleting {from:?}");
        if from.status().is_live() {
            let illegal = Got::Illegal { from: from.status(), to: from.status() };
            assert_eq!(m.delete(&id), illegal, "{what}");
            assert!(m.contains(&id), "{what}");
        } else {
            assert_eq!(m.delete(&id), Got::Changed, "{what}");
            assert!(!m.contains(&id), "{what}");
            assert_eq!(m.delete(&id), Got::NotFound, "{what}: again");
        }
    }
}

#[test]
fn a_registration_repeated_is_a_no_op_and_with_other_static_metadata_a_conflict() {
    for from in Row::all() {
        let (mut m, id) = enter(from);
        let what = format!("registering {from:?} again");
        let mut original = live_run().into_draft();
        original.id = id.to_string();
        let again = original.clone().validate().unwrap();
        assert_eq!(m.register(again), Got::Unchanged, "{what}");
        let renamed = TrainRunInfoDraft { name: "renamed".into(), ..original }.validate().unwrap();
        assert_eq!(m.register(renamed), Got::Conflict, "{what}");
        assert_eq!(m.run(&id).status(), from.status(), "{what}: nothing changed");
    }
}

/// Every status change is appended to the run's history, its registration
/// first, with the time it was decided; a repeat or a change that keeps the
/// status adds nothing.
#[test]
fn every_status_change_is_recorded_in_the_run_s_history() {
    use trainstate_schema::StatusChange;

    let mut m = Machine::new();
    let run = live_run();
    let id = run.id().clone();
    assert_eq!(m.register(run.clone()), Got::Changed);
    assert_eq!(m.register(run), Got::Unchanged);
    m.advance(Duration::from_secs(1));
    assert_eq!(
        m.set_status(&id, StatusUpdate::live(RunStatus::Restarting, "a worker died")),
        Got::Changed
    );
    m.advance(Duration::from_secs(1));
    let attempt = NewAttempt::new("1", m.now_ms, workers(2, 200));
    assert_eq!(m.start_attempt(&id, attempt), Got::Changed);
    assert_eq!(m.set_status(&id, StatusUpdate::live(RunStatus::Running, "")), Got::Changed);
    assert_eq!(m.set_status(&id, StatusUpdate::live(RunStatus::Running, "")), Got::Unchanged);
    m.advance(Duration::from_secs(1));
    let aborted = StatusUpdate::aborted(CauseKind::UserInterrupt, "stopped");
    assert_eq!(m.set_status(&id, aborted.clone()), Got::Changed);
    assert_eq!(m.set_status(&id, aborted), Got::Unchanged);

    let history = m.run(&id).status_history().to_vec();
    let change = |status, at_ms, attempt_id: &str, detail: &str| StatusChange {
        attempt_id: Some(attempt_id.to_owned()),
        detail: detail.to_owned(),
        ..StatusChange::new(status, at_ms)
    };
    assert_eq!(
        history,
        [
            change(RunStatus::Running, T0, "0", ""),
            change(RunStatus::Restarting, T0 + 1_000, "0", "a worker died"),
            change(RunStatus::Running, T0 + 2_000, "1", ""),
            change(RunStatus::Aborted, T0 + 3_000, "1", "stopped"),
        ]
    );
}

#[test]
fn a_cause_s_class_is_the_head_s_and_a_stalled_run_interrupted_is_no_progress() {
    use trainstate_schema::{CauseClass, HealthState, RunHealth};
    // (cause kind, a class the client claims, the run stalled before, the class kept)
    let cases = [
        (CauseKind::Oom, CauseClass::Application, false, CauseClass::Infrastructure),
        (CauseKind::UserError, CauseClass::Infrastructure, false, CauseClass::Application),
        (CauseKind::UserInterrupt, CauseClass::Interrupted, false, CauseClass::Interrupted),
        (CauseKind::Preempted, CauseClass::Interrupted, false, CauseClass::Interrupted),
        (CauseKind::UserInterrupt, CauseClass::Interrupted, true, CauseClass::NoProgress),
        (CauseKind::Timeout, CauseClass::Interrupted, true, CauseClass::NoProgress),
        // A real fault explains the stall: its class is its own.
        (CauseKind::Hardware, CauseClass::Interrupted, true, CauseClass::Infrastructure),
        (CauseKind::UserError, CauseClass::Interrupted, true, CauseClass::Application),
    ];
    for (kind, claimed, stalled, kept) in cases {
        let what = format!("{kind} claimed {claimed}, stalled {stalled}");
        let mut m = Machine::new();
        let run = live_run();
        let id = run.id().clone();
        assert_eq!(m.register(run), Got::Changed, "{what}");
        if stalled {
            let health = RunHealth::new(HealthState::Stalled, m.now_ms, vec![0], "stalled".into());
            assert!(matches!(m.runs.set_health(&id, health, m.now_ms), Ok(Outcome::Changed(_))));
        }
        let mut update = StatusUpdate::aborted(kind, "ended");
        update.cause = Some(RunCause::new(kind, Some(0)).with_class(claimed));
        assert_eq!(m.set_status(&id, update.clone()), Got::Changed, "{what}");
        assert_eq!(m.run(&id).cause().map(|c| c.class), Some(kept), "{what}");
        // The same report again is a repeat, whatever class it claimed.
        assert_eq!(m.set_status(&id, update), Got::Unchanged, "{what}");
    }
}
