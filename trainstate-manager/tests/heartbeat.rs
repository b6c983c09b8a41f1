//! Heartbeats: a live run's lease is renewed every third of it, until the
//! manager is dropped.
//!
//! The head's leases run on a clock the test moves and its sweep runs when
//! the test asks, so no outcome depends on how fast the machine is: the
//! test waits for a heartbeat to arrive (a condition), never for time to
//! pass.

use std::time::Duration;

use trainstate_actor::launch_state_actor;
use trainstate_client::StateHandle;
use trainstate_manager::TrainRunStateManager;
use trainstate_schema::{CauseKind, RunId, RunStatus};

use crate::common::{FakeGroup, TestClock, eventually, head_on, patient};

/// The last heartbeat the head recorded for a live run.
async fn last_heartbeat(state: &StateHandle, id: &RunId) -> Option<u64> {
    state.get(id.clone()).await.ok()?.last_heartbeat_ms()
}

#[tokio::test]
async fn regression_heartbeats_keep_a_run_alive_past_its_lease_until_the_manager_is_dropped() {
    // Short, so the manager beats often (every third of it, in real time);
    // the head measures it on the test's clock.
    let lease = Duration::from_millis(150);
    let clock = TestClock::new();
    let service = launch_state_actor(head_on(&clock, "heartbeat", lease)).await.unwrap();
    let state = service.handle();
    let manager =
        TrainRunStateManager::new(Some(state.clone()), patient().with_clock(clock.for_manager()));
    let id = manager
        .register_train_run("beating", "job", "controller", &FakeGroup::new(2, 2), [], None)
        .await
        .unwrap()
        .into_id();
    assert_eq!(last_heartbeat(&state, &id).await, Some(clock.now_ms()));

    // Three leases pass on the head's clock, one at a time; in each, a
    // heartbeat arrives, and the sweep at the lease's end keeps the run.
    for lease_number in 1..=3 {
        clock.advance(lease);
        let now = clock.now_ms();
        eventually("a heartbeat after the clock moved", Duration::from_secs(30), || async {
            last_heartbeat(&state, &id).await == Some(now)
        })
        .await;
        assert_eq!(state.sweep_leases().await.unwrap(), [], "lease {lease_number}");
        let run = state.get_run(id.clone()).await.unwrap();
        assert_eq!(run.run_status(), RunStatus::Running, "{}", run.status_detail());
    }

    // Without its manager, nothing renews the lease: once it has passed,
    // the sweep aborts the run as its controller lost.
    drop(manager);
    // A heartbeat the manager sent before it was dropped is handled before
    // this sweep (one mailbox, in order), at the clock's present time.
    assert_eq!(state.sweep_leases().await.unwrap(), []);
    clock.advance(lease + Duration::from_millis(1));
    assert_eq!(state.sweep_leases().await.unwrap(), std::slice::from_ref(&id));
    let run = state.get_run(id).await.unwrap();
    assert_eq!(run.run_status(), RunStatus::Aborted);
    assert_eq!(run.cause().unwrap().kind, CauseKind::LostController);
    service.shutdown().await;
}
