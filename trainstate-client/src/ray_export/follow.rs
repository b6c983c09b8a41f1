//! Following Ray's export event file and applying its Train events to a
//! head, in order, from a durable position.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;
use trainstate_schema::text::first_chars;
use trainstate_schema::{AttemptStatus, CauseKind, RunCause, RunId, RunStatus, ray_v2};

use crate::{RunDocument, RunQuery, StateError, StateHandle, StatusUpdate};

use super::decode::{Death, Decoded, ExportEvent, NodeDeath, decode_line};
use super::position::{
    Check, FileId, Line, LinesRead, PartialLine, Position, Positions, open_lock_file, read_lines,
};

/// The file Ray appends its Train run and attempt events to, in
/// `<session>/logs/export_events/`. Ray's `RotatingFileHandler` renames it
/// to `….log.1` (and so on) when it grows past
/// `RAY_EXPORT_EVENT_MAX_FILE_SIZE_BYTES` and starts a new one.
pub const TRAIN_STATE_FILE: &str = "event_EXPORT_TRAIN_STATE.log";

/// The file earlier Ray releases appended the same events to (one logger,
/// named after the run events' source type, took attempts too).
pub const TRAIN_RUN_FILE: &str = "event_EXPORT_TRAIN_RUN.log";

/// The files of Train events. One Ray session writes one of them.
pub const TRAIN_FILES: [&str; 2] = [TRAIN_RUN_FILE, TRAIN_STATE_FILE];

/// The file Ray's GCS appends its node events to (`EXPORT_NODE`): a
/// node's death, with its reason.
pub const NODE_FILE: &str = "event_EXPORT_NODE.log";

/// The file Ray's GCS appends its actor events to (`EXPORT_ACTOR`): a run's
/// controller is an actor, and its death has a cause.
pub const ACTOR_FILE: &str = "event_EXPORT_ACTOR.log";

/// The file Ray's GCS appends its driver job events to
/// (`EXPORT_DRIVER_JOB`): a run's driver job, and its end.
pub const DRIVER_JOB_FILE: &str = "event_EXPORT_DRIVER_JOB.log";

/// Every file name followed, each with a position of its own, in the order
/// each round reads them: the Train events to their end first, then the
/// deaths (nodes first, so that a run ended for its controller's or job's
/// death can say which of its nodes died), one batch of each.
pub const FOLLOWED_FILES: [&str; 5] =
    [TRAIN_RUN_FILE, TRAIN_STATE_FILE, NODE_FILE, ACTOR_FILE, DRIVER_JOB_FILE];

/// How many ended or live attempts the ingester remembers, to add a node's
/// death to those that had workers on it.
const REMEMBERED_ATTEMPTS: usize = 256;

/// How many dead nodes the ingester remembers.
const REMEMBERED_NODES: usize = 4_096;

/// Longest piece of Ray's own words (a death cause) put in a detail, in
/// characters.
const MAX_RAY_WORDS: usize = 4_000;

/// Where Ray's export events are under a session directory.
pub const SESSION_EVENTS_DIR: &str = "logs/export_events";

/// How an ingester runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct IngestConfig {
    /// Ray's export events directory (`<session>/logs/export_events`), or
    /// a session directory (its `logs/export_events` is used).
    pub dir: PathBuf,
    /// The file that keeps the ingester's position across restarts.
    pub position_file: PathBuf,
    /// How often to look for new lines when there are none.
    pub poll_interval: Duration,
    /// Read to the end once and return, instead of following the file.
    pub once: bool,
    /// The most lines applied between two writes of the position.
    pub max_batch_lines: usize,
    /// A longer line is skipped as malformed (never buffered whole).
    pub max_line_bytes: usize,
    /// The first wait before sending an event again to a head that could
    /// not take it; it doubles up to `max_backoff`.
    pub first_backoff: Duration,
    /// The longest wait between two sends of one event.
    pub max_backoff: Duration,
}

impl IngestConfig {
    /// Follows the export events in `dir`, keeping the position in
    /// `position_file`.
    pub fn new(dir: impl Into<PathBuf>, position_file: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            position_file: position_file.into(),
            poll_interval: Duration::from_millis(250),
            once: false,
            max_batch_lines: 64,
            max_line_bytes: 16 << 20,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }

    /// The same, looking for new lines every `interval`.
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The same, reading to the end once (`true`) or following (`false`).
    pub fn with_once(mut self, once: bool) -> Self {
        self.once = once;
        self
    }

    /// The export events directory now: `dir`, or its `logs/export_events`
    /// when `dir` is a session directory.
    pub fn events_dir(&self) -> PathBuf {
        let under_session = self.dir.join(SESSION_EVENTS_DIR);
        if under_session.is_dir() { under_session } else { self.dir.clone() }
    }
}

/// What an ingester did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IngestReport {
    /// Events the head took.
    pub applied: u64,
    /// Events the head refused (logged with their position, skipped).
    pub rejected: u64,
    /// Events older than what the head has (a terminal run or attempt
    /// never moves back): what applying an event again after a restart
    /// looks like. Logged with their position, skipped.
    pub stale: u64,
    /// Lines that are not export events (logged with their position,
    /// skipped).
    pub malformed: u64,
    /// Events of other sources (tasks, datasets), and actor, job and node
    /// events that are not deaths: skipped.
    pub other: u64,
    /// Deaths read: of actors, driver jobs and nodes.
    pub deaths: u64,
    /// Live runs the ingester ended (`ABORTED`) because Ray reports their
    /// controller or their driver job dead.
    pub ended: u64,
    /// Bytes of lines read from the export files. Each byte is read once
    /// however often a file is polled: a last line without its line break
    /// yet is read on as it grows, never again from its start.
    pub line_bytes_read: u64,
    /// Where the ingester is in each file it has read.
    pub positions: Vec<FilePosition>,
}

/// Where an ingester is in one file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FilePosition {
    /// The file (symbolic links resolved).
    pub file: PathBuf,
    /// The byte offset just after the last line handled.
    pub offset: u64,
    /// How many lines come before `offset`.
    pub line: u64,
}

/// Why an ingester stopped before it was told to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    /// The position file cannot be read or written.
    #[error("position file {}: {reason}", path.display())]
    Position {
        /// The position file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// Another ingester uses the same position file.
    #[error(
        "another ingester is using position file {}; stop it or choose another --position-file",
        path.display()
    )]
    Locked {
        /// The position file.
        path: PathBuf,
    },
    /// An export event file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The URL answers, but not as a trainstate head: `GET /api/version`
    /// reached no route of one (a path before `/api`, a typo, a proxy that
    /// does not pass the API on) or answered what a head does not. Nothing
    /// was read or applied.
    #[error("{url} is not the address of a trainstate head; no event was read: {reason}")]
    NotAHead {
        /// The URL the ingester was given.
        url: String,
        /// What answered, and what it said.
        reason: String,
    },
    /// The head refuses the ingester's credentials: no event could be
    /// applied, so none is skipped.
    #[error("the head refuses the ingester's credentials ({reason}); check the token")]
    Unauthorized {
        /// What the head said.
        reason: String,
    },
}

/// Follows `config.dir`'s Train export events and applies each, in order,
/// to the head behind `handle`, from the position saved in
/// `config.position_file`, until `shutdown` completes (or, with
/// `config.once`, until the end of the file).
///
/// Every event is a whole run or attempt, and applying one is an upsert,
/// so applying an event again is harmless: the position is saved after
/// each batch is applied, and a restart resumes from it. An event the head
/// cannot take now (down, busy, restarting) is sent again with backoff,
/// never skipped; one it refuses (invalid, conflicting) is logged with its
/// position and skipped, as is a malformed line.
pub async fn ingest(
    handle: &StateHandle,
    config: &IngestConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<IngestReport, IngestError> {
    let position_error =
        |reason: String| IngestError::Position { path: config.position_file.clone(), reason };
    if let Some(parent) = config.position_file.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| position_error(format!("cannot create its directory: {e}")))?;
    }
    let _lock = lock(&config.position_file)?;
    let positions = Positions::load(&config.position_file)
        .map_err(position_error)?
        .unwrap_or_else(Positions::new);
    for p in positions.files.values() {
        tracing::info!(file = %p.path.display(), offset = p.offset, line = p.line, "resuming");
    }
    tokio::pin!(shutdown);
    let checked = tokio::select! {
        checked = check_head(handle, config) => checked?,
        () = &mut shutdown => false,
    };
    if !checked {
        // Told to stop before the head answered: nothing was read.
        return Ok(IngestReport { positions: file_positions(positions), ..Default::default() });
    }
    let (stop, stopped) = watch::channel(false);
    let mut ingester = Ingester {
        handle,
        config,
        stop: stopped,
        positions,
        report: IngestReport::default(),
        live: HashMap::new(),
        seeded: false,
        attempts: VecDeque::new(),
        dead_nodes: HashMap::new(),
        dead_order: VecDeque::new(),
        partials: HashMap::new(),
    };
    let result = {
        let run = ingester.run();
        tokio::pin!(run);
        tokio::select! {
            result = &mut run => result,
            () = &mut shutdown => {
                let _ = stop.send(true);
                run.await
            }
        }
    };
    let mut report = ingester.report;
    report.positions = file_positions(ingester.positions);
    result.map(|()| report)
}

/// Where the ingester is in each file, as its report says it.
fn file_positions(positions: Positions) -> Vec<FilePosition> {
    positions
        .files
        .into_values()
        .map(|p| FilePosition { file: p.path, offset: p.offset, line: p.line })
        .collect()
}

/// Checks, before any event is read, that the handle's URL is a trainstate
/// head's: `GET /api/version` answers as one. A head that is down, busy or
/// still starting is asked again with backoff, as long as it takes (the
/// ingester waits for its head, as it always has); true once it answers.
/// A URL that answers, but not as a head (a route miss, a proxy's page,
/// another server), is refused: no event could ever be applied through it.
async fn check_head(handle: &StateHandle, config: &IngestConfig) -> Result<bool, IngestError> {
    if !handle.is_remote() {
        // A handle of this process's own actor: no URL to check.
        return Ok(true);
    }
    let mut backoff = config.first_backoff;
    let mut failures = 0_u32;
    loop {
        match handle.head_version().await {
            Ok(version) => {
                tracing::info!(head = handle.name(), version = %version.version, "the head answers");
                return Ok(true);
            }
            Err(StateError::Unauthorized { reason }) => {
                return Err(IngestError::Unauthorized { reason });
            }
            Err(
                error @ (StateError::NoSuchRoute { .. }
                | StateError::Protocol { .. }
                | StateError::Unsupported { .. }),
            ) => {
                return Err(IngestError::NotAHead {
                    url: handle.name().to_owned(),
                    reason: error.to_string(),
                });
            }
            Err(error) => {
                if failures.is_power_of_two() || failures == 0 {
                    tracing::warn!(head = handle.name(), %error, retry_in = ?backoff, "the head does not answer yet: asking again");
                }
                failures = failures.saturating_add(1);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(config.max_backoff);
            }
        }
    }
}

/// Holds `<position file>.lock` (an OS lock, released however the process
/// ends) so that two ingesters never share a position.
fn lock(position_file: &Path) -> Result<File, IngestError> {
    let mut path = position_file.as_os_str().to_owned();
    path.push(".lock");
    let file = open_lock_file(Path::new(&path)).map_err(|reason| IngestError::Position {
        path: position_file.to_owned(),
        reason: format!("its lock file: {reason}"),
    })?;
    file.try_lock().map_err(|_| IngestError::Locked { path: position_file.to_owned() })?;
    Ok(file)
}

/// What to do after handling a line.
enum Flow {
    Continue,
    Stop,
}

/// What one look at a followed name found.
enum Polled {
    /// No file under the name.
    Missing,
    /// Nothing new.
    Idle,
    /// Something was done: look again right away.
    Busy,
    /// Told to stop.
    Stop,
}

/// What the file under the followed name is, seen from the position.
enum Step {
    /// No file yet.
    Missing,
    /// The file the position is in; its lines from there (maybe none),
    /// and its last line if it has no line break yet.
    Lines { lines: Vec<Line>, position: Position, partial: Option<PartialLine>, bytes_read: u64 },
    /// Another file than the position's (or no position yet): `new` is its
    /// start, `old` where the position's file is now, if it still exists.
    Replaced { new: Position, old: Option<PathBuf> },
    /// The position's file, truncated or rewritten: `new` is its start.
    Rewound { check: Check, new: Position },
}

struct Ingester<'a> {
    handle: &'a StateHandle,
    config: &'a IngestConfig,
    stop: watch::Receiver<bool>,
    positions: Positions,
    report: IngestReport,
    /// The live runs on the head, as the answers of the ingester's writes
    /// (and, once, a listing of the head's live runs) last showed them: who
    /// a death concerns.
    live: HashMap<String, Watched>,
    /// Whether `live` holds the head's live runs listed at the first death.
    seeded: bool,
    /// The latest attempt documents applied, newest last.
    attempts: VecDeque<ray_v2::TrainRunAttempt>,
    /// Dead nodes by id: their address and why they died.
    dead_nodes: HashMap<String, (String, NodeDeath)>,
    /// `dead_nodes`' ids, oldest first, to bound it.
    dead_order: VecDeque<String>,
    /// The last line of each followed name without its line break yet, as
    /// far as it has been read.
    partials: HashMap<&'static str, PartialLine>,
}

/// A live run, as far as deaths are concerned.
struct Watched {
    job_id: String,
    controller_actor_id: String,
    start_time_ms: u64,
    /// When its current attempt started: the run does not end before.
    current_start_ms: u64,
    /// The nodes of its current workers: id, address and the lowest
    /// world rank on it, by node id.
    nodes: Vec<(String, String, u32)>,
}

/// A write to the head.
enum Write {
    /// Ray's whole run.
    Run(ray_v2::TrainRun),
    /// Ray's whole attempt.
    Attempt(ray_v2::TrainRunAttempt),
    /// A live run ends for a death Ray reports.
    End { id: RunId, update: StatusUpdate },
}

impl Write {
    fn run_id(&self) -> &str {
        match self {
            Write::Run(run) => &run.id,
            Write::Attempt(attempt) => &attempt.run_id,
            Write::End { id, .. } => id.as_str(),
        }
    }
}

async fn blocking<T: Send + 'static>(task: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(task).await {
        Ok(value) => value,
        Err(err) => std::panic::resume_unwind(err.into_panic()),
    }
}

impl Ingester<'_> {
    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// Waits `duration`; false when told to stop first.
    async fn wait(&mut self, duration: Duration) -> bool {
        tokio::select! {
            () = tokio::time::sleep(duration) => true,
            _ = self.stop.wait_for(|stop| *stop) => false,
        }
    }

    async fn run(&mut self) -> Result<(), IngestError> {
        let mut told_missing = false;
        while !self.stopped() {
            let (mut idle, mut missing) = (true, true);
            for name in FOLLOWED_FILES {
                let train = TRAIN_FILES.contains(&name);
                // The Train events to their end, before any death is read:
                // Ray writes a run's own reports before its cluster reports
                // its death, so a death never overtakes them.
                loop {
                    match self.poll(name).await? {
                        Polled::Missing => {}
                        Polled::Idle => missing &= !train,
                        Polled::Busy => {
                            idle = false;
                            missing &= !train;
                            if train {
                                continue;
                            }
                        }
                        Polled::Stop => return Ok(()),
                    }
                    break;
                }
            }
            if missing && !told_missing {
                tracing::info!(
                    dir = %self.config.events_dir().display(),
                    "waiting for Ray to write {TRAIN_STATE_FILE}"
                );
                told_missing = true;
            }
            if idle && (self.config.once || !self.wait(self.config.poll_interval).await) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Looks at the file under `name` once, and handles what is new there.
    async fn poll(&mut self, name: &'static str) -> Result<Polled, IngestError> {
        let path = self.config.events_dir().join(name);
        let position = self.positions.files.get(name).cloned();
        let announced;
        let step = {
            let partial = self.partials.remove(name);
            announced = partial.as_ref().filter(|p| p.is_oversized()).map(PartialLine::start);
            let (at, from) = (path.clone(), position.clone());
            let (max_lines, max_bytes) = (self.config.max_batch_lines, self.config.max_line_bytes);
            blocking(move || step(&at, from.as_ref(), partial, max_lines, max_bytes))
                .await
                .map_err(|source| IngestError::Read { path: path.clone(), source })?
        };
        match step {
            Step::Missing => {
                // A new Ray session that has not written yet: the end of
                // the previous session's file is still to be read.
                if let Some(previous) = position {
                    let at = previous.clone();
                    if let Some(old) = blocking(move || find_old(&at)).await
                        && let Flow::Stop = self.drain(name, &old, previous).await?
                    {
                        return Ok(Polled::Stop);
                    }
                }
                Ok(Polled::Missing)
            }
            Step::Replaced { new, old } => {
                match (position, old) {
                    (Some(previous), Some(old)) => {
                        tracing::info!(
                            file = %path.display(),
                            previous = %old.display(),
                            "a new file under the name: reading the rest of the previous one first"
                        );
                        if let Flow::Stop = self.drain(name, &old, previous).await? {
                            return Ok(Polled::Stop);
                        }
                    }
                    (Some(previous), None) => tracing::warn!(
                        file = %path.display(),
                        previous = %previous.path.display(),
                        offset = previous.offset,
                        "a new file under the name, and the previous one is gone"
                    ),
                    (None, _) => {}
                }
                tracing::info!(file = %path.display(), "reading from the start");
                self.save(name, new).await?;
                Ok(Polled::Busy)
            }
            Step::Rewound { check, new } => {
                let what = match check {
                    Check::Truncated => "truncated",
                    _ => "rewritten",
                };
                tracing::warn!(
                    file = %path.display(),
                    offset = position.map_or(0, |p| p.offset),
                    "the file was {what}: reading it from the start"
                );
                self.save(name, new).await?;
                Ok(Polled::Busy)
            }
            Step::Lines { lines, position, partial, bytes_read } => {
                self.report.line_bytes_read += bytes_read;
                if let Some(partial) = partial {
                    self.keep_partial(name, &path, partial, announced);
                }
                if lines.is_empty() {
                    return Ok(Polled::Idle);
                }
                match self.apply_lines(name, &path, position, lines).await? {
                    Flow::Continue => Ok(Polled::Busy),
                    Flow::Stop => Ok(Polled::Stop),
                }
            }
        }
    }

    /// Keeps the last line of `name`'s file, which has no line break yet,
    /// for the next poll; says once when it has grown past the limit
    /// (`announced`: the start of the line already said to be).
    fn keep_partial(
        &mut self,
        name: &'static str,
        path: &Path,
        partial: PartialLine,
        announced: Option<u64>,
    ) {
        if partial.is_oversized() && announced != Some(partial.start()) {
            tracing::warn!(
                file = %path.display(),
                line = partial.number(),
                offset = partial.start(),
                "a line longer than {} bytes, not ended yet: it is read on as it grows, \
                 never held, and skipped once it ends",
                self.config.max_line_bytes
            );
        }
        self.partials.insert(name, partial);
    }

    /// Reads the rest of a file that is no longer under the followed name
    /// (rotated away, or an earlier session's), to its very end.
    async fn drain(
        &mut self,
        name: &'static str,
        old: &Path,
        mut position: Position,
    ) -> Result<Flow, IngestError> {
        loop {
            let lines = {
                let (old, from) = (old.to_owned(), position.clone());
                let (max_lines, max_bytes) =
                    (self.config.max_batch_lines, self.config.max_line_bytes);
                blocking(move || -> std::io::Result<Option<LinesRead>> {
                    let mut file = File::open(&old)?;
                    let (id, len) = FileId::of(&file)?;
                    if from.check(&mut file, id, len)? != Check::Same {
                        return Ok(None);
                    }
                    read_lines(&mut file, &from, max_lines, max_bytes, true, None).map(Some)
                })
                .await
            };
            let lines = match lines {
                Ok(Some(read)) if !read.lines.is_empty() => {
                    self.report.line_bytes_read += read.bytes_read;
                    read.lines
                }
                Ok(_) => return Ok(Flow::Continue),
                Err(err) => {
                    tracing::warn!(file = %old.display(), error = %err, "the previous file cannot be read any more");
                    return Ok(Flow::Continue);
                }
            };
            if let Flow::Stop = self.apply_lines(name, old, position, lines).await? {
                return Ok(Flow::Stop);
            }
            position = self.positions.files[name].clone();
        }
    }

    /// Handles `lines`, read from `position` on, in order, then saves the
    /// position after the last one handled.
    async fn apply_lines(
        &mut self,
        name: &'static str,
        file: &Path,
        mut position: Position,
        lines: Vec<Line>,
    ) -> Result<Flow, IngestError> {
        let mut flow = Flow::Continue;
        for line in &lines {
            if self.stopped() {
                flow = Flow::Stop;
                break;
            }
            flow = self.handle_line(file, line).await?;
            if let Flow::Stop = flow {
                break;
            }
            position.offset = line.end;
            position.line = line.number;
        }
        self.save(name, position).await?;
        Ok(flow)
    }

    /// Makes `position` the one of `name`, and saves every position.
    async fn save(&mut self, name: &'static str, position: Position) -> Result<(), IngestError> {
        let path = self.config.position_file.clone();
        let mut positions = self.positions.clone();
        positions.files.insert(name.to_owned(), position);
        self.positions = blocking(move || positions.save(&path).map(|()| positions))
            .await
            .map_err(|e| IngestError::Position {
                path: self.config.position_file.clone(),
                reason: format!("cannot write it: {e}"),
            })?;
        Ok(())
    }

    async fn handle_line(&mut self, file: &Path, line: &Line) -> Result<Flow, IngestError> {
        let Some(bytes) = &line.bytes else {
            tracing::warn!(
                file = %file.display(),
                line = line.number,
                offset = line.start,
                "skipping a line longer than {} bytes",
                self.config.max_line_bytes
            );
            self.report.malformed += 1;
            return Ok(Flow::Continue);
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Flow::Continue);
        }
        match decode_line(bytes) {
            Err(error) => {
                tracing::warn!(
                    file = %file.display(),
                    line = line.number,
                    offset = line.start,
                    %error,
                    "skipping a malformed line"
                );
                self.report.malformed += 1;
                Ok(Flow::Continue)
            }
            Ok(Decoded::Other { source_type }) => {
                tracing::debug!(line = line.number, %source_type, "not a Train event");
                self.report.other += 1;
                Ok(Flow::Continue)
            }
            Ok(Decoded::Train { event_id, at_ms, event }) => {
                let write = match event {
                    ExportEvent::Run(run) => Write::Run(*run),
                    ExportEvent::Attempt(attempt) => {
                        let amended = self.with_node_deaths(&attempt);
                        Write::Attempt(amended.unwrap_or(*attempt))
                    }
                };
                self.apply(file, line, &event_id, &write, at_ms).await
            }
            Ok(Decoded::Death { event_id, at_ms, death }) => {
                self.report.deaths += 1;
                self.on_death(file, line, &event_id, at_ms, death).await
            }
        }
    }

    /// Ends the live runs a death concerns, and adds a node's death to the
    /// attempts that had workers on it.
    async fn on_death(
        &mut self,
        file: &Path,
        line: &Line,
        event_id: &str,
        at_ms: Option<u64>,
        death: Death,
    ) -> Result<Flow, IngestError> {
        if let Flow::Stop = self.seed().await? {
            return Ok(Flow::Stop);
        }
        let mut writes = Vec::new();
        let at_ms = match death {
            Death::Node { node_id, address, end_time_ms, death } => {
                tracing::info!(node = %node_id, %address, reason = death.reason, "Ray reports a node dead");
                self.note_dead_node(node_id, address, death);
                let amended: Vec<_> =
                    self.attempts.iter().filter_map(|a| self.with_node_deaths(a)).collect();
                writes.extend(amended.into_iter().map(Write::Attempt));
                end_time_ms.or(at_ms)
            }
            Death::Actor { actor_id, job_id: _, class_name, reason, message, node } => {
                let kind = match reason {
                    Some("RAY_KILL") => CauseKind::UserInterrupt,
                    _ => CauseKind::SystemError,
                };
                let mut words = format!(
                    "Ray reports the run's controller (actor {actor_id}{}) dead{}",
                    if class_name.is_empty() { String::new() } else { format!(", {class_name}") },
                    reason.map_or(String::new(), |r| format!(" ({r})")),
                );
                if !message.is_empty() {
                    words.push_str(": ");
                    words.push_str(first_chars(message.trim_end(), MAX_RAY_WORDS));
                }
                if let Some(node) = node
                    && message.is_empty()
                {
                    words.push_str(&format!(": its node died ({})", node_words(&node)));
                }
                let ids: Vec<String> = self
                    .live
                    .iter()
                    .filter(|(_, run)| run.controller_actor_id == actor_id)
                    .map(|(id, _)| id.clone())
                    .collect();
                writes.extend(ids.iter().filter_map(|id| self.end(id, kind, &words, at_ms)));
                at_ms
            }
            Death::Job { job_id, start_time_ms, end_time_ms, driver_pid, entrypoint } => {
                let words = format!(
                    "Ray reports the run's driver job {job_id}{} ended while the run was live: \
                     its controller can report nothing more{}",
                    driver_pid.map_or(String::new(), |pid| format!(" (driver pid {pid})")),
                    if entrypoint.is_empty() {
                        String::new()
                    } else {
                        format!(" (the driver ran `{}`)", first_chars(&entrypoint, 256))
                    },
                );
                // Ray numbers jobs from 01000000 again on every cluster: a
                // run of an earlier cluster's job of the same id started
                // before this job did.
                let ids: Vec<String> = self
                    .live
                    .iter()
                    .filter(|(_, run)| run.job_id == job_id)
                    .filter(|(_, run)| start_time_ms.is_none_or(|s| run.start_time_ms >= s))
                    .map(|(id, _)| id.clone())
                    .collect();
                let at = end_time_ms.or(at_ms);
                writes.extend(
                    ids.iter().filter_map(|id| self.end(id, CauseKind::SystemError, &words, at)),
                );
                at
            }
        };
        for write in writes {
            let ends = matches!(write, Write::End { .. });
            if let Flow::Stop = self.apply(file, line, event_id, &write, at_ms).await? {
                return Ok(Flow::Stop);
            }
            if ends && !self.live.contains_key(write.run_id()) {
                tracing::info!(
                    run_id = write.run_id(),
                    event_id,
                    "ended the run: Ray reports it dead"
                );
                self.report.ended += 1;
            }
        }
        Ok(Flow::Continue)
    }

    /// The write that ends the live run `id` for a death at `at_ms`, said in
    /// `words` (with the deaths of the nodes of its workers).
    fn end(&self, id: &str, kind: CauseKind, words: &str, at_ms: Option<u64>) -> Option<Write> {
        let run = self.live.get(id)?;
        let mut detail = words.to_owned();
        // The dead node of the lowest rank says what the machine did.
        let mut lost: Option<(u32, CauseKind)> = None;
        for (node_id, _, rank) in &run.nodes {
            if let Some((address, death)) = self.dead_nodes.get(node_id) {
                detail.push_str(&format!(
                    "\nRay reports node {node_id} ({address}), where the run had workers, dead: {}",
                    node_words(death)
                ));
                if let Some(node_kind) = node_death_kind(death.reason)
                    && lost.is_none_or(|(first, _)| *rank < first)
                {
                    lost = Some((*rank, node_kind));
                }
            }
        }
        let mut update = StatusUpdate::aborted(kind, detail);
        // A death Ray gives no closer reason for (not a person's kill) is
        // the node's, when one of the run's nodes died: its rank failed.
        if let Some((rank, node_kind)) = lost
            && kind == CauseKind::SystemError
        {
            update.cause = Some(RunCause::new(node_kind, Some(rank)));
        }
        if let Some(at) = at_ms {
            // Never before the run's current attempt started: Ray's times
            // of events are in whole seconds.
            let end = at.max(run.current_start_ms).max(run.start_time_ms);
            update = update.ended_at(end).at(Some(end));
        }
        Some(Write::End { id: RunId::parse(id).ok()?, update })
    }

    fn note_dead_node(&mut self, node_id: String, address: String, death: NodeDeath) {
        if self.dead_nodes.insert(node_id.clone(), (address, death)).is_none() {
            self.dead_order.push_back(node_id);
            while self.dead_order.len() > REMEMBERED_NODES {
                if let Some(oldest) = self.dead_order.pop_front() {
                    self.dead_nodes.remove(&oldest);
                }
            }
        }
    }

    /// `attempt` with the deaths of the nodes it had workers on added to
    /// its detail, one line each; `None` when that changes nothing (a
    /// finished attempt is left alone).
    fn with_node_deaths(
        &self,
        attempt: &ray_v2::TrainRunAttempt,
    ) -> Option<ray_v2::TrainRunAttempt> {
        if attempt.status == AttemptStatus::Finished || self.dead_nodes.is_empty() {
            return None;
        }
        let mut detail = attempt.status_detail.clone().unwrap_or_default();
        let before = detail.len();
        let mut seen = Vec::new();
        for worker in &attempt.workers {
            if seen.contains(&&worker.node_id) {
                continue;
            }
            seen.push(&worker.node_id);
            let Some((address, death)) = self.dead_nodes.get(&worker.node_id) else { continue };
            let sentence = format!(
                "Ray reports node {} ({address}), where this attempt had workers, dead: {}",
                worker.node_id,
                node_words(death)
            );
            if !detail.contains(&sentence) {
                if !detail.is_empty() {
                    detail.push('\n');
                }
                detail.push_str(&sentence);
            }
        }
        (detail.len() != before).then(|| {
            let mut amended = attempt.clone();
            amended.status_detail = Some(detail);
            amended
        })
    }

    /// Lists the head's live runs once, before the first death is handled,
    /// so that runs written before a restart of the ingester are known.
    async fn seed(&mut self) -> Result<Flow, IngestError> {
        if self.seeded {
            return Ok(Flow::Continue);
        }
        let mut backoff = self.config.first_backoff;
        let mut query = RunQuery::new().statuses([RunStatus::Running]).limit(1000);
        loop {
            match self.handle.list(query.clone()).await {
                Ok(page) => {
                    for run in &page.runs {
                        self.watch(run);
                    }
                    match page.next_cursor {
                        Some(cursor) => query = query.after(cursor),
                        None => break,
                    }
                }
                Err(error) => match disposition(&error) {
                    Disposition::Fatal => {
                        return Err(IngestError::Unauthorized { reason: error.to_string() });
                    }
                    Disposition::Retry | Disposition::Misdirected => {
                        tracing::warn!(%error, retry_in = ?backoff, "cannot list the head's live runs now");
                        if !self.wait(backoff).await {
                            return Ok(Flow::Stop);
                        }
                        backoff = (backoff * 2).min(self.config.max_backoff);
                    }
                    _ => {
                        tracing::warn!(%error, "cannot list the head's live runs: deaths concern only the runs written from now on");
                        break;
                    }
                },
            }
        }
        self.seeded = true;
        Ok(Flow::Continue)
    }

    /// Notes a run as the head answered it: live, with what a death is
    /// matched by, or ended.
    fn watch(&mut self, document: &RunDocument) {
        let run = match document.parse() {
            Ok(run) => run,
            Err(error) => {
                tracing::debug!(%error, "cannot read a run the head answered");
                return;
            }
        };
        let id = run.id().as_str().to_owned();
        if run.status().is_terminal() {
            self.live.remove(&id);
            return;
        }
        let mut nodes: Vec<(String, String, u32)> = run
            .workers()
            .iter()
            .map(|w| (w.node_id().to_owned(), w.node_ip().to_owned(), w.world_rank()))
            .collect();
        // By node, its lowest rank first: one entry a node, of that rank.
        nodes.sort();
        nodes.dedup_by(|later, first| later.0 == first.0);
        let watched = Watched {
            job_id: run.job_id().to_owned(),
            controller_actor_id: run.controller_actor_id().to_owned(),
            start_time_ms: run.start_time_ms(),
            current_start_ms: run
                .attempts()
                .last()
                .map_or(run.start_time_ms(), |a| a.start_time_ms()),
            nodes,
        };
        self.live.insert(id, watched);
    }

    fn remember(&mut self, attempt: &ray_v2::TrainRunAttempt) {
        self.attempts
            .retain(|a| !(a.run_id == attempt.run_id && a.attempt_id == attempt.attempt_id));
        self.attempts.push_back(attempt.clone());
        if self.attempts.len() > REMEMBERED_ATTEMPTS {
            self.attempts.pop_front();
        }
    }

    /// Applies one write, as changed at `at_ms` (Ray's time of the event),
    /// sending it again while the head cannot take it.
    async fn apply(
        &mut self,
        file: &Path,
        line: &Line,
        event_id: &str,
        event: &Write,
        at_ms: Option<u64>,
    ) -> Result<Flow, IngestError> {
        let mut backoff = self.config.first_backoff;
        let mut failures = 0_u32;
        loop {
            let result = match event {
                Write::Run(run) => self.handle.upsert_ray_run_at(run.clone(), at_ms).await,
                Write::Attempt(attempt) => {
                    self.handle.upsert_ray_attempt_at(attempt.clone(), at_ms).await
                }
                Write::End { id, update } => {
                    self.handle.set_status(id.clone(), update.clone()).await
                }
            };
            if let Ok(document) = &result {
                self.watch(document);
                if let Write::Attempt(attempt) = event {
                    self.remember(attempt);
                }
            }
            let error = match result.map(drop) {
                Ok(()) => {
                    if failures > 0 {
                        tracing::info!(line = line.number, "the head took the event");
                    }
                    self.report.applied += 1;
                    return Ok(Flow::Continue);
                }
                Err(error) => error,
            };
            match disposition(&error) {
                Disposition::Fatal => {
                    return Err(IngestError::Unauthorized { reason: error.to_string() });
                }
                Disposition::Stale => {
                    tracing::info!(
                        file = %file.display(),
                        line = line.number,
                        offset = line.start,
                        event_id,
                        run_id = event.run_id(),
                        %error,
                        "the run has moved past this event: skipping it"
                    );
                    self.report.stale += 1;
                    return Ok(Flow::Continue);
                }
                Disposition::Skip => {
                    tracing::warn!(
                        file = %file.display(),
                        line = line.number,
                        offset = line.start,
                        event_id,
                        run_id = event.run_id(),
                        %error,
                        "the head refused an event: skipping it"
                    );
                    self.report.rejected += 1;
                    return Ok(Flow::Continue);
                }
                Disposition::Misdirected => {
                    // At the first few, then about once a minute at most.
                    if failures.is_power_of_two() || failures.is_multiple_of(12) {
                        tracing::error!(
                            file = %file.display(),
                            line = line.number,
                            offset = line.start,
                            head = self.handle.name(),
                            %error,
                            retry_in = ?backoff,
                            "the head's URL reaches no route: the event is kept and sent again, \
                             never skipped; fix the URL (--url) or the proxy and restart"
                        );
                    }
                    failures = failures.saturating_add(1);
                    if !self.wait(backoff).await {
                        return Ok(Flow::Stop);
                    }
                    backoff = (backoff * 2).min(self.config.max_backoff);
                }
                Disposition::Retry => {
                    if failures == 0 || failures.is_power_of_two() {
                        tracing::warn!(
                            file = %file.display(),
                            line = line.number,
                            offset = line.start,
                            %error,
                            retry_in = ?backoff,
                            "the head cannot take an event now: sending it again"
                        );
                    }
                    failures = failures.saturating_add(1);
                    if !self.wait(backoff).await {
                        return Ok(Flow::Stop);
                    }
                    backoff = (backoff * 2).min(self.config.max_backoff);
                }
            }
        }
    }
}

enum Disposition {
    /// Send the event again later.
    Retry,
    /// The URL reaches no route of a head (a proxy's prefix, a typo, a
    /// head without the route): nothing is known of the event, so it is
    /// sent again later, never skipped.
    Misdirected,
    /// The head refuses the event itself: skip it.
    Skip,
    /// The head has a later state of the run: skip the event.
    Stale,
    /// The head refuses the ingester: stop.
    Fatal,
}

/// What to do about an event the head did not take. Only what the event
/// itself is refused for is skipped; anything the head may take later
/// (down, busy, slow, failing, not serving the route yet, a URL that
/// reaches no route) is retried, so no event is skipped for the head's
/// sake or the URL's.
fn disposition(error: &StateError) -> Disposition {
    match error {
        StateError::NoSuchRoute { .. } => Disposition::Misdirected,
        StateError::IllegalTransition { .. } => Disposition::Stale,
        StateError::NotFound { .. } | StateError::Conflict { .. } | StateError::Invalid { .. } => {
            Disposition::Skip
        }
        StateError::Unauthorized { .. } | StateError::Forbidden { .. } => Disposition::Fatal,
        _ => Disposition::Retry,
    }
}

/// Where `path` stands with respect to `position`, and the next lines.
fn step(
    path: &Path,
    position: Option<&Position>,
    partial: Option<PartialLine>,
    max_lines: usize,
    max_line_bytes: usize,
) -> std::io::Result<Step> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Step::Missing),
        Err(e) => return Err(e),
    };
    let (id, len) = FileId::of(&file)?;
    let start = || {
        let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        Position::start(resolved, id)
    };
    let Some(position) = position else {
        return Ok(Step::Replaced { new: start(), old: None });
    };
    match position.check(&mut file, id, len)? {
        Check::Same => {}
        Check::Replaced => return Ok(Step::Replaced { new: start(), old: find_old(position) }),
        check => return Ok(Step::Rewound { check, new: start() }),
    }
    let read = read_lines(&mut file, position, max_lines, max_line_bytes, false, partial)?;
    let mut position = position.clone();
    position.extend_fingerprint(&mut file, len)?;
    Ok(Step::Lines {
        lines: read.lines,
        position,
        partial: read.partial,
        bytes_read: read.bytes_read,
    })
}

/// Where the file `position` is in is now, if it still exists: under its
/// own path (an earlier session's directory) or rotated beside it
/// (`….log.1`, `….log.2`, ...).
fn find_old(position: &Position) -> Option<PathBuf> {
    let name = position.path.file_name()?.to_str()?;
    let dir = position.path.parent()?;
    let rotated =
        std::fs::read_dir(dir).ok()?.filter_map(Result::ok).map(|e| e.path()).filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix(name))
                .is_some_and(|suffix| suffix.starts_with('.'))
        });
    std::iter::once(position.path.clone()).chain(rotated).find(|candidate| {
        let is_it = || -> std::io::Result<bool> {
            let mut file = File::open(candidate)?;
            let (id, len) = FileId::of(&file)?;
            Ok(position.check(&mut file, id, len)? == Check::Same)
        };
        is_it().unwrap_or(false)
    })
}

/// The cause of a run whose node died for Ray's `reason`: a node the
/// autoscaler drained (for a preemption, or as idle) was taken back by
/// the scheduler, `PREEMPTED`; one that died unexpectedly was lost,
/// `NODE_LOST`. An expected termination (`ray stop`) or no reason says
/// nothing closer than the death that ended the run.
pub(crate) fn node_death_kind(reason: &str) -> Option<CauseKind> {
    match reason {
        "AUTOSCALER_DRAIN_PREEMPTED" | "AUTOSCALER_DRAIN_IDLE" => Some(CauseKind::Preempted),
        "UNEXPECTED_TERMINATION" => Some(CauseKind::NodeLost),
        _ => None,
    }
}

/// A node's death in words: `UNEXPECTED_TERMINATION: health check failed ...`.
fn node_words(death: &NodeDeath) -> String {
    let message = first_chars(death.message.trim(), MAX_RAY_WORDS);
    if message.is_empty() {
        death.reason.to_owned()
    } else {
        format!("{}: {message}", death.reason)
    }
}
