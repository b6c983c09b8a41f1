//! The manager's deadlines, retries and heartbeats, on paused Tokio time.
//!
//! Every timer of the manager is a Tokio timer, so these tests run on
//! paused time (`start_paused`): time moves only when every task waits, to
//! the next timer, and a call that must return at its deadline returns at
//! exactly that instant, however loaded the machine. The heads here are
//! ractor actors in the test's runtime (a real head's store thread would
//! let paused time run ahead of it): one that never answers, and one that
//! answers at once and counts heartbeats.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;
use trainstate_client::{Registration, RunDocument, StateHandle, StateMessage};
use trainstate_manager::{Delivery, ManagerError, RunRegistration, TrainRunStateManager};
use trainstate_schema::{RunId, TrainRunInfo};

use crate::common::{FakeGroup, T0, quick, unique_name};

/// A head run by the test: silent (holds every request unanswered) or
/// answering every write at once.
struct ScriptedHead;

struct Script {
    answer: bool,
    lease: Duration,
    heartbeats: Arc<AtomicUsize>,
    runs: HashMap<RunId, TrainRunInfo>,
    /// Requests a silent head holds: their callers hear nothing.
    held: Vec<StateMessage>,
}

impl Actor for ScriptedHead {
    type Msg = StateMessage;
    type State = Script;
    type Arguments = Script;

    async fn pre_start(
        &self,
        _myself: ActorRef<StateMessage>,
        script: Script,
    ) -> Result<Script, ActorProcessingErr> {
        Ok(script)
    }

    async fn handle(
        &self,
        _myself: ActorRef<StateMessage>,
        message: StateMessage,
        script: &mut Script,
    ) -> Result<(), ActorProcessingErr> {
        if !script.answer {
            script.held.push(message);
            return Ok(());
        }
        let document = |runs: &HashMap<RunId, TrainRunInfo>, id: &RunId| {
            RunDocument::of(runs.get(id).expect("a write to a registered run"))
        };
        match message {
            StateMessage::Register { run, reply, .. } => {
                let run = run.into_run(T0);
                let answer = Registration::new(RunDocument::of(&run), script.lease, true);
                script.runs.insert(run.id().clone(), run);
                let _ = reply.send(Ok(answer));
            }
            StateMessage::Heartbeat { reply, .. } => {
                script.heartbeats.fetch_add(1, Ordering::SeqCst);
                let _ = reply.send(Ok(script.lease));
            }
            StateMessage::SetStatus { id, reply, .. } => {
                let _ = reply.send(Ok(document(&script.runs, &id)));
            }
            StateMessage::StartAttempt { id, reply, .. } => {
                let _ = reply.send(Ok(document(&script.runs, &id)));
            }
            other => panic!("the manager sent {other:?}"),
        }
        Ok(())
    }
}

/// Spawns a scripted head under a fresh name and returns a handle to it.
async fn scripted(what: &str, answer: bool, lease: Duration) -> (StateHandle, Arc<AtomicUsize>) {
    let name = unique_name(what);
    let heartbeats = Arc::new(AtomicUsize::new(0));
    let script = Script {
        answer,
        lease,
        heartbeats: heartbeats.clone(),
        runs: HashMap::new(),
        held: vec![],
    };
    Actor::spawn(Some(name.clone()), ScriptedHead, script).await.unwrap();
    (StateHandle::local(name), heartbeats)
}

/// Asserts that `started.elapsed()` is `expected` on paused time (timers
/// fire on whole milliseconds, so at most one millisecond later).
fn assert_took(started: Instant, expected: Duration, what: &str) {
    let took = started.elapsed();
    assert!(
        took >= expected && took < expected + Duration::from_millis(1),
        "{what} took {took:?}, not {expected:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn regression_no_call_outlives_its_deadline_whether_the_head_is_silent_or_absent() {
    let silent = scripted("silent", false, Duration::from_secs(30)).await.0;
    let absent = StateHandle::local(unique_name("absent"));
    for (head, state) in [("silent", silent), ("absent", absent)] {
        let manager = TrainRunStateManager::new(Some(state), quick());
        let deadline = manager.config().call_timeout;

        let started = Instant::now();
        let registration = manager
            .register_train_run("late", "job", "controller", &FakeGroup::new(2, 2), [], None)
            .await
            .unwrap();
        assert_took(started, deadline, &format!("registering with an {head} head"));
        let RunRegistration::Pending(id) = registration else { panic!("{registration:?}") };

        let started = Instant::now();
        let resized = manager.update_worker_group(&id, &FakeGroup::new(4, 2)).await.unwrap();
        assert_eq!(resized, Delivery::Pending);
        assert_took(started, deadline, &format!("a new worker group with an {head} head"));

        let started = Instant::now();
        assert_eq!(manager.finished(&id).await.unwrap(), Delivery::Pending);
        assert_took(started, deadline, &format!("the final status with an {head} head"));

        // Shutting down waits its grace, and not a moment more.
        let grace = Duration::from_secs(3);
        let started = Instant::now();
        assert_eq!(manager.shutdown(grace).await, 3, "{head}");
        assert_took(started, grace, &format!("shutting down with an {head} head"));
        assert!(matches!(manager.finished(&id).await, Err(ManagerError::ShutDown)));
    }
}

#[tokio::test(start_paused = true)]
async fn regression_a_late_worker_fails_the_registration_at_the_gather_deadline() {
    let (state, _) = scripted("gather", true, Duration::from_secs(30)).await;
    let config = quick().with_gather_timeout(Duration::from_millis(200));
    let manager = TrainRunStateManager::new(Some(state), config);
    let mut silent = FakeGroup::new(4, 4);
    silent.silent = Some(3);
    let started = Instant::now();
    let err =
        manager.register_train_run("s", "job", "controller", &silent, [], None).await.unwrap_err();
    assert!(matches!(err, ManagerError::WorkerTimeout { rank: 3, .. }), "{err:?}");
    assert_took(started, Duration::from_millis(200), "gathering from a silent worker");
    assert_eq!(manager.pending_writes(), 0, "nothing was sent");
}

#[tokio::test(start_paused = true)]
async fn regression_heartbeats_beat_every_third_of_the_lease_and_stop_with_the_run() {
    let lease = Duration::from_secs(30);
    let (state, heartbeats) = scripted("cadence", true, lease).await;
    let manager = TrainRunStateManager::new(Some(state), quick());
    let registration = manager
        .register_train_run("beats", "job", "controller", &FakeGroup::new(2, 2), [], None)
        .await
        .unwrap();
    let RunRegistration::Registered(id) = registration else { panic!("{registration:?}") };
    assert_eq!(heartbeats.load(Ordering::SeqCst), 0);

    // Beats at 10 s, 20 s, ..., 100 s: ten by 105 s.
    tokio::time::sleep(10 * lease / 3 + Duration::from_secs(5)).await;
    assert_eq!(heartbeats.load(Ordering::SeqCst), 10);

    // The run ends: no more beats, however long the manager lives.
    assert_eq!(manager.finished(&id).await.unwrap(), Delivery::Acknowledged);
    tokio::time::sleep(10 * lease).await;
    assert_eq!(heartbeats.load(Ordering::SeqCst), 10);
    assert_eq!(manager.shutdown(Duration::from_secs(1)).await, 0);
}
