//! Listing: order, filters, keyset paging, events.

use std::collections::HashSet;

use trainstate_actor::launch_state_actor;
use trainstate_client::{
    Cursor, EventKind, NewAttempt, RunQuery, StateError, StateHandle, StatusUpdate,
};
use trainstate_schema::{CauseKind, RunId, RunStatus};

use crate::common::{run, run_with, workers};
use crate::stores::on_both_stores;

const T0: u64 = 1_760_000_000_000;

async fn ids_of_all_pages(state: &StateHandle, query: RunQuery) -> Vec<RunId> {
    let mut ids = Vec::new();
    let mut query = query;
    loop {
        let page = state.list(query.clone()).await.unwrap();
        ids.extend(page.runs.iter().map(|r| r.parse().unwrap().id().clone()));
        match page.next_cursor {
            Some(cursor) => query = query.after(cursor),
            None => return ids,
        }
    }
}

on_both_stores! {
    async fn paging_visits_every_run_exactly_once_while_runs_are_added(store) {
        let fresh = store.fresh("paging_visits_every_").await;
        let service = launch_state_actor(fresh.config())
            .await
            .unwrap();
        let state = service.handle();
        // Some runs share a start time: the id breaks the tie.
        let present: Vec<_> = (0..250).map(|i| run(&format!("p{i}"), T0 + i / 3)).collect();
        for r in &present {
            state.register(r.clone()).await.unwrap();
        }
        let mut seen = Vec::new();
        let mut query = RunQuery::new().limit(7);
        let mut added = 0u64;
        loop {
            let page = state.list(query.clone()).await.unwrap();
            seen.extend(page.runs.iter().map(|r| r.parse().unwrap().id().clone()));
            // Runs added between pages, newer and older than the cursor.
            for start in [T0 + 10_000 + added, T0 + added % 80] {
                state.register(run(&format!("new{added}"), start)).await.unwrap();
                added += 1;
            }
            match page.next_cursor {
                Some(cursor) => query = query.after(cursor),
                None => break,
            }
        }
        let unique: HashSet<_> = seen.iter().cloned().collect();
        assert_eq!(unique.len(), seen.len(), "no run is visited twice");
        for r in &present {
            assert!(
                unique.contains(r.id()),
                "{} was present on the first page and never visited",
                r.name()
            );
        }
        service.shutdown().await;
    }

    async fn runs_are_newest_first_and_ties_go_by_id_descending(store) {
        let fresh = store.fresh("runs_are_newest_firs").await;
        let service =
            launch_state_actor(fresh.config()).await.unwrap();
        let state = service.handle();
        let ids: Vec<RunId> =
            ["a", "c", "b"].iter().map(|s| RunId::parse(&s.repeat(32)).unwrap()).collect();
        for id in &ids {
            state.register(run_with(id, "same-start", "job", T0, 2)).await.unwrap();
        }
        state.register(run("newest", T0 + 1)).await.unwrap();
        let listed = ids_of_all_pages(&state, RunQuery::new().limit(1)).await;
        assert_eq!(listed.len(), 4);
        assert_eq!(&listed[1..], [ids[1].clone(), ids[2].clone(), ids[0].clone()]);
        service.shutdown().await;
    }

    async fn filters_by_status_job_name_node_and_count_the_total(store) {
        let fresh = store.fresh("filters_by_status_jo").await;
        let service = launch_state_actor(fresh.config())
            .await
            .unwrap();
        let state = service.handle();
        let a = run_with(&RunId::new_v7(), "llama-pretrain", "job-a", T0, 8);
        let b = run_with(&RunId::new_v7(), "llama-finetune", "job-b", T0 + 1, 8);
        let c = run_with(&RunId::new_v7(), "bert", "job-a", T0 + 2, 8);
        for r in [&a, &b, &c] {
            state.register(r.clone()).await.unwrap();
        }
        state
            .set_status(b.id().clone(), StatusUpdate::errored(None, CauseKind::SystemError, "oom"))
            .await
            .unwrap();
        // c moved to other nodes: it still had workers on node0 in its first attempt.
        state
            .start_attempt(c.id().clone(), NewAttempt::new("1", T0 + 5, workers(4, 4, "z-")))
            .await
            .unwrap();

        let names = |query: RunQuery| {
            let state = state.clone();
            async move {
                let page = state.list(query.limit(1000)).await.unwrap();
                let names: Vec<String> =
                    page.runs.iter().map(|r| r.parse().unwrap().name().to_owned()).collect();
                assert_eq!(page.total, names.len());
                names
            }
        };
        assert_eq!(names(RunQuery::new().statuses([RunStatus::Errored])).await, ["llama-finetune"]);
        assert_eq!(
            names(RunQuery::new().statuses([RunStatus::Running, RunStatus::Errored])).await.len(),
            3
        );
        assert_eq!(names(RunQuery::new().job_id("job-a")).await, ["bert", "llama-pretrain"]);
        assert_eq!(
            names(RunQuery::new().name_contains("llama")).await,
            ["llama-finetune", "llama-pretrain"]
        );
        assert_eq!(names(RunQuery::new().node_id("z-node0")).await, ["bert"]);
        assert_eq!(names(RunQuery::new().node_id("node1")).await.len(), 3);
        assert_eq!(names(RunQuery::new().node_ip("10.0.0.2")).await.len(), 3);
        assert!(names(RunQuery::new().node_ip("10.9.9.9")).await.is_empty());

        let page = state.list(RunQuery::new().limit(2)).await.unwrap();
        assert_eq!((page.runs.len(), page.total), (2, 3));
        assert!(page.next_cursor.is_some());
        service.shutdown().await;
    }

    async fn bad_limits_and_cursors_are_refused(store) {
        let fresh = store.fresh("bad_limits_and_curso").await;
        let service = launch_state_actor(fresh.config())
            .await
            .unwrap();
        let state = service.handle();
        for limit in [0, 1001] {
            match state.list(RunQuery::new().limit(limit)).await {
                Err(StateError::Invalid { field, .. }) => assert_eq!(field, "limit"),
                other => panic!("{other:?}"),
            }
        }
        assert!("zz".parse::<Cursor>().is_err());
        assert!("".parse::<Cursor>().is_err());
        let cursor = Cursor::new(T0, RunId::new_v7());
        assert_eq!(cursor.to_string().parse::<Cursor>().unwrap(), cursor);
        service.shutdown().await;
    }

    async fn a_subscriber_resumes_from_the_backlog_without_gaps(store) {
        let fresh = store.fresh("a_subscriber_resumes").await;
        let service = launch_state_actor(fresh.config())
            .await
            .unwrap();
        let state = service.handle();
        state.register(run("e0", T0)).await.unwrap();
        let first = state.subscribe(None).await.unwrap();
        // Sequence numbers start at the view's epoch (see `view::epoch`).
        let s = first.last_seq - 1;
        assert!(first.backlog.is_none());
        for i in 1..5 {
            state.register(run(&format!("e{i}"), T0 + i)).await.unwrap();
        }
        let resumed = state.subscribe(Some(s + 2)).await.unwrap();
        let backlog = resumed.backlog.unwrap();
        let seqs: Vec<u64> = backlog.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [s + 3, s + 4, s + 5]);
        assert!(backlog.iter().all(|e| e.kind == EventKind::Registered && e.run.is_some()));
        let mut receiver = first.receiver;
        let live: Vec<u64> = std::iter::from_fn(|| receiver.try_recv().ok()).map(|e| e.seq).collect();
        assert_eq!(live, [s + 2, s + 3, s + 4, s + 5]);
        assert!(
            state.subscribe(Some(s + 99)).await.unwrap().backlog.is_none(),
            "the future is not resumable"
        );
        assert!(receiver.try_recv().is_err(), "nothing more happened");
        service.shutdown().await;
    }
}

/// Issue 10, item 8: an event id from an earlier head (here one that
/// stopped before this one started) never matches this head's events, even
/// when this head has published as many: resuming from it gets a snapshot,
/// never a backlog that silently skips changes.
#[tokio::test]
async fn regression_an_event_id_from_an_earlier_head_is_answered_with_a_snapshot() {
    use trainstate_actor::StateConfig;
    let earlier = launch_state_actor(
        StateConfig::in_memory().with_name(crate::common::unique_name("epoch-a")),
    )
    .await
    .unwrap();
    earlier.handle().register(run("a0", T0)).await.unwrap();
    let old_id = earlier.handle().subscribe(None).await.unwrap().last_seq;
    earlier.shutdown().await;

    let later = launch_state_actor(
        StateConfig::in_memory().with_name(crate::common::unique_name("epoch-b")),
    )
    .await
    .unwrap();
    let state = later.handle();
    for i in 0..3 {
        state.register(run(&format!("b{i}"), T0 + i)).await.unwrap();
    }
    let now = state.subscribe(None).await.unwrap().last_seq;
    assert_ne!(old_id >> 26, now >> 26, "a later head names another stream");
    let resumed = state.subscribe(Some(old_id)).await.unwrap();
    assert!(resumed.backlog.is_none(), "an id from another head must be answered with a snapshot");
    // This head's own ids still resume without a gap.
    let own = state.subscribe(Some(now - 1)).await.unwrap().backlog.unwrap();
    assert_eq!(own.iter().map(|e| e.seq).collect::<Vec<_>>(), [now]);
    later.shutdown().await;
}
