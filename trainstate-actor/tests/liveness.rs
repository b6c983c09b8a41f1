//! Leases and retention, on an injected clock.

use std::sync::Arc;
use std::time::Duration;

use trainstate_actor::{ManualClock, Retention, StateConfig, launch_state_actor};
use trainstate_client::{EventKind, RunQuery, StatusUpdate};
use trainstate_schema::{CauseKind, RunStatus};

use crate::common::run;
use crate::stores::{Fresh, on_both_stores};

const T0: u64 = 1_760_000_000_000;
const LEASE: Duration = Duration::from_secs(60);

fn config(fresh: &Fresh, clock: &Arc<ManualClock>) -> StateConfig {
    fresh
        .config()
        .with_clock(clock.clone())
        .with_lease(LEASE)
        // The test drives the sweep itself.
        .with_sweep_interval(Duration::from_secs(3600))
}

on_both_stores! {
    async fn lease_expiry_aborts_only_live_runs_whose_lease_expired(store) {
        let Some(fresh) = store.fresh("lease_expiry_aborts_").await else { return };
        let clock = Arc::new(ManualClock::new(T0));
        let service = launch_state_actor(config(&fresh, &clock)).await.unwrap();
        let state = service.handle();
        let mut events = state.subscribe(None).await.unwrap();
        let (silent, beating, ended) = (run("silent", T0), run("beating", T0), run("ended", T0));
        for r in [&silent, &beating, &ended] {
            state.register(r.clone()).await.unwrap();
        }
        state.set_status(ended.id().clone(), StatusUpdate::finished()).await.unwrap();

        clock.advance_ms(40_000);
        state.heartbeat(beating.id().clone()).await.unwrap();
        assert!(state.sweep_leases().await.unwrap().is_empty(), "nobody's lease has expired yet");

        clock.advance_ms(30_000); // silent: 70 s without a word; beating: 30 s.
        let aborted = state.sweep_leases().await.unwrap();
        assert_eq!(aborted, [silent.id().clone()]);

        let stored = state.get_run(silent.id().clone()).await.unwrap();
        assert_eq!(stored.run_status(), RunStatus::Aborted);
        assert_eq!(stored.cause().unwrap().kind, CauseKind::LostController);
        assert_eq!(stored.end_time_ms(), Some(T0 + 70_000));
        assert!(stored.status_detail().contains("stopped heartbeating"), "{}", stored.status_detail());
        assert!(
            stored.status_detail().contains("(last at 2025-10-09T08:53:20.000Z)"),
            "says when it was last heard from, for a person: {}",
            stored.status_detail()
        );
        assert!(stored.status_detail().contains("for 70 s"), "{}", stored.status_detail());
        assert_eq!(state.get_run(beating.id().clone()).await.unwrap().run_status(), RunStatus::Running);
        assert_eq!(state.get_run(ended.id().clone()).await.unwrap().run_status(), RunStatus::Finished);

        let kinds: Vec<_> =
            std::iter::from_fn(|| events.receiver.try_recv().ok()).map(|e| e.kind).collect();
        assert_eq!(kinds.last(), Some(&EventKind::StatusChanged), "the abort is announced");

        // The controller's own late report replaces the lost-controller abort, once.
        let finished = state.set_status(silent.id().clone(), StatusUpdate::finished()).await.unwrap();
        assert_eq!(finished.parse().unwrap().run_status(), RunStatus::Finished);
        assert!(
            state
                .set_status(silent.id().clone(), StatusUpdate::aborted(CauseKind::UserInterrupt, ""))
                .await
                .is_err()
        );
        service.shutdown().await;
    }

    async fn after_a_restart_every_live_run_gets_a_fresh_lease(store) {
        let Some(fresh) = store.fresh("after_a_restart_ever").await else { return };
        let clock = Arc::new(ManualClock::new(T0));
        let durable = |clock: &Arc<ManualClock>| config(&fresh, clock);
        let service = launch_state_actor(durable(&clock)).await.unwrap();
        let r = run("survivor", T0);
        service.handle().register(r.clone()).await.unwrap();
        service.shutdown().await;

        clock.advance_ms(10 * 60_000); // The head was down for ten minutes.
        let service = launch_state_actor(durable(&clock)).await.unwrap();
        assert!(service.handle().sweep_leases().await.unwrap().is_empty());
        clock.advance_ms(61_000);
        assert_eq!(service.handle().sweep_leases().await.unwrap(), [r.id().clone()]);
        service.shutdown().await;
    }

    async fn retention_evicts_exactly_the_oldest_ended_runs(store) {
        let Some(fresh) = store.fresh("retention_evicts_exa").await else { return };
        let clock = Arc::new(ManualClock::new(T0 + 100_000));
        let service =
            launch_state_actor(config(&fresh, &clock).with_retention(Retention::max_runs(5)))
                .await
                .unwrap();
        let state = service.handle();
        // Runs 0..4 live; 1 and 3 end.
        let runs: Vec<_> = (0..5).map(|i| run(&format!("r{i}"), T0 + i)).collect();
        for r in &runs {
            state.register(r.clone()).await.unwrap();
        }
        for i in [1, 3] {
            state.set_status(runs[i].id().clone(), StatusUpdate::finished()).await.unwrap();
        }
        // Two more runs: the two ended runs go, oldest first; no live run goes.
        let extra: Vec<_> = (5..7).map(|i| run(&format!("r{i}"), T0 + i)).collect();
        let mut events = state.subscribe(None).await.unwrap();
        state.register(extra[0].clone()).await.unwrap();
        let listed = |page: trainstate_client::RunPage| -> Vec<String> {
            page.runs.iter().map(|r| r.parse().unwrap().name().to_owned()).collect()
        };
        assert_eq!(listed(state.list(RunQuery::all()).await.unwrap()), ["r5", "r4", "r3", "r2", "r0"]);
        state.register(extra[1].clone()).await.unwrap();
        assert_eq!(listed(state.list(RunQuery::all()).await.unwrap()), ["r6", "r5", "r4", "r2", "r0"]);
        let evicted: Vec<_> = std::iter::from_fn(|| events.receiver.try_recv().ok())
            .filter(|e| e.kind == EventKind::Evicted)
            .map(|e| e.run_id)
            .collect();
        assert_eq!(evicted, [runs[1].id().clone(), runs[3].id().clone()]);

        // Only live runs left over the cap: nothing more is evicted.
        state.register(run("r7", T0 + 7)).await.unwrap();
        assert_eq!(state.list(RunQuery::all()).await.unwrap().total, 6);
        service.shutdown().await;
    }

    async fn retention_by_age_evicts_runs_that_ended_long_ago(store) {
        let Some(fresh) = store.fresh("retention_by_age_evi").await else { return };
        let clock = Arc::new(ManualClock::new(T0));
        let retention = Retention::max_runs(100).with_max_age(Duration::from_secs(3600));
        let service =
            launch_state_actor(config(&fresh, &clock).with_retention(retention)).await.unwrap();
        let state = service.handle();
        let (old, recent, live) = (run("old", T0), run("recent", T0), run("live", T0));
        for r in [&old, &recent, &live] {
            state.register(r.clone()).await.unwrap();
        }
        state.set_status(old.id().clone(), StatusUpdate::finished()).await.unwrap();
        clock.advance_ms(3_000_000);
        state.set_status(recent.id().clone(), StatusUpdate::finished()).await.unwrap();
        state.heartbeat(live.id().clone()).await.unwrap();
        clock.advance_ms(700_000); // old ended 3,700 s ago, recent 700 s ago.
        state.heartbeat(live.id().clone()).await.unwrap();
        state.sweep_leases().await.unwrap();
        let names: Vec<String> = state
            .list(RunQuery::all())
            .await
            .unwrap()
            .runs
            .iter()
            .map(|r| r.parse().unwrap().name().to_owned())
            .collect();
        assert_eq!(names.len(), 2);
        assert!(!names.contains(&"old".to_owned()));
        service.shutdown().await;
    }

    async fn regression_a_head_clock_behind_the_controller_still_aborts_a_silent_run(store) {
        let Some(fresh) = store.fresh("regression_a_head_cl").await else { return };
        // The controller stamped its start 10 minutes ahead of the head's clock.
        let clock = Arc::new(ManualClock::new(T0));
        let service = launch_state_actor(config(&fresh, &clock)).await.unwrap();
        let state = service.handle();
        let ahead = run("ahead", T0 + 600_000);
        state.register(ahead.clone()).await.unwrap();
        clock.advance_ms(61_000);
        assert_eq!(state.sweep_leases().await.unwrap(), [ahead.id().clone()]);
        let stored = state.get_run(ahead.id().clone()).await.unwrap();
        assert_eq!(stored.run_status(), RunStatus::Aborted);
        assert_eq!(stored.end_time_ms(), Some(T0 + 600_000), "the end is never before the start");
        service.shutdown().await;
    }
}
