//! Registration, status transitions and attempts: the run lifecycle.

use std::sync::Arc;

use trainstate_actor::{ManualClock, launch_state_actor};
use trainstate_client::{EventKind, NewAttempt, StateError, StatusUpdate};
use trainstate_schema::{ActorStatus, CauseKind, RunId, RunStatus, TrainRunInfo};

use crate::common::{json, run, run_with, workers};
use crate::stores::{Fresh, Store, on_both_stores};

const T0: u64 = 1_760_000_000_000;

async fn service(store: Store) -> (trainstate_actor::StateService, Arc<ManualClock>, Fresh) {
    let fresh = store.fresh("lifecycle").await;
    let clock = Arc::new(ManualClock::new(T0 + 1_000));
    let config = fresh.config().with_clock(clock.clone());
    (launch_state_actor(config).await.unwrap(), clock, fresh)
}

on_both_stores! {
    async fn hundred_concurrent_registrations_give_hundred_runs_read_back_equal(store) {
        let (service, _, _store) = service(store).await;
        let runs: Vec<TrainRunInfo> = (0..100).map(|i| run(&format!("run-{i}"), T0 + i)).collect();
        let tasks: Vec<_> = runs
            .iter()
            .cloned()
            .map(|r| {
                let state = service.handle();
                tokio::spawn(async move { state.register(r).await })
            })
            .collect();
        for task in tasks {
            assert!(task.await.unwrap().unwrap().created);
        }
        let state = service.handle();
        for original in &runs {
            let stored = state.get_run(original.id().clone()).await.unwrap();
            // What the actor adds: the first attempt, the registration in
            // the status history, and the heartbeat time.
            assert_eq!(stored.attempts().len(), 1);
            let history = stored.status_history();
            assert_eq!(history.len(), 1);
            assert_eq!(history[0].status, original.status());
            let mut expected = json(original);
            let mut got = json(&stored);
            got.as_object_mut().unwrap().remove("attempts");
            got.as_object_mut().unwrap().remove("status_history");
            got.as_object_mut().unwrap().remove("last_heartbeat_ms");
            // And its goodput, counted from the run's start.
            assert_eq!(got["goodput"]["wall_ms"], got["goodput"]["badput"]["waiting_to_start_ms"].as_u64().unwrap() + got["goodput"]["productive_ms"].as_u64().unwrap());
            got.as_object_mut().unwrap().remove("goodput");
            expected.as_object_mut().unwrap().remove("last_heartbeat_ms");
            assert_eq!(got, expected);
        }
        assert_eq!(state.list(Default::default()).await.unwrap().total, 100);
        service.shutdown().await;
    }

    async fn ten_handles_times_ten_runs_give_hundred(store) {
        let (service, _, _store) = service(store).await;
        let tasks: Vec<_> = (0..10)
            .map(|h| {
                let state = trainstate_client::StateHandle::local(service.handle().name());
                tokio::spawn(async move {
                    for i in 0..10 {
                        state.register(run(&format!("h{h}-{i}"), T0 + h * 10 + i)).await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let page = service.handle().list(trainstate_client::RunQuery::all()).await.unwrap();
        assert_eq!(page.total, 100);
        assert_eq!(page.runs.len(), 100);
        service.shutdown().await;
    }

    async fn re_registration_is_idempotent_and_a_conflict_changes_nothing(store) {
        let (service, _, _store) = service(store).await;
        let state = service.handle();
        let id = RunId::new_v7();
        let original = run_with(&id, "pretrain", "job1", T0, 8);
        let first = state.register(original.clone()).await.unwrap();
        assert!(first.created);
        let again = state.register(original.clone()).await.unwrap();
        assert!(!again.created);
        assert_eq!(again.run.body(), first.run.body());

        for (field, different) in [
            ("name", run_with(&id, "other", "job1", T0, 8)),
            ("job_id", run_with(&id, "pretrain", "job2", T0, 8)),
            ("start_time_ms", run_with(&id, "pretrain", "job1", T0 + 1, 8)),
            ("workers", run_with(&id, "pretrain", "job1", T0, 4)),
        ] {
            match state.register(different).await {
                Err(StateError::Conflict { reason, .. }) => assert!(reason.contains(field), "{reason}"),
                other => panic!("{field}: {other:?}"),
            }
        }
        assert_eq!(state.get(id).await.unwrap().body(), first.run.body());
        service.shutdown().await;
    }

    async fn every_illegal_transition_is_rejected_and_terminal_repeats_are_harmless(store) {
        let (service, _, _store) = service(store).await;
        let state = service.handle();
        let terminal = [
            StatusUpdate::finished(),
            StatusUpdate::errored(Some(0), CauseKind::UserError, "boom"),
            StatusUpdate::aborted(CauseKind::UserInterrupt, "stopped by user"),
        ];
        for (i, first) in terminal.iter().enumerate() {
            let r = run(&format!("t{i}"), T0 + i as u64);
            let id = r.id().clone();
            state.register(r).await.unwrap();
            let ended = state.set_status(id.clone(), first.clone()).await.unwrap();
            // The same terminal status again: success, the stored run returned.
            let repeat = state.set_status(id.clone(), first.clone()).await.unwrap();
            assert_eq!(repeat.body(), ended.body());
            let mut others: Vec<StatusUpdate> =
                terminal.iter().filter(|u| u.status != first.status).cloned().collect();
            others.push(StatusUpdate::aborted(CauseKind::SystemError, "different cause"));
            let mut running = StatusUpdate::finished();
            running.status = RunStatus::Running;
            others.push(running);
            for other in others {
                if other.status == first.status && other.cause == first.cause {
                    continue;
                }
                match state.set_status(id.clone(), other.clone()).await {
                    Err(StateError::IllegalTransition { from, .. }) => assert_eq!(from, first.status),
                    result => panic!("{:?} -> {:?}: {result:?}", first.status, other.status),
                }
            }
            assert_eq!(state.get(id.clone()).await.unwrap().body(), ended.body());
            assert!(matches!(
                state.start_attempt(id.clone(), NewAttempt::new("1", T0 + 10, workers(2, 2, ""))).await,
                Err(StateError::IllegalTransition { .. })
            ));
            assert!(matches!(state.heartbeat(id).await, Err(StateError::IllegalTransition { .. })));
        }
        assert!(matches!(
            state.set_status(RunId::new_v7(), StatusUpdate::finished()).await,
            Err(StateError::NotFound { .. })
        ));
        service.shutdown().await;
    }

    async fn the_actor_stamps_end_time_and_keeps_rays_error_detail(store) {
        let (service, clock, _store) = service(store).await;
        let state = service.handle();
        let r = run("err", T0);
        let id = r.id().clone();
        state.register(r).await.unwrap();
        clock.advance_ms(5_000);
        let trace = format!("Traceback:\n{}ValueError: boom", "é".repeat(60_000));
        let update = StatusUpdate::errored(Some(3), CauseKind::UserError, trace);
        let stored = state.set_status(id, update).await.unwrap().parse().unwrap();
        assert_eq!(stored.run_status(), RunStatus::Errored);
        assert_eq!(stored.end_time_ms(), Some(T0 + 6_000));
        assert!(stored.status_detail().starts_with("Rank 3 worker raised an error. \n"));
        assert!(stored.status_detail().ends_with("ValueError: boom"));
        let trace_chars =
            stored.status_detail().chars().count() - "Rank 3 worker raised an error. \n".len();
        assert_eq!(trace_chars, 50_000);
        assert_eq!(stored.cause().unwrap().failed_world_rank, Some(3));
        assert_eq!(stored.cause().unwrap().kind, CauseKind::UserError);
        // The current attempt ended with the run.
        assert_eq!(stored.attempts().last().unwrap().end_time_ms(), Some(T0 + 6_000));
        service.shutdown().await;
    }

    async fn a_new_attempt_ends_the_previous_one_and_repeating_it_is_a_no_op(store) {
        let (service, mut events) = {
            let (service, _, _store) = service(store).await;
            let events = service.handle().subscribe(None).await.unwrap();
            (service, events)
        };
        let state = service.handle();
        let r = run("elastic", T0);
        let id = r.id().clone();
        state.register(r).await.unwrap();
        let resized = NewAttempt::new("1", T0 + 500, workers(6, 3, "b-"));
        let after = state.start_attempt(id.clone(), resized.clone()).await.unwrap().parse().unwrap();
        assert_eq!(after.workers().len(), 6);
        assert_eq!(after.attempts().len(), 2);
        let first = &after.attempts()[0];
        assert_eq!(first.end_time_ms(), Some(T0 + 500));
        let first_workers = first.workers().unwrap();
        assert_eq!(first_workers.len(), 8);
        assert!(first_workers.iter().all(|w| w.status() == ActorStatus::Dead));
        assert!(after.attempts()[1].workers().is_none());
        assert_eq!(after.attempts()[1].end_time_ms(), None);

        let repeat = state.start_attempt(id.clone(), resized).await.unwrap();
        assert_eq!(repeat.parse().unwrap(), after);
        let clash = NewAttempt::new("1", T0 + 500, workers(2, 2, "c-"));
        assert!(matches!(
            state.start_attempt(id.clone(), clash).await,
            Err(StateError::Conflict { .. })
        ));

        // Re-registering the original metadata is still a no-op after the resize.
        let original = run_with(&id, "elastic", "job1", T0, 8);
        assert!(!state.register(original).await.unwrap().created);

        let kinds: Vec<EventKind> = (0..2).map(|_| events.receiver.try_recv().unwrap().kind).collect();
        assert_eq!(kinds, [EventKind::Registered, EventKind::AttemptStarted]);
        assert!(events.receiver.try_recv().is_err(), "no-ops announce nothing");
        service.shutdown().await;
    }

    async fn bad_input_is_refused_with_the_field_and_changes_nothing(store) {
        let (service, _, _store) = service(store).await;
        let state = service.handle();
        let r = run("bad", T0);
        let id = r.id().clone();
        state.register(r).await.unwrap();
        let before = state.get(id.clone()).await.unwrap();
        let mut nul = StatusUpdate::aborted(CauseKind::UserInterrupt, "a\0b");
        nul.end_time_ms = None;
        match state.set_status(id.clone(), nul).await {
            Err(StateError::Invalid { field, .. }) => assert_eq!(field, "status_detail"),
            other => panic!("{other:?}"),
        }
        match state.set_status(id.clone(), StatusUpdate::finished().ended_at(T0 - 1)).await {
            Err(StateError::Invalid { field, .. }) => assert_eq!(field, "end_time_ms"),
            other => panic!("{other:?}"),
        }
        let mut finished_with_cause = StatusUpdate::finished();
        finished_with_cause.cause = Some(trainstate_schema::RunCause::new(CauseKind::UserError, None));
        assert!(matches!(
            state.set_status(id.clone(), finished_with_cause).await,
            Err(StateError::Invalid { .. })
        ));
        let duplicate_ranks = {
            let mut ws = workers(2, 2, "");
            ws[1] = ws[0].clone();
            ws
        };
        match state.start_attempt(id.clone(), NewAttempt::new("1", T0 + 1, duplicate_ranks)).await {
            Err(StateError::Invalid { field, .. }) => assert_eq!(field, "workers[1].world_rank"),
            other => panic!("{other:?}"),
        }
        assert_eq!(state.get(id).await.unwrap(), before);
        service.shutdown().await;
    }

    async fn delete_removes_only_ended_runs(store) {
        let (service, _, _store) = service(store).await;
        let state = service.handle();
        let r = run("del", T0);
        let id = r.id().clone();
        state.register(r).await.unwrap();
        assert!(matches!(state.delete(id.clone()).await, Err(StateError::IllegalTransition { .. })));
        state.set_status(id.clone(), StatusUpdate::finished()).await.unwrap();
        state.delete(id.clone()).await.unwrap();
        assert!(matches!(state.get(id).await, Err(StateError::NotFound { .. })));
        service.shutdown().await;
    }
}
