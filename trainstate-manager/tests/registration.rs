//! Registering runs, new worker groups and how runs end, against a live
//! state actor.
//!
//! The managers here are `patient`: their deadlines only end a hung test,
//! so a live head acknowledges every call however loaded the machine.

use std::sync::Arc;
use std::time::Duration;

use trainstate_client::RunQuery;
use trainstate_manager::{
    DatasetSpec, Delivery, ManagerError, RactorWorker, RactorWorkerGroup, RunRegistration,
    TrainRunStateManager, WorkerError,
};
use trainstate_schema::{ActorStatus, CauseClass, CauseKind, Rule, RunId, RunStatus};

use crate::common::{FakeGroup, TestClock, in_memory, patient, ractor_group, stop};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_managers_times_ten_runs_give_a_hundred_retrievable_runs() {
    let service = in_memory("hundred").await;
    let group = Arc::new(FakeGroup::new(4, 4));
    // Ten controllers at once, each registering its runs one after another.
    let controllers: Vec<_> = (0..10)
        .map(|m| {
            let manager = TrainRunStateManager::new(Some(service.handle()), patient());
            let group = group.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for r in 0..10 {
                    let registration = manager
                        .register_train_run(&format!("run-{m}-{r}"), "job", "ctl", &group, [], None)
                        .await
                        .unwrap();
                    assert!(
                        matches!(registration, RunRegistration::Registered(_)),
                        "{registration:?}"
                    );
                    ids.push(registration.into_id());
                }
                ids
            })
        })
        .collect();
    let mut ids = Vec::new();
    for controller in controllers {
        ids.extend(controller.await.unwrap());
    }
    let state = service.handle();
    assert_eq!(state.list(RunQuery::all()).await.unwrap().total, 100);
    for id in &ids {
        let run = state.get_run(id.clone()).await.unwrap();
        assert_eq!(run.run_status(), RunStatus::Running);
        assert_eq!(run.workers().len(), 4);
    }
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 100, "every registration gets a fresh id");
    service.shutdown().await;
}

#[tokio::test]
async fn an_end_to_end_run_of_four_ractor_workers_is_stored_as_they_report_it() {
    let dir = tempfile::tempdir().unwrap();
    let service = in_memory("e2e").await;
    let group = ractor_group(dir.path(), 1, 4).await;
    let clock = TestClock::new();
    let started_at = clock.now_ms();
    let config = patient().with_clock(clock.for_manager());
    let manager = TrainRunStateManager::new(Some(service.handle()), config);
    // The run starts when its manager was made, not when it registers.
    clock.advance(Duration::from_secs(5));
    let datasets = [
        DatasetSpec::new("train", "uuid-train").named("imagenet"),
        DatasetSpec::new("valid", "uuid-valid"),
    ];
    let registration = manager
        .register_train_run("e2e", "job-0001", "controller-0", &group, datasets, None)
        .await
        .unwrap();
    let RunRegistration::Registered(id) = registration else { panic!("{registration:?}") };

    let run = service.handle().get_run(id.clone()).await.unwrap();
    assert_eq!(run.name(), "e2e");
    assert!(!run.job_id().is_empty() && !run.controller_actor_id().is_empty());
    assert_eq!(run.job_id(), "job-0001");
    assert_eq!(run.controller_actor_id(), "controller-0");
    assert_eq!(run.run_status(), RunStatus::Running);
    assert_eq!(run.end_time_ms(), None);
    assert_eq!(run.start_time_ms(), started_at);
    let workers = run.workers();
    assert_eq!(workers.iter().map(|w| w.world_rank()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(workers.iter().map(|w| w.local_rank()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert!(workers.iter().all(|w| w.node_rank() == 0));
    for w in workers {
        assert_eq!(w.gpu_ids(), [w.local_rank()], "GPU ids as configured");
        assert_eq!(w.pid(), std::process::id());
        assert_eq!(w.node_id(), format!("{:032x}", 0xabc0));
        assert_eq!(w.node_ip(), "10.0.0.1");
        assert_eq!(w.status(), ActorStatus::Alive);
        assert_eq!(w.resources().get("GPU"), Some(1.0));
    }
    let actor_ids: std::collections::HashSet<_> = workers.iter().map(|w| w.actor_id()).collect();
    assert_eq!(actor_ids.len(), 4, "each worker has its own actor id");
    let datasets = run.datasets();
    assert_eq!(datasets[0].name(), "train");
    assert_eq!(datasets[0].dataset_uuid(), "uuid-train");
    assert_eq!(datasets[0].dataset_name(), Some("train_imagenet"));
    assert_eq!(datasets[1].dataset_name(), None);

    clock.advance(Duration::from_secs(60));
    assert_eq!(manager.finished(&id).await.unwrap(), Delivery::Acknowledged);
    let run = service.handle().get_run(id.clone()).await.unwrap();
    assert_eq!(run.run_status(), RunStatus::Finished);
    assert_eq!(run.end_time_ms(), Some(clock.now_ms()), "the manager stamps the end");
    // The run is over for this manager.
    assert!(matches!(manager.finished(&id).await, Err(ManagerError::UnknownRun { .. })));
    stop(&group);
    service.shutdown().await;
}

#[tokio::test]
async fn an_erroring_run_ends_errored_with_rays_detail_and_the_message() {
    let service = in_memory("errored").await;
    let manager = TrainRunStateManager::new(Some(service.handle()), patient());
    let group = FakeGroup::new(4, 4);
    let id = manager
        .register_train_run("errs", "job", "controller", &group, [], None)
        .await
        .unwrap()
        .into_id();
    let trace = "Traceback (most recent call last):\n  File \"train.py\", line 3, in train_func";
    let delivery = manager.errored(&id, Some(0), "ValueError: loss is NaN", trace).await.unwrap();
    assert_eq!(delivery, Delivery::Acknowledged);
    let run = service.handle().get_run(id).await.unwrap();
    assert_eq!(run.run_status(), RunStatus::Errored);
    assert!(
        run.status_detail().contains("Rank 0 worker raised an error"),
        "{}",
        run.status_detail()
    );
    assert!(run.status_detail().contains("ValueError: loss is NaN"));
    assert!(run.status_detail().contains("train_func"));
    let cause = run.cause().unwrap();
    assert_eq!(cause.kind, CauseKind::UserError);
    assert_eq!(cause.failed_world_rank, Some(0));
    assert!(run.end_time_ms().is_some());
    service.shutdown().await;
}

#[tokio::test]
async fn an_abort_records_its_cause() {
    let service = in_memory("aborted").await;
    let manager = TrainRunStateManager::new(Some(service.handle()), patient());
    let id = manager
        .register_train_run("stop", "job", "controller", &FakeGroup::new(2, 2), [], None)
        .await
        .unwrap()
        .into_id();
    manager.aborted(&id, CauseKind::UserInterrupt).await.unwrap();
    let run = service.handle().get_run(id).await.unwrap();
    assert_eq!(run.run_status(), RunStatus::Aborted);
    assert_eq!(run.cause().unwrap().kind, CauseKind::UserInterrupt);
    assert!(!run.status_detail().is_empty());
    service.shutdown().await;
}

#[tokio::test]
async fn a_controller_reports_the_machines_kinds_with_the_failed_rank_and_the_head_classes_them() {
    let service = in_memory("kinds").await;
    let manager = TrainRunStateManager::new(Some(service.handle()), patient());
    let register = |name: &'static str| {
        let manager = &manager;
        async move {
            manager
                .register_train_run(name, "job", "controller", &FakeGroup::new(2, 2), [], None)
                .await
                .unwrap()
                .into_id()
        }
    };
    let preempted = register("preempted").await;
    manager.aborted_with_cause(&preempted, Some(1), CauseKind::Preempted, "").await.unwrap();
    let oom = register("oom").await;
    let trace = "rank 1 killed by the OOM killer (memory.max 8 GiB)";
    manager.errored_with_cause(&oom, Some(1), CauseKind::Oom, "OOM", trace).await.unwrap();

    let run = service.handle().get_run(preempted).await.unwrap();
    assert_eq!(run.run_status(), RunStatus::Aborted);
    let cause = run.cause().unwrap();
    assert_eq!(
        (cause.kind, cause.class, cause.failed_world_rank),
        (CauseKind::Preempted, CauseClass::Interrupted, Some(1))
    );
    assert_eq!(run.status_detail(), "The run was stopped: the scheduler preempted its allocation.");
    let run = service.handle().get_run(oom).await.unwrap();
    assert_eq!(run.run_status(), RunStatus::Errored);
    let cause = run.cause().unwrap();
    assert_eq!(
        (cause.kind, cause.class, cause.failed_world_rank),
        (CauseKind::Oom, CauseClass::Infrastructure, Some(1))
    );
    assert!(run.status_detail().contains("memory.max 8 GiB"), "{}", run.status_detail());
    service.shutdown().await;
}

#[tokio::test]
async fn a_resize_starts_a_second_attempt_and_the_first_attempts_workers_are_dead() {
    let dir = tempfile::tempdir().unwrap();
    let service = in_memory("resize").await;
    let clock = TestClock::new();
    let manager = TrainRunStateManager::new(
        Some(service.handle()),
        patient().with_clock(clock.for_manager()),
    );
    let four = ractor_group(dir.path(), 1, 4).await;
    let id = manager
        .register_train_run("elastic", "job", "controller", &four, [], None)
        .await
        .unwrap()
        .into_id();
    let six = ractor_group(dir.path(), 2, 3).await;
    clock.advance(Duration::from_secs(10));
    assert_eq!(manager.update_worker_group(&id, &six).await.unwrap(), Delivery::Acknowledged);

    let run = service.handle().get_run(id.clone()).await.unwrap();
    assert_eq!(run.workers().len(), 6);
    assert_eq!(run.workers().iter().map(|w| w.node_rank()).collect::<Vec<_>>(), [0, 0, 0, 1, 1, 1]);
    let attempts = run.attempts();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].attempt_id(), "0");
    assert_eq!(attempts[1].attempt_id(), "1");
    assert_eq!(attempts[1].start_time_ms(), clock.now_ms(), "the manager stamps the start");
    assert_eq!(attempts[0].end_time_ms(), Some(clock.now_ms()), "ended by the next one");
    let first = attempts[0].workers().unwrap();
    assert_eq!(first.len(), 4);
    assert!(first.iter().all(|w| w.status() == ActorStatus::Dead));
    assert!(attempts[0].end_time_ms().is_some());
    assert!(run.workers().iter().all(|w| w.status() == ActorStatus::Alive));

    // A restart after a failure is a third attempt.
    assert_eq!(manager.update_worker_group(&id, &six).await.unwrap(), Delivery::Acknowledged);
    manager.finished(&id).await.unwrap();
    let run = service.handle().get_run(id).await.unwrap();
    assert_eq!(run.attempts().len(), 3);
    assert_eq!(run.run_status(), RunStatus::Finished);
    stop(&four);
    stop(&six);
    service.shutdown().await;
}

#[tokio::test]
async fn a_worker_that_fails_or_is_late_fails_the_registration_naming_its_rank() {
    let service = in_memory("worker-fails").await;
    let manager = TrainRunStateManager::new(Some(service.handle()), patient());

    let mut failing = FakeGroup::new(4, 4);
    failing.failing = Some(2);
    let err =
        manager.register_train_run("f", "job", "controller", &failing, [], None).await.unwrap_err();
    assert!(matches!(err, ManagerError::Worker { rank: 2, .. }), "{err:?}");
    assert!(err.to_string().contains("rank 2"), "{err}");

    // A late worker: `deadlines::regression_a_late_worker_fails_the_registration_at_the_gather_deadline`.

    // A ractor worker whose actor has stopped.
    let dir = tempfile::tempdir().unwrap();
    let group = ractor_group(dir.path(), 1, 2).await;
    group.workers()[1].actor.stop(None);
    group.workers()[1].actor.get_cell().wait(None).await.unwrap();
    let err =
        manager.register_train_run("d", "job", "controller", &group, [], None).await.unwrap_err();
    assert!(
        matches!(err, ManagerError::Worker { rank: 1, source: WorkerError::Unreachable { .. } }),
        "{err:?}"
    );

    // A group whose workers break the rules across workers.
    let mut clash = FakeGroup::new(2, 2);
    clash.workers[1] = {
        let mut draft = clash.workers[1].clone().into_draft();
        draft.local_rank = 0;
        draft.validate().unwrap()
    };
    match manager.register_train_run("c", "job", "controller", &clash, [], None).await {
        Err(ManagerError::InvalidRun(err)) => {
            assert_eq!(err.field(), "workers[1].local_rank");
            assert!(matches!(err.rule(), Rule::DuplicateLocalRank { rank: 0 }));
        }
        other => panic!("{other:?}"),
    }

    // Nothing was registered, and the manager still works.
    assert_eq!(service.handle().list(RunQuery::all()).await.unwrap().total, 0);
    let ok = manager
        .register_train_run("ok", "job", "controller", &FakeGroup::new(2, 2), [], None)
        .await
        .unwrap();
    assert!(matches!(ok, RunRegistration::Registered(_)));

    // A new worker group is checked the same way, and nothing is sent.
    match manager.update_worker_group(ok.id(), &clash).await {
        Err(ManagerError::InvalidRun(err)) => {
            assert_eq!(err.field(), "workers[1].local_rank");
            assert!(matches!(err.rule(), Rule::DuplicateLocalRank { rank: 0 }));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(manager.pending_writes(), 0);
    assert_eq!(service.handle().get_run(ok.into_id()).await.unwrap().attempts().len(), 1);
    stop(&group);
    service.shutdown().await;
}

#[tokio::test]
async fn a_restore_is_a_new_run_naming_the_run_it_continues() {
    let service = in_memory("restore").await;
    let manager = TrainRunStateManager::new(Some(service.handle()), patient());
    let group = FakeGroup::new(2, 2);
    let first = manager
        .register_train_run("llm", "job", "controller", &group, [], None)
        .await
        .unwrap()
        .into_id();
    manager.errored(&first, None, "node lost", "").await.unwrap();
    let restored = manager
        .register_train_run("llm", "job", "controller", &group, [], Some(first.clone()))
        .await
        .unwrap()
        .into_id();
    assert_ne!(restored, first);
    let run = service.handle().get_run(restored).await.unwrap();
    assert_eq!(run.restored_from(), Some(&first));
    assert_eq!(run.run_status(), RunStatus::Running);
    let errored = service.handle().get_run(first).await.unwrap();
    assert_eq!(errored.cause().unwrap().kind, CauseKind::SystemError);
    assert_eq!(errored.status_detail(), "node lost");
    service.shutdown().await;
}

#[tokio::test]
async fn calls_for_runs_the_manager_does_not_track_are_refused() {
    let service = in_memory("unknown").await;
    let manager = TrainRunStateManager::new(Some(service.handle()), patient());
    let stranger = RunId::new_v7();
    let group = FakeGroup::new(2, 2);
    assert!(matches!(
        manager.update_worker_group(&stranger, &group).await,
        Err(ManagerError::UnknownRun { .. })
    ));
    assert!(matches!(manager.finished(&stranger).await, Err(ManagerError::UnknownRun { .. })));
    service.shutdown().await;
}

#[tokio::test]
async fn a_ractor_group_refuses_ranks_that_are_not_zero_to_n() {
    let dir = tempfile::tempdir().unwrap();
    let group = ractor_group(dir.path(), 1, 2).await;
    let actors: Vec<_> = group.workers().iter().map(|w| w.actor.clone()).collect();
    let twice = vec![
        RactorWorker::new(actors[0].clone(), 0, 0, 0),
        RactorWorker::new(actors[1].clone(), 0, 1, 0),
    ];
    let err = RactorWorkerGroup::new(twice).unwrap_err();
    assert_eq!(err.field(), "workers[1].world_rank");
    let gap = vec![
        RactorWorker::new(actors[0].clone(), 0, 0, 0),
        RactorWorker::new(actors[1].clone(), 2, 1, 0),
    ];
    assert!(matches!(
        RactorWorkerGroup::new(gap).unwrap_err().rule(),
        Rule::WorldRankOutOfRange { rank: 2, workers: 2 }
    ));
    // Given out of order, they are kept by world rank.
    let swapped = vec![
        RactorWorker::new(actors[1].clone(), 1, 1, 0),
        RactorWorker::new(actors[0].clone(), 0, 0, 0),
    ];
    let ordered = RactorWorkerGroup::new(swapped).unwrap();
    assert_eq!(ordered.workers()[0].actor.get_id(), actors[0].get_id());
    stop(&group);
}
