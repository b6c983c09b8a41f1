//! Tracking off: with no state actor, every call is a no-op and training
//! goes on (ported from Ray's "no errors raised if TrainStateActor is not
//! started").

use std::time::Duration;

use trainstate_manager::{Delivery, ManagerConfig, RunRegistration, TrainRunStateManager};
use trainstate_schema::{CauseKind, RunId};

use crate::common::FakeGroup;

#[tokio::test]
async fn a_manager_with_no_actor_raises_nothing() {
    let manager = TrainRunStateManager::new(None, ManagerConfig::default());
    assert!(!manager.is_tracking());
    // Even a group that would fail is not asked: nothing is gathered.
    let mut group = FakeGroup::new(4, 4);
    group.failing = Some(1);
    let registration =
        manager.register_train_run("run", "job", "controller", &group, [], None).await.unwrap();
    let RunRegistration::Untracked(id) = registration else { panic!("{registration:?}") };
    assert_eq!(id.as_str().len(), 32);

    assert_eq!(manager.update_worker_group(&id, &group).await.unwrap(), Delivery::Untracked);
    assert_eq!(manager.finished(&id).await.unwrap(), Delivery::Untracked);
    let other = RunId::new_v7();
    assert_eq!(
        manager.errored(&other, Some(0), "ValueError: boom", "Traceback").await.unwrap(),
        Delivery::Untracked
    );
    assert_eq!(
        manager.aborted(&other, CauseKind::UserInterrupt).await.unwrap(),
        Delivery::Untracked
    );
    assert_eq!(manager.pending_writes(), 0);
    assert_eq!(manager.shutdown(Duration::from_secs(1)).await, 0);
}

#[test]
fn a_manager_built_outside_a_runtime_tracks_nothing_and_does_not_panic() {
    let handle = trainstate_client::StateHandle::local("test.manager.no-runtime");
    let manager = TrainRunStateManager::new(Some(handle), ManagerConfig::default());
    assert!(!manager.is_tracking());
}
