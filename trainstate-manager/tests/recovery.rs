//! Failure isolation: an absent, slow or restarted head never blocks
//! training, and the manager catches up when the head is back.
//!
//! How long a call may take is pinned on paused time (`deadlines.rs`); here
//! real heads come and go, and every test waits for outcomes (a stored
//! status, nothing left pending), never for time to pass.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use trainstate_actor::{Faults, StateConfig, launch_state_actor, shutdown_state_actor};
use trainstate_client::StateHandle;
use trainstate_manager::{Delivery, ManagerError, RunRegistration, TrainRunStateManager};
use trainstate_schema::RunStatus;

use crate::common::{
    FakeGroup, TestClock, eventually, head_on, patient, quick, unique_name, wait_for_status,
};

/// Waits until the head has acknowledged every write of `manager`.
async fn all_acknowledged(manager: &TrainRunStateManager) {
    eventually("every write acknowledged", Duration::from_secs(30), || async {
        manager.pending_writes() == 0
    })
    .await;
}

#[tokio::test]
async fn the_actor_killed_and_relaunched_from_its_store_mid_run_still_ends_finished() {
    let dir = tempfile::tempdir().unwrap();
    let name = unique_name("relaunch");
    let durable = || StateConfig::sqlite(dir.path().join("state.db")).with_name(name.clone());
    let service = launch_state_actor(durable()).await.unwrap();
    let manager = TrainRunStateManager::new(Some(StateHandle::local(name.clone())), quick());
    let id = manager
        .register_train_run("mid-run", "job", "controller", &FakeGroup::new(4, 4), [], None)
        .await
        .unwrap()
        .into_id();
    all_acknowledged(&manager).await;

    // The head goes away mid-run: nothing can acknowledge these.
    service.shutdown().await;
    let resized = manager.update_worker_group(&id, &FakeGroup::new(6, 3)).await.unwrap();
    assert_eq!(resized, Delivery::Pending);
    assert_eq!(manager.finished(&id).await.unwrap(), Delivery::Pending);
    assert_eq!(manager.pending_writes(), 2);

    // Relaunched from its store, it gets the resize and the final status, in order.
    let service = launch_state_actor(durable()).await.unwrap();
    let state = service.handle();
    let run = wait_for_status(&state, &id, RunStatus::Finished).await;
    assert_eq!(run.attempts().len(), 2);
    assert_eq!(run.workers().len(), 6);
    all_acknowledged(&manager).await;
    service.shutdown().await;
}

#[tokio::test]
async fn a_run_registered_while_the_head_is_down_is_delivered_when_it_comes_up() {
    let name = unique_name("late-head");
    let manager = TrainRunStateManager::new(Some(StateHandle::local(name.clone())), quick());
    let registration = manager
        .register_train_run("early", "job", "controller", &FakeGroup::new(4, 4), [], None)
        .await
        .unwrap();
    let RunRegistration::Pending(id) = registration else { panic!("{registration:?}") };

    let service = launch_state_actor(StateConfig::in_memory().with_name(name)).await.unwrap();
    let run = wait_for_status(&service.handle(), &id, RunStatus::Running).await;
    assert_eq!(run.workers().len(), 4);
    manager.finished(&id).await.unwrap();
    wait_for_status(&service.handle(), &id, RunStatus::Finished).await;
    all_acknowledged(&manager).await;
    service.shutdown().await;
}

#[tokio::test]
async fn an_in_memory_head_that_lost_the_run_gets_its_registration_again() {
    let name = unique_name("amnesia");
    let memory = || StateConfig::in_memory().with_name(name.clone());
    let service = launch_state_actor(memory()).await.unwrap();
    let manager = TrainRunStateManager::new(Some(service.handle()), quick());
    let id = manager
        .register_train_run("forgotten", "job", "controller", &FakeGroup::new(2, 2), [], None)
        .await
        .unwrap()
        .into_id();
    all_acknowledged(&manager).await;
    let first = service.handle().get_run(id.clone()).await.unwrap();
    service.shutdown().await;

    let service = launch_state_actor(memory()).await.unwrap();
    manager.errored(&id, Some(1), "RuntimeError: boom", "Traceback").await.unwrap();
    let run = wait_for_status(&service.handle(), &id, RunStatus::Errored).await;
    assert_eq!(run.start_time_ms(), first.start_time_ms());
    assert_eq!(run.workers().len(), 2);
    assert!(run.status_detail().contains("Rank 1 worker raised an error"));
    assert!(run.status_detail().contains("RuntimeError: boom"));
    service.shutdown().await;
}

#[tokio::test]
async fn heartbeats_bring_back_a_live_run_an_in_memory_head_lost() {
    // Leases on the test's clock, which does not move: no sweep can abort
    // the run, however slowly the heartbeats come.
    let clock = TestClock::new();
    let config = head_on(&clock, "heartbeat-amnesia", Duration::from_millis(150));
    let memory = || config.clone();
    let service = launch_state_actor(memory()).await.unwrap();
    // The manager writes times by the same clock as the head's: the head
    // refuses a time more than a day ahead of its own.
    let config = quick().with_clock(clock.for_manager());
    let manager = TrainRunStateManager::new(Some(service.handle()), config);
    let id = manager
        .register_train_run("quiet", "job", "controller", &FakeGroup::new(2, 2), [], None)
        .await
        .unwrap()
        .into_id();
    // Acknowledged, so only a heartbeat can tell the manager the run is lost.
    all_acknowledged(&manager).await;
    service.shutdown().await;

    // No call of the training code: the heartbeat finds the run missing.
    let service = launch_state_actor(memory()).await.unwrap();
    let run = wait_for_status(&service.handle(), &id, RunStatus::Running).await;
    assert_eq!(run.name(), "quiet");
    manager.finished(&id).await.unwrap();
    wait_for_status(&service.handle(), &id, RunStatus::Finished).await;
    service.shutdown().await;
}

#[tokio::test]
async fn shutdown_flushes_what_is_pending_before_the_controller_exits() {
    let name = unique_name("flush");
    let dir = tempfile::tempdir().unwrap();
    let durable = || StateConfig::sqlite(dir.path().join("state.db")).with_name(name.clone());
    let service = launch_state_actor(durable()).await.unwrap();
    let manager = TrainRunStateManager::new(Some(service.handle()), quick());
    let id = manager
        .register_train_run("flushed", "job", "controller", &FakeGroup::new(2, 2), [], None)
        .await
        .unwrap()
        .into_id();
    service.shutdown().await;
    assert_eq!(manager.finished(&id).await.unwrap(), Delivery::Pending);

    // The head comes back while the controller is shutting down.
    let (left, service) =
        tokio::join!(manager.shutdown(Duration::from_secs(20)), launch_state_actor(durable()));
    assert_eq!(left, 0);
    let service = service.unwrap();
    let run = service.handle().get_run(id).await.unwrap();
    assert_eq!(run.run_status(), RunStatus::Finished);

    let after = manager
        .register_train_run("late", "job", "controller", &FakeGroup::new(2, 2), [], None)
        .await;
    assert!(matches!(after, Err(ManagerError::ShutDown)), "{after:?}");
    service.shutdown().await;
}

/// On paused time: no head, no thread, so the grace is measured exactly.
#[tokio::test(start_paused = true)]
async fn shutdown_gives_up_after_its_grace_when_the_head_stays_down() {
    let manager =
        TrainRunStateManager::new(Some(StateHandle::local(unique_name("never"))), quick());
    let registration = manager
        .register_train_run("lost", "job", "controller", &FakeGroup::new(2, 2), [], None)
        .await
        .unwrap();
    assert!(matches!(registration, RunRegistration::Pending(_)));
    let started = Instant::now();
    assert_eq!(manager.shutdown(Duration::from_millis(200)).await, 1);
    assert_eq!(started.elapsed(), Duration::from_millis(200));
}

#[tokio::test]
async fn a_slow_actor_never_blocks_training_past_the_deadline() {
    let faults = Arc::new(Faults::default());
    let config =
        StateConfig::in_memory().with_name(unique_name("slow")).with_faults(faults.clone());
    let service = launch_state_actor(config).await.unwrap();
    let manager = TrainRunStateManager::new(Some(service.handle()), quick());
    faults.hold_writer();
    // The writer commits nothing while held: the call can only end at its
    // deadline (pinned to the millisecond in `deadlines.rs`).
    let registration = manager
        .register_train_run("slow", "job", "controller", &FakeGroup::new(2, 2), [], None)
        .await
        .unwrap();
    let RunRegistration::Pending(id) = registration else { panic!("{registration:?}") };
    assert_eq!(manager.pending_writes(), 1);
    faults.release_writer();
    wait_for_status(&service.handle(), &id, RunStatus::Running).await;
    manager.finished(&id).await.unwrap();
    wait_for_status(&service.handle(), &id, RunStatus::Finished).await;
    all_acknowledged(&manager).await;
    service.shutdown().await;
}

#[tokio::test]
async fn a_head_shut_down_by_name_is_caught_up_with_by_the_same_manager() {
    let dir = tempfile::tempdir().unwrap();
    let name = unique_name("by-name");
    let durable = || StateConfig::sqlite(dir.path().join("state.db")).with_name(name.clone());
    let _first = launch_state_actor(durable()).await.unwrap();
    let manager = TrainRunStateManager::new(Some(StateHandle::local(name.clone())), quick());
    let id = manager
        .register_train_run("a", "job", "controller", &FakeGroup::new(2, 2), [], None)
        .await
        .unwrap()
        .into_id();
    assert!(shutdown_state_actor(&name).await);
    manager.aborted(&id, trainstate_schema::CauseKind::UserInterrupt).await.unwrap();
    let service = launch_state_actor(durable()).await.unwrap();
    wait_for_status(&service.handle(), &id, RunStatus::Aborted).await;
    service.shutdown().await;
}

#[tokio::test]
async fn a_run_the_head_gave_up_on_refuses_new_workers_but_takes_the_final_status() {
    let clock = TestClock::new();
    // So long that the manager's first heartbeat (a third of it, in real
    // time) never comes within the test: only the test's clock moves.
    let lease = Duration::from_secs(3 * 3600);
    let service = launch_state_actor(head_on(&clock, "gave-up", lease)).await.unwrap();
    let state = service.handle();
    let manager =
        TrainRunStateManager::new(Some(state.clone()), patient().with_clock(clock.for_manager()));
    let id = manager
        .register_train_run("silent", "job", "controller", &FakeGroup::new(2, 2), [], None)
        .await
        .unwrap()
        .into_id();
    // The head hears nothing for two leases (on its clock) and aborts the run.
    clock.advance(2 * lease);
    assert_eq!(state.sweep_leases().await.unwrap(), std::slice::from_ref(&id));

    match manager.update_worker_group(&id, &FakeGroup::new(4, 2)).await {
        Err(ManagerError::Rejected { source, .. }) => {
            assert!(matches!(source, trainstate_client::StateError::IllegalTransition { .. }))
        }
        other => panic!("{other:?}"),
    }
    // The controller's own report replaces the lost-controller abort.
    assert_eq!(manager.finished(&id).await.unwrap(), Delivery::Acknowledged);
    let run = state.get_run(id).await.unwrap();
    assert_eq!(run.run_status(), RunStatus::Finished);
    assert_eq!(run.attempts().len(), 1);
    service.shutdown().await;
}
