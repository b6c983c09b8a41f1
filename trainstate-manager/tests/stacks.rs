//! The stacks a controller attaches to its run, through a real head over
//! HTTP: kept with the run at once, complete, and grouped (the ranks stuck
//! in the same place together, the others named as suspects); what breaks
//! a rule, or names a run the manager does not track live, is refused.

use std::time::Duration;

use trainstate_client::{StateError, StateHandle};
use trainstate_manager::{ManagerError, RankStackReport, TrainRunStateManager};
use trainstate_schema::RunId;
use trainstate_schema::api::{CaptureState, CaptureTrigger};

use crate::common::{FakeGroup, patient};
use crate::progress::Head;

/// A faulthandler dump of a main thread stuck in `function`.
fn stack(function: &str) -> String {
    format!(
        "Thread 0x00007f0a1b2c3d40 (most recent call first):\n  File \"train.py\", line 41 in {function}\n  File \"train.py\", line 90 in main\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controllers_stacks_are_kept_with_its_run_and_grouped() {
    let head = Head::start("stacks").await;
    let state = StateHandle::connect(&head.url, None).unwrap();
    let manager = TrainRunStateManager::new(Some(state.clone()), patient());
    let group = FakeGroup::new(4, 2);
    let id = manager
        .register_train_run("stacks", "job-s", "controller-s", &group, [], None)
        .await
        .unwrap()
        .into_id();

    // Ranks 0, 1 and 3 wait in the collective; rank 2 never reached it.
    let ranks: Vec<RankStackReport> = (0..4)
        .map(|rank| {
            let function = if rank == 2 { "load_batch" } else { "all_reduce" };
            RankStackReport::new(rank, "controller", stack(function))
        })
        .collect();
    let capture = manager.attach_stacks(&id, Some("loss is flat".into()), ranks).await.unwrap();
    assert_eq!(capture.trigger, CaptureTrigger::Controller);
    assert_eq!(capture.state, CaptureState::Complete, "kept whole at once");
    assert_eq!(capture.attempt_id, "0");
    assert_eq!(capture.reason, "loss is flat");
    assert_eq!(capture.groups[0].ranks, [0, 1, 3], "{capture:?}");
    let suspects: Vec<u32> = capture.suspects.iter().map(|s| s.rank).collect();
    assert_eq!(suspects, [2], "{capture:?}");
    assert_eq!(capture.suspects[0].innermost, "load_batch (train.py:41)");

    // The head keeps it with the run.
    let kept = state.run_stacks(&id).await.unwrap();
    assert_eq!(kept.captures, std::slice::from_ref(&capture));

    // A rank the group lacks is the head's refusal, naming the field.
    let refused = manager
        .attach_stacks(&id, None, vec![RankStackReport::new(7, "controller", stack("f"))])
        .await;
    match refused {
        Err(ManagerError::Rejected { source: StateError::Invalid { field, .. }, .. }) => {
            assert_eq!(field, "ranks[0].rank");
        }
        other => panic!("refused naming the rank: {other:?}"),
    }
    // No ranks would ask the ranks instead: refused before it is sent.
    let empty = manager.attach_stacks(&id, None, Vec::new()).await;
    assert!(matches!(empty, Err(ManagerError::InvalidStacks(_))), "{empty:?}");
    let unknown = RunId::new_v7();
    let one = || vec![RankStackReport::new(0, "controller", stack("f"))];
    let other = manager.attach_stacks(&unknown, None, one()).await;
    assert!(matches!(other, Err(ManagerError::UnknownRun { .. })), "{other:?}");
    assert_eq!(state.run_stacks(&id).await.unwrap().captures.len(), 1, "nothing else kept");

    // An ended run is no longer this manager's to attach to.
    manager.finished(&id).await.unwrap();
    let ended = manager.attach_stacks(&id, None, one()).await;
    assert!(matches!(ended, Err(ManagerError::UnknownRun { .. })), "{ended:?}");
    assert_eq!(manager.shutdown(Duration::from_secs(5)).await, 0);

    // Without a state actor there is no capture to answer with.
    let untracked = TrainRunStateManager::new(None, patient());
    let answer = untracked.attach_stacks(&id, None, one()).await;
    assert!(matches!(answer, Err(ManagerError::Untracked)), "{answer:?}");
}
