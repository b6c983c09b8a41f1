//! The size of runs: a large run (item 2), a run's attempts (item 3, the
//! run's part) and retention by bytes (item 6, retention). See
//! docs/reliability.md.
//!
//! Measured on a loaded 2-core machine, debug build (`N=65536`, a run of
//! 65,536 workers on 65,536 nodes, 14.6 MB of JSON, SQLite store), before
//! and after the fix:
//!
//! | step | before | after |
//! |---|---|---|
//! | register | > 300 s (never finished) | 2.7–6.6 s |
//! | repeat | (not reached) | 0.5–1.0 s |
//! | restart (load) | (not reached) | 3.5–6.0 s |
//! | a status change (the run re-read, re-validated, re-serialized) | (not reached) | 10.8 s |
//!
//! With 8,192 nodes, before: register 2.75 s, repeat 0.49 s, restart
//! 2.56 s; after: 0.39 s, 0.27 s, 0.30 s. The deadline of each step below
//! is over ten times the slowest figure after: only a step quadratic in the
//! run's size (or a hang) blows it.

use std::time::Duration;

use trainstate_actor::{Retention, StateConfig, launch_state_actor};
use trainstate_client::{NewAttempt, RunQuery, StateError, StatusUpdate};
use trainstate_schema::api::ErrorCode;
use trainstate_schema::limits::{MAX_ATTEMPT_HISTORY_BYTES, MAX_RUN_BYTES};
use trainstate_schema::{
    ActorStatus, Resources, RunId, RunStatus, TrainRunInfo, TrainRunInfoDraft, TrainWorkerInfo,
    TrainWorkerInfoDraft,
};

use crate::common::unique_name;

const T0: u64 = 1_760_000_000_000;

/// An upper deadline for one step on a 65,536-worker run: it ends a test
/// that went quadratic, it measures nothing.
const STEP: Duration = Duration::from_secs(120);

/// `n` workers, one per node, with a log path of `log_len` characters.
fn spread_workers(n: u32, prefix: &str, log_len: usize) -> Vec<TrainWorkerInfo> {
    let log = (log_len > 0).then(|| format!("/{}", "l".repeat(log_len - 1)));
    (0..n)
        .map(|rank| {
            TrainWorkerInfoDraft {
                actor_id: format!("{prefix}actor{rank}"),
                world_rank: rank,
                local_rank: 0,
                node_rank: rank,
                node_id: format!("{prefix}node{rank}"),
                node_ip: format!("10.{}.{}.{}", rank >> 16, (rank >> 8) & 255, rank & 255),
                pid: 1000 + rank,
                gpu_ids: vec![0],
                status: ActorStatus::Alive,
                resources: Resources::from_iter([("CPU", 1.0), ("GPU", 1.0)]),
                worker_log_file_path: log.clone(),
                node_name: None,
            }
            .validate()
            .unwrap()
        })
        .collect()
}

fn run_of(id: &RunId, start_ms: u64, workers: Vec<TrainWorkerInfo>) -> TrainRunInfo {
    TrainRunInfoDraft {
        workers: workers.into_iter().map(TrainWorkerInfo::into_draft).collect(),
        ..TrainRunInfoDraft::new(id.to_string(), "big", "job1", "controller", start_ms)
    }
    .validate()
    .unwrap()
}

async fn within<T>(what: &str, step: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(STEP, step)
        .await
        .unwrap_or_else(|_| panic!("{what} took more than {STEP:?}: not linear in the run's size"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_run_of_65536_workers_on_65536_nodes_registers_repeats_and_restarts_in_linear_time()
 {
    const N: u32 = 65_536;
    let dir = tempfile::tempdir().unwrap();
    let name = unique_name("size.large");
    let config = || StateConfig::sqlite(dir.path().join("runs.db")).with_name(name.clone());
    let service = within("start", launch_state_actor(config())).await.unwrap();
    let state = service.handle().with_timeout(STEP);
    let id = RunId::new_v7();
    let run = run_of(&id, T0, spread_workers(N, "", 0));

    let registered = within("register", state.register(run.clone())).await.unwrap();
    assert!(registered.created);
    let read = within("read", state.get_run(id.clone())).await.unwrap();
    assert_eq!(read.workers().len(), N as usize);
    assert_eq!(read.workers()[N as usize - 1].node_id(), "node65535");
    let repeat = within("repeat", state.register(run.clone())).await.unwrap();
    assert!(!repeat.created, "a repeat of the same registration changes nothing");
    // The node index holds every node: the last one finds the run.
    let by_node = within("list", state.list(RunQuery::all().node_id("node65535"))).await.unwrap();
    assert_eq!(by_node.runs.len(), 1);
    let body = read_body(&state, &id).await;
    service.shutdown().await;

    let service = within("restart", launch_state_actor(config())).await.unwrap();
    let state = service.handle().with_timeout(STEP);
    assert_eq!(read_body(&state, &id).await, body, "the run reads back as it was stored");
    let repeat = within("repeat after restart", state.register(run.clone())).await.unwrap();
    assert!(!repeat.created);
    let by_ip = within("list", state.list(RunQuery::all().node_ip("10.0.255.255"))).await.unwrap();
    assert_eq!(by_ip.runs.len(), 1, "the node index is rebuilt at load");
    // A write that changes the run: parsed, changed, serialized, linearly.
    let resizing = StatusUpdate::live(RunStatus::Resizing, "growing");
    let changed = within("status change", state.set_status(id.clone(), resizing)).await.unwrap();
    assert!(changed.body().contains("\"RESIZING\""));
    // A different first worker group is still told apart, naming the field.
    let mut other = run.clone().into_draft();
    other.workers[N as usize - 1].actor_id = "another actor".into();
    let other = other.validate().unwrap();
    let err = within("conflict", state.register(other)).await.unwrap_err();
    assert!(
        matches!(&err, StateError::Conflict { reason, .. } if reason.contains("different workers")),
        "{err}"
    );
    service.shutdown().await;
}

async fn read_body(state: &trainstate_client::StateHandle, id: &RunId) -> String {
    within("read", state.get(id.clone())).await.unwrap().body().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_fourteen_attempts_of_2000_workers_keep_the_runs_stored_size_bounded() {
    const WORKERS: u32 = 2_000;
    const ATTEMPTS: usize = 14;
    let dir = tempfile::tempdir().unwrap();
    let name = unique_name("size.attempts");
    let config = || StateConfig::sqlite(dir.path().join("runs.db")).with_name(name.clone());
    let service = launch_state_actor(config()).await.unwrap();
    let state = service.handle().with_timeout(STEP);
    let id = RunId::new_v7();
    // About 1.3 KB of JSON a worker: 2.6 MB a worker group.
    let first = run_of(&id, T0, spread_workers(WORKERS, "a0.", 1_000));
    state.register(first.clone()).await.unwrap();
    let group_bytes = serde_json::to_string(first.workers()).unwrap().len();

    let mut sizes = vec![read_body(&state, &id).await.len()];
    for attempt in 1..=ATTEMPTS {
        let workers = spread_workers(WORKERS, &format!("a{attempt}."), 1_000);
        let next = NewAttempt::new(attempt.to_string(), T0 + attempt as u64, workers);
        state.start_attempt(id.clone(), next).await.unwrap();
        sizes.push(read_body(&state, &id).await.len());
    }
    // The current group, the first, and at most MAX_ATTEMPT_HISTORY_BYTES
    // of the others; without a bound the run would hold all 15 groups.
    let bound = 2 * group_bytes + MAX_ATTEMPT_HISTORY_BYTES + 256 * 1024;
    assert!(bound < (ATTEMPTS + 1) * group_bytes);
    let last = *sizes.last().unwrap();
    assert!(
        last <= bound,
        "after {ATTEMPTS} attempts of {WORKERS} workers ({group_bytes} bytes each) the run takes \
         {last} bytes; sizes {sizes:?}"
    );
    assert!(sizes.iter().all(|&s| s <= MAX_RUN_BYTES));
    // Once the history is full, each attempt keeps the size where it is.
    let steady = sizes[ATTEMPTS - 1].abs_diff(last);
    assert!(steady < group_bytes / 10, "sizes {sizes:?}");

    let run = state.get_run(id.clone()).await.unwrap();
    let attempts = run.attempts();
    assert_eq!(attempts.len(), ATTEMPTS + 1);
    // The first group is static metadata: always kept.
    assert_eq!(attempts[0].workers().map(<[_]>::len), Some(WORKERS as usize));
    assert_eq!(attempts[0].dropped_workers(), None);
    let dropped: Vec<usize> =
        (1..ATTEMPTS).filter(|&i| attempts[i].dropped_workers().is_some()).collect();
    let kept: Vec<usize> =
        (1..ATTEMPTS).filter(|&i| attempts[i].dropped_workers().is_none()).collect();
    assert!(!dropped.is_empty() && !kept.is_empty(), "dropped {dropped:?}, kept {kept:?}");
    assert!(dropped.iter().max() < kept.iter().min(), "the oldest lists are dropped first");
    for &i in &dropped {
        assert_eq!(attempts[i].dropped_workers(), Some(WORKERS));
        assert_eq!(attempts[i].workers().map(<[_]>::len), Some(0));
        assert_eq!(attempts[i].attempt_id(), i.to_string(), "the attempt itself is kept");
        assert!(attempts[i].end_time_ms().is_some());
    }
    for &i in &kept {
        assert_eq!(attempts[i].workers().map(<[_]>::len), Some(WORKERS as usize));
    }
    assert_eq!(run.workers()[0].actor_id(), format!("a{ATTEMPTS}.actor0"));

    // A repeated registration is still recognised, the attempt too.
    assert!(!state.register(first).await.unwrap().created);
    let current = spread_workers(WORKERS, &format!("a{ATTEMPTS}."), 1_000);
    let again = NewAttempt::new(ATTEMPTS.to_string(), T0 + ATTEMPTS as u64, current);
    state.start_attempt(id.clone(), again).await.unwrap();
    assert_eq!(read_body(&state, &id).await.len(), last);
    // Ending the run keeps the bound; the store gives back what it took.
    state.set_status(id.clone(), StatusUpdate::finished().ended_at(T0 + 100)).await.unwrap();
    let ended = read_body(&state, &id).await;
    assert!(ended.len() <= bound);
    service.shutdown().await;
    let service = launch_state_actor(config()).await.unwrap();
    assert_eq!(read_body(&service.handle(), &id).await, ended);
    service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_run_over_the_size_limit_is_refused_naming_the_field() {
    let service = launch_state_actor(StateConfig::in_memory().with_name(unique_name("size.limit")))
        .await
        .unwrap();
    let state = service.handle().with_timeout(STEP);
    // 24,000 workers with 4,096-character log paths: about 104 MB of JSON.
    let huge = spread_workers(24_000, "", 4_096);

    let id = RunId::new_v7();
    let err = state.register(run_of(&id, T0, huge.clone())).await.unwrap_err();
    let body = err.to_error_body();
    assert_eq!(body.code, ErrorCode::Invalid, "{err}");
    assert_eq!(body.field.as_deref(), Some("workers"), "{err}");
    assert!(body.message.contains(&format!("at most {MAX_RUN_BYTES} bytes")), "{err}");
    assert!(matches!(state.get(id).await, Err(StateError::NotFound { .. })), "nothing stored");

    // A new attempt that would make a stored run too large changes nothing.
    let id = RunId::new_v7();
    state.register(run_of(&id, T0, spread_workers(4, "", 0))).await.unwrap();
    let before = read_body(&state, &id).await;
    let err =
        state.start_attempt(id.clone(), NewAttempt::new("1", T0 + 1, huge)).await.unwrap_err();
    let body = err.to_error_body();
    assert_eq!((body.code, body.field.as_deref()), (ErrorCode::Invalid, Some("workers")));
    assert_eq!(read_body(&state, &id).await, before);
    let run = state.get_run(id).await.unwrap();
    assert_eq!(run.attempts().len(), 1);
    service.shutdown().await;
}

#[tokio::test]
async fn regression_retention_by_bytes_evicts_the_oldest_ended_runs_first() {
    let ended = |start: u64| {
        let id = RunId::new_v7();
        let draft = TrainRunInfoDraft {
            run_status: RunStatus::Finished,
            end_time_ms: Some(start + 10),
            ..run_of(&id, start, spread_workers(100, "", 200)).into_draft()
        };
        draft.validate().unwrap()
    };
    let probe = ended(T0);
    let one = serde_json::to_string(&probe).unwrap().len() as u64;
    // Room for three ended runs of this size, not four; any number of runs.
    let retention = Retention::max_runs(1_000).with_max_bytes(3 * one + one / 2);
    let config =
        StateConfig::in_memory().with_name(unique_name("size.retention")).with_retention(retention);
    let service = launch_state_actor(config).await.unwrap();
    let state = service.handle();
    let ids = |page: trainstate_client::RunPage| -> Vec<String> {
        let mut ids: Vec<String> =
            page.runs.iter().map(|r| r.parse().unwrap().id().to_string()).collect();
        ids.sort();
        ids
    };
    let sorted = |runs: &[&TrainRunInfo]| -> Vec<String> {
        let mut ids: Vec<String> = runs.iter().map(|r| r.id().to_string()).collect();
        ids.sort();
        ids
    };

    // Registered out of order: eviction goes by start time, not arrival.
    // The run starting at 0 comes when 1, 3 and 4 fill the bound: older
    // than all of them, its own commit would evict it, so it is refused
    // (409) and nothing is stored (issue 10, item 10).
    let runs: Vec<TrainRunInfo> = [3, 1, 4, 0, 2].iter().map(|i| ended(T0 + i * 1_000)).collect();
    for run in &runs {
        let answer = state.register(run.clone()).await;
        if run.start_time_ms() == T0 {
            assert!(matches!(answer, Err(StateError::Conflict { .. })), "{answer:?}");
        } else {
            answer.unwrap();
        }
    }
    let by_start = |i: u64| runs.iter().find(|r| r.start_time_ms() == T0 + i * 1_000).unwrap();
    let kept = ids(state.list(RunQuery::all()).await.unwrap());
    assert_eq!(kept, sorted(&[by_start(2), by_start(3), by_start(4)]), "the three newest stay");

    // A live run is never evicted, so one larger than the bound is refused
    // (round three: the bytes of live runs are bounded too, by default by
    // the same bound), and nothing of it is kept.
    let too_large = run_of(&RunId::new_v7(), T0, spread_workers(500, "", 200));
    let err = state.register(too_large).await.unwrap_err();
    assert!(matches!(err, StateError::Unavailable { .. }), "{err}");
    assert!(err.to_string().contains("--max-live-bytes"), "{err}");
    let kept = ids(state.list(RunQuery::all()).await.unwrap());
    assert_eq!(kept, sorted(&[by_start(2), by_start(3), by_start(4)]), "nothing was stored");
    // One that fits the bound alone is taken: ended ones go first.
    let live_id = RunId::new_v7();
    let live = run_of(&live_id, T0, spread_workers(300, "", 200));
    state.register(live.clone()).await.unwrap();
    let kept = ids(state.list(RunQuery::all()).await.unwrap());
    assert_eq!(kept, sorted(&[&live]), "only the live run fits; it stays");
    // An ended run past the bound would go at once: it is refused instead.
    let newer = ended(T0 + 10_000);
    let answer = state.register(newer.clone()).await;
    assert!(matches!(answer, Err(StateError::Conflict { .. })), "{answer:?}");
    let kept = ids(state.list(RunQuery::all()).await.unwrap());
    assert_eq!(kept, sorted(&[&live]), "nothing of the refused run is kept");
    service.shutdown().await;
}
