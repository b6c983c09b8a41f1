//! Size limits of the wire format.
//!
//! Every limit is generous enough for the largest training runs seen in
//! practice (32,768 workers over 4,096 nodes with 8 GPUs each) and small
//! enough that one document cannot exhaust the head's memory.

/// Longest run id, in characters. Run ids appear in URL paths.
pub const MAX_RUN_ID_LEN: usize = 128;

/// Longest name or non-run id (`job_id`, `actor_id`, `node_id`, ...), in characters.
pub const MAX_NAME_LEN: usize = 1_024;

/// Longest file path (log file paths), in characters.
pub const MAX_PATH_LEN: usize = 4_096;

/// Longest error trace kept in a `status_detail`, in characters.
///
/// Ray keeps the last 50,000 characters of a worker's traceback.
pub const MAX_TRACE_LEN: usize = 50_000;

/// Longest `status_detail`, in characters: Ray's
/// `Rank {r} worker raised an error. \n` prefix plus a trace of
/// [`MAX_TRACE_LEN`] characters.
pub const MAX_STATUS_DETAIL_LEN: usize = 50_100;

/// Most workers in one run (or one attempt).
pub const MAX_WORKERS: usize = 65_536;

/// Most GPU ids on one worker.
pub const MAX_GPUS_PER_WORKER: usize = 1_024;

/// Most resource entries on one worker.
pub const MAX_RESOURCES_PER_WORKER: usize = 256;

/// Most datasets in one run.
pub const MAX_DATASETS: usize = 1_024;

/// Most attempts (worker groups) kept in one run's history.
pub const MAX_ATTEMPTS: usize = 256;

/// The most bytes of JSON one stored run may take (96 MiB): what the head
/// keeps in memory and writes in one store row for a run, far below
/// SQLite's default row limit (1,000,000,000 bytes).
///
/// A write that would make a run larger is refused (422 `invalid`, naming
/// the run's largest member and [`Rule::RunTooLarge`](crate::Rule::RunTooLarge))
/// and changes nothing. A run sent over HTTP (at most 16 MiB of body)
/// stays under it whatever its attempts, since the head bounds the worker
/// lists it keeps of ended attempts ([`MAX_ATTEMPT_HISTORY_BYTES`]).
pub const MAX_RUN_BYTES: usize = 96 * 1024 * 1024;

/// About how many bytes of JSON the worker lists of a run's ended attempts
/// may take, the first attempt's aside (16 MiB).
///
/// When a new version of a run would keep more, the head drops the worker
/// lists of the oldest ended attempts (never the first attempt's, which is
/// part of the run's static metadata, nor the current attempt's, which are
/// the run's `workers`) until the rest fits: such an attempt keeps its
/// ids, times, status and cause, its `workers` becomes `[]` and
/// `dropped_workers` says how many it had.
pub const MAX_ATTEMPT_HISTORY_BYTES: usize = 16 * 1024 * 1024;

/// Most entries of a run's `status_history`: the first change (its
/// registration) and the latest 63; the ones between are dropped.
pub const MAX_STATUS_HISTORY: usize = 64;

/// Longest `detail` of one entry of a run's `status_history`, in
/// characters: the start of the run's status detail.
pub const MAX_STATUS_CHANGE_DETAIL_LEN: usize = 256;

/// How deeply `run_settings` may nest arrays and objects.
pub const MAX_RUN_SETTINGS_DEPTH: usize = 16;

/// About how many bytes of JSON `run_settings` may take.
pub const MAX_RUN_SETTINGS_BYTES: usize = 64 * 1024;

/// The most entries of `framework_versions`.
pub const MAX_FRAMEWORK_VERSIONS: usize = 64;

/// Earliest time a client may write (Unix ms): 2000-01-01T00:00:00Z.
///
/// Times are Unix milliseconds. A time in seconds or in nanoseconds (Ray
/// Train V2's unit, `time.time_ns()`) falls outside
/// [`MIN_TIME_MS`]`..=`[`MAX_TIME_MS`] and is refused, naming the field.
pub const MIN_TIME_MS: u64 = 946_684_800_000;

/// Latest time a client may write (Unix ms): 2200-01-01T00:00:00Z.
pub const MAX_TIME_MS: u64 = 7_258_118_400_000;

/// Most metric names in one rank's progress report.
pub const MAX_METRIC_NAMES_PER_REPORT: usize = 32;

/// Longest metric name, in characters (`A-Z a-z 0-9 _ . : / -`).
pub const MAX_METRIC_NAME_LEN: usize = 128;

/// Longest `phase` of a progress report, in characters (printable ASCII).
pub const MAX_PHASE_LEN: usize = 64;

/// Most distinct metric names one run's ranks may report, all reports
/// together: a report that would bring a run past it is refused (422),
/// naming the first new name.
pub const MAX_METRIC_NAMES_PER_RUN: usize = 64;

/// Most ranks one progress report of a controller may carry
/// (`POST /api/train/runs/{id}/progress`): as many as a run has workers.
pub const MAX_PROGRESS_RANKS: usize = MAX_WORKERS;

/// The points a run keeps of each metric (per attempt, in the head's
/// memory): a longer history is decimated, every other point dropped.
pub const MAX_METRIC_POINTS: usize = 1_000;

/// The longest a rank may announce its next advance will take
/// (`expect_next_within_ms`), and the longest stall window a run may ask
/// for (`stall_after_ms`): 7 days, in ms.
pub const MAX_STALL_WINDOW_MS: u64 = 604_800_000;

/// The shortest stall window a run may ask for (`stall_after_ms`): 1 s.
pub const MIN_STALL_WINDOW_MS: u64 = 1_000;

/// The longest time per step a rank may report (`step_time_ms`): 7 days,
/// in ms.
pub const MAX_STEP_TIME_MS: u64 = 604_800_000;

/// Most entries of a run's `health_history`: the latest 32 (the oldest
/// are dropped).
pub const MAX_HEALTH_HISTORY: usize = 32;

/// Most ranks a run's `health` names as culprits, and most it names as
/// stragglers.
pub const MAX_HEALTH_RANKS: usize = 1_024;

/// Longest `detail` of a run's `health`, in characters.
pub const MAX_HEALTH_DETAIL_LEN: usize = 4_096;

/// The longest `cause.report`, in characters: one line of what the rank
/// that failed first reported.
pub const MAX_CAUSE_REPORT_LEN: usize = 1_024;

/// The largest page of runs a listing answers (`limit` of
/// `GET /api/train/runs`).
pub const MAX_PAGE_LIMIT: usize = 1_000;

/// The page size of a listing that does not name one.
pub const DEFAULT_PAGE_LIMIT: usize = 100;

/// The longest node name the node routes take, in characters: a node is
/// named by its worker's `node_name` or `node_id`, both names.
pub const MAX_NODE_NAME_LEN: usize = MAX_NAME_LEN;

/// The most runs a node's answer lists behind each of its counts, the
/// newest first.
pub const MAX_NODE_RUNS_LISTED: usize = 100;

/// The most bytes one rank's stacks keep in a capture (64 KiB); a capture
/// over it is cut at a line and says it was (`truncated`).
pub const MAX_STACK_BYTES: usize = 64 * 1024;

/// The fewest bytes one rank's stacks may keep in a capture, however many
/// ranks the run has (4 KiB): see [`MAX_CAPTURE_BYTES`].
pub const MIN_STACK_BYTES: usize = 4 * 1024;

/// The most bytes all ranks' stacks of one capture keep together (8 MiB):
/// each rank keeps at most this divided by the run's world size, between
/// [`MIN_STACK_BYTES`] and [`MAX_STACK_BYTES`].
pub const MAX_CAPTURE_BYTES: usize = 8 * 1024 * 1024;

/// The most captures a run keeps: a new one drops the oldest.
pub const MAX_CAPTURES_PER_RUN: usize = 8;

/// The shortest time between two captures that reach a run's ranks: a
/// request within it of the previous one is refused (409).
pub const MIN_CAPTURE_INTERVAL_MS: u64 = 30_000;

/// How long a capture waits for its ranks' answers: a rank that has not
/// answered by then is listed as not answering.
pub const CAPTURE_DEADLINE_MS: u64 = 20_000;

/// The longest `note` of a rank's capture (why it has no stack, or what
/// else was found).
pub const MAX_STACK_NOTE_LEN: usize = 1_024;

/// The most suspects of a stall's capture a notification names one by one
/// (`NotifyEvent.suspects`); the rest are counted (`suspects_left_out`)
/// and listed by the capture itself.
pub const MAX_NOTIFY_SUSPECTS: usize = 5;
