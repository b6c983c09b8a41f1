//! Heartbeats: a live run's lease is renewed every third of it, until the
//! manager is dropped.

use std::time::{Duration, Instant};

use trainstate_actor::{StateConfig, launch_state_actor};
use trainstate_manager::TrainRunStateManager;
use trainstate_schema::{CauseKind, RunStatus};

use crate::common::{FakeGroup, quick, unique_name, wait_for_status};

#[tokio::test]
async fn heartbeats_keep_a_run_alive_past_its_lease_until_the_manager_is_dropped() {
    let lease = Duration::from_millis(1500);
    let config = StateConfig::in_memory()
        .with_name(unique_name("heartbeat"))
        .with_lease(lease)
        .with_sweep_interval(Duration::from_millis(50));
    let service = launch_state_actor(config).await.unwrap();
    let state = service.handle();
    let manager = TrainRunStateManager::new(Some(state.clone()), quick());
    let id = manager
        .register_train_run("beating", "job", "controller", &FakeGroup::new(2, 2), [], None)
        .await
        .unwrap()
        .into_id();
    let registered_at = state.get(id.clone()).await.unwrap().last_heartbeat_ms().unwrap();

    // Two leases later, the run is still live, renewed by heartbeats.
    let until = Instant::now() + 2 * lease;
    let mut beats = std::collections::BTreeSet::new();
    while Instant::now() < until {
        let run = state.get(id.clone()).await.unwrap();
        let parsed = run.parse().unwrap();
        assert_eq!(parsed.run_status(), RunStatus::Running, "{}", parsed.status_detail());
        beats.insert(run.last_heartbeat_ms().unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(beats.iter().filter(|&&at| at > registered_at).count() >= 3, "{beats:?}");

    // Without its manager, the run is aborted when the lease expires.
    drop(manager);
    let run = wait_for_status(&state, &id, RunStatus::Aborted).await;
    assert_eq!(run.cause().unwrap().kind, CauseKind::LostController);
    service.shutdown().await;
}
