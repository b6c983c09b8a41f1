//! The store: restarts, injected panics, group commit, back-pressure,
//! draining shutdown, schema versions.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;

use trainstate_actor::{Faults, launch_state_actor};
use trainstate_client::{RunQuery, StateError, StatusUpdate};
use trainstate_schema::RunId;

use crate::common::{eventually, run};
use crate::stores::on_both_stores;

const T0: u64 = 1_760_000_000_000;

async fn all_json(state: &trainstate_client::StateHandle) -> Vec<String> {
    let page = state.list(RunQuery::all()).await.unwrap();
    page.runs.iter().map(|r| r.body().to_string()).collect()
}

on_both_stores! {
    async fn restart_from_the_store_returns_identical_runs(store) {
        let fresh = store.fresh("restart_from_the_sto").await;
        let service = launch_state_actor(fresh.config()).await.unwrap();
        // A deadline that only ends a hung test: a busy machine is no failure.
        let state = service.handle().with_timeout(Duration::from_secs(30));
        for i in 0..20 {
            let r = run(&format!("r{i}"), T0 + i);
            let id = r.id().clone();
            state.register(r).await.unwrap();
            if i % 3 == 0 {
                state.set_status(id, StatusUpdate::finished().ended_at(T0 + 100)).await.unwrap();
            }
        }
        let before = all_json(&state).await;
        service.shutdown().await;

        let service = launch_state_actor(fresh.config()).await.unwrap();
        assert_eq!(all_json(&service.handle()).await, before);
        assert_eq!(before.len(), 20);
        service.shutdown().await;
    }

    async fn injected_panic_loses_nothing_acknowledged_and_handles_keep_working(store) {
        let fresh = store.fresh("injected_panic_loses").await;
        let faults = Arc::new(Faults::default());
        let service =
            launch_state_actor(fresh.config().with_faults(faults.clone())).await.unwrap();
        let state = service.handle().with_timeout(Duration::from_secs(30));
        let mut acknowledged = Vec::new();
        for i in 0..10 {
            let r = run(&format!("before{i}"), T0 + i);
            acknowledged.push(r.id().clone());
            state.register(r).await.unwrap();
        }

        faults.panic_on_next_write();
        let doomed = run("doomed", T0 + 50);
        match state.register(doomed).await {
            Err(StateError::Unavailable { .. }) => {}
            other => panic!("the request in flight must fail, not hang: {other:?}"),
        }

        // The same handle finds the restarted actor, which reloaded the store.
        let after = run("after", T0 + 60);
        acknowledged.push(after.id().clone());
        state.register(after).await.unwrap();
        for id in &acknowledged {
            state.get(id.clone()).await.unwrap();
        }
        assert_eq!(state.list(RunQuery::all()).await.unwrap().total, 11);
        service.shutdown().await;
    }

    async fn writes_that_arrive_together_are_committed_together(store) {
        let fresh = store.fresh("writes_that_arrive_t").await;
        let faults = Arc::new(Faults::default());
        let service =
            launch_state_actor(fresh.config().with_faults(faults.clone())).await.unwrap();
        let state = service.handle().with_timeout(Duration::from_secs(30));
        // One write to learn the baseline, then hold the writer.
        state.register(run("warmup", T0)).await.unwrap();
        let stats = service.store_stats();
        let before = stats.transactions.load(Ordering::SeqCst);
        faults.hold_writer();
        // The held writer may already have taken one job; the rest queue.
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let state = state.clone();
                tokio::spawn(async move { state.register(run(&format!("g{i}"), T0 + i)).await })
            })
            .collect();
        eventually("100 writes in flight", Duration::from_secs(20), || std::future::ready(service.in_flight_writes() == 100))
        .await;
        faults.release_writer();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let transactions = stats.transactions.load(Ordering::SeqCst) - before;
        assert!((1..=2).contains(&transactions), "100 queued writes took {transactions} transactions");
        assert_eq!(state.list(RunQuery::all()).await.unwrap().total, 101);
        service.shutdown().await;
    }

    async fn writes_past_the_in_flight_bound_are_refused_as_overloaded(store) {
        let fresh = store.fresh("writes_past_the_in_f").await;
        let faults = Arc::new(Faults::default());
        let config = fresh
            .config()
            .with_max_in_flight_writes(5)
            .with_faults(faults.clone());
        let service = launch_state_actor(config).await.unwrap();
        let state = service.handle().with_timeout(Duration::from_secs(30));
        faults.hold_writer();
        let tasks: Vec<_> = (0..5)
            .map(|i| {
                let state = state.clone();
                tokio::spawn(async move { state.register(run(&format!("o{i}"), T0 + i)).await })
            })
            .collect();
        eventually("5 writes in flight", Duration::from_secs(20), || std::future::ready(service.in_flight_writes() == 5))
            .await;
        let refused = run("one too many", T0 + 9);
        let refused_id = refused.id().clone();
        assert!(matches!(
            state.register(refused).await,
            Err(StateError::Overloaded { in_flight: Some(5) })
        ));
        faults.release_writer();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        // Refused means nothing was stored.
        assert!(matches!(state.get(refused_id).await, Err(StateError::NotFound { .. })));
        service.shutdown().await;
    }

    async fn shutdown_commits_queued_writes_first(store) {
        let fresh = store.fresh("shutdown_commits_que").await;
        let service = launch_state_actor(fresh.config()).await.unwrap();
        let state = service.handle().with_timeout(Duration::from_secs(30));
        let ids: Vec<RunId> = (0..200).map(|_| RunId::new_v7()).collect();
        let mut requests: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let state = state.clone();
                let r = crate::common::run_with(id, "drain", "job", T0 + i as u64, 8);
                Box::pin(async move { state.register(r).await })
            })
            .collect();
        // A local handle sends its request in its first poll (the actor is
        // found, the message put in its mailbox, then the answer awaited):
        // polling each request once, here, queues all 200 before the
        // shutdown is asked for, whatever order a scheduler would pick.
        let mut answers: Vec<Option<Result<_, StateError>>> = vec![None; requests.len()];
        std::future::poll_fn(|cx| {
            for (request, answer) in requests.iter_mut().zip(&mut answers) {
                if let Poll::Ready(done) = request.as_mut().poll(cx) {
                    *answer = Some(done);
                }
            }
            Poll::Ready(())
        })
        .await;
        service.shutdown().await;
        let mut acknowledged = Vec::new();
        for ((request, answer), id) in requests.into_iter().zip(answers).zip(&ids) {
            let answer = match answer {
                Some(answer) => answer,
                None => request.await,
            };
            if answer.is_ok() {
                acknowledged.push(id.clone());
            }
        }
        assert_eq!(acknowledged.len(), 200, "queued requests are answered before the actor stops");
        let service = launch_state_actor(fresh.config()).await.unwrap();
        for id in &acknowledged {
            service.handle().get(id.clone()).await.unwrap();
        }
        service.shutdown().await;
    }

    async fn a_failed_commit_answers_unavailable_and_costs_no_restart(store) {
        let fresh = store.fresh("a_failed_commit_answ").await;
        let faults = Arc::new(Faults::default());
        let service = launch_state_actor(fresh.config().with_faults(faults.clone()))
            .await
            .unwrap();
        let state = service.handle();
        let kept = run("kept", T0);
        state.register(kept.clone()).await.unwrap();

        faults.fail_next_commit();
        let lost = run("lost", T0 + 1);
        match state.register(lost.clone()).await {
            Err(StateError::Unavailable { reason }) => assert!(
                reason.contains("nothing of this request was written")
                    || reason.contains("may not have taken effect"),
                "{reason}"
            ),
            other => panic!("a failed commit must not be acknowledged: {other:?}"),
        }
        // No restart: the working state is the committed one again at once.
        // The failed write is not there, as its caller was told; the
        // acknowledged one is; and the next write works.
        let after = run("after", T0 + 2);
        state.register(after.clone()).await.unwrap();
        state.get(kept.id().clone()).await.unwrap();
        state.get(after.id().clone()).await.unwrap();
        assert!(matches!(state.get(lost.id().clone()).await, Err(StateError::NotFound { .. })));
        assert_eq!(service.store_stats().failures.load(Ordering::SeqCst), 1);
        assert_eq!(service.actor_restarts(), 0);
        service.shutdown().await;
    }

    async fn a_store_written_by_a_newer_version_is_refused_clearly(store) {
        let fresh = store.fresh("newer").await;
        match fresh.url() {
            None => {
                let conn = rusqlite::Connection::open(fresh.sqlite_path()).unwrap();
                conn.pragma_update(None, "user_version", 99).unwrap();
            }
            Some(url) => {
                crate::stores::connect(url)
                    .await
                    .batch_execute(
                        "CREATE TABLE trainstate_version (
                             singleton BOOLEAN PRIMARY KEY DEFAULT TRUE, version INTEGER NOT NULL);
                         INSERT INTO trainstate_version (version) VALUES (99);",
                    )
                    .await
                    .unwrap();
            }
        }
        let err = launch_state_actor(fresh.config()).await.unwrap_err();
        let message = err.to_string();
        assert!(message.contains("schema version 99"), "{message}");
        assert!(message.contains("upgrade trainstate"), "{message}");
    }

    /// A run's indexed fields are kept in columns beside its JSON, and a
    /// load builds records from them. Runs whose columns are gone (stored
    /// before the columns existed, as on PostgreSQL before its first load
    /// since the upgrade, or edited by hand) are read from their JSON,
    /// served and filtered the same, and their columns are written again.
    async fn runs_without_their_columns_load_from_their_json_and_get_them_again(store) {
        let fresh = store.fresh("columns_gone").await;
        let service = launch_state_actor(fresh.config()).await.unwrap();
        let state = service.handle().with_timeout(Duration::from_secs(30));
        for i in 0..6 {
            let r = run(&format!("r{i}"), T0 + i);
            let id = r.id().clone();
            state.register(r).await.unwrap();
            if i % 2 == 0 {
                state.set_status(id, StatusUpdate::finished().ended_at(T0 + 100)).await.unwrap();
            }
        }
        let before = all_json(&state).await;
        service.shutdown().await;

        let forget = "UPDATE {runs} SET job_id = NULL, node_ids = NULL, json_check = NULL";
        let unindexed = "SELECT count(*) FROM {runs} WHERE json_check IS NULL";
        let sql = |text: &str, runs: &str| text.replace("{runs}", runs);
        let count_unindexed = async || -> i64 {
            match fresh.url() {
                None => rusqlite::Connection::open(fresh.sqlite_path())
                    .unwrap()
                    .query_row(&sql(unindexed, "runs"), [], |r| r.get(0))
                    .unwrap(),
                Some(url) => crate::stores::connect(url)
                    .await
                    .query_one(&sql(unindexed, "trainstate_runs"), &[])
                    .await
                    .unwrap()
                    .get(0),
            }
        };
        match fresh.url() {
            None => {
                let conn = rusqlite::Connection::open(fresh.sqlite_path()).unwrap();
                conn.execute(&sql(forget, "runs"), []).unwrap();
            }
            Some(url) => {
                let forget = sql(forget, "trainstate_runs");
                crate::stores::connect(url).await.execute(&forget, &[]).await.unwrap();
            }
        }
        assert_eq!(count_unindexed().await, 6);

        let service = launch_state_actor(fresh.config()).await.unwrap();
        let state = service.handle().with_timeout(Duration::from_secs(30));
        assert_eq!(all_json(&state).await, before);
        assert_eq!(state.list(RunQuery::all().job_id("job1")).await.unwrap().total, 6);
        assert_eq!(state.list(RunQuery::all().node_id("node1")).await.unwrap().total, 6);
        service.shutdown().await;
        assert_eq!(count_unindexed().await, 0, "the load wrote the columns again");

        // And the next load reads the same runs from the columns.
        let service = launch_state_actor(fresh.config()).await.unwrap();
        let state = service.handle().with_timeout(Duration::from_secs(30));
        assert_eq!(all_json(&state).await, before);
        assert_eq!(state.list(RunQuery::all().job_id("job1")).await.unwrap().total, 6);
        assert_eq!(state.list(RunQuery::all().node_id("node1")).await.unwrap().total, 6);
        service.shutdown().await;
    }
}
