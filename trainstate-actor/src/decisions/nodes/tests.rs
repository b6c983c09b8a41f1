use super::*;

const DAY_MS: u64 = 86_400_000;
const T0: u64 = 1_764_547_200_000;

/// A run of two ranks, rank 0 on `node0` and rank 1 on `node1`, whose one
/// attempt ended with `cause` (JSON, or `null`).
fn run_json(node0: &str, node1: &str, at_ms: u64, cause: &str) -> String {
    format!(
        r#"{{"start_time_ms":{at_ms},"end_time_ms":{end},"cluster":"west",
        "workers":[],
        "attempts":[{{"start_time_ms":{at_ms},"end_time_ms":{end},"cause":{cause},
          "workers":[{{"world_rank":0,"node_id":"id0","node_name":"{node0}"}},
                     {{"world_rank":1,"node_id":"{node1}"}}]}}],
        "cause":{cause}}}"#,
        end = at_ms + 1000
    )
}

fn oom(rank: u32) -> String {
    format!(r#"{{"kind":"OOM","class":"INFRASTRUCTURE","failed_world_rank":{rank}}}"#)
}

#[test]
fn a_run_counts_its_attempt_on_each_node_and_its_failure_once_on_the_failed_ranks_node() {
    let c = contribution_of_json(&run_json("gpu1", "gpu2", T0, &oom(1)));
    assert_eq!(c.cluster.as_deref(), Some("west"));
    let tags: Vec<(&str, Tag)> = c.events.iter().map(|(n, _, t)| (&**n, *t)).collect();
    assert_eq!(
        tags,
        [
            ("gpu1", Tag::Attempt(1)),
            ("gpu2", Tag::Attempt(1)),
            ("gpu2", Tag::Failure(CauseKind::Oom, CauseClass::Infrastructure)),
        ]
    );
    assert!(contribution_of_json("not json").events.is_empty());
}

#[test]
fn two_infrastructure_failures_in_the_window_make_a_suspect_and_removal_takes_them_back() {
    let mut ledger = NodeLedger::default();
    let runs: Vec<Contribution> = (0..3)
        .map(|i| contribution_of_json(&run_json("gpu1", "bad", T0 + i * DAY_MS, &oom(1))))
        .collect();
    for (key, run) in runs.iter().enumerate() {
        ledger.add(key as RunKey, run);
    }
    let clean = contribution_of_json(&run_json("gpu1", "gpu3", T0, "null"));
    ledger.add(9, &clean);
    let all = ledger.summaries(T0, None);
    assert_eq!(all[0].node, "bad");
    assert!(all[0].suspect);
    assert_eq!(all[0].failures.infrastructure, 3);
    assert!(all[0].reason.as_deref().unwrap().starts_with("3 infrastructure failures since"));
    assert_eq!(all.iter().filter(|s| s.suspect).count(), 1);
    assert_eq!(all.iter().find(|s| s.node == "gpu1").unwrap().attempts, 4);
    // A window that holds only the last failure: no suspect.
    assert!(!ledger.summaries(T0 + 2 * DAY_MS, None)[0].suspect);
    // Another cluster's filter finds nothing.
    assert!(ledger.summaries(T0, Some("east")).is_empty());
    let detail = ledger.detail("bad", None, T0);
    assert_eq!(detail.len(), 1);
    assert_eq!(detail[0].failures.iter().map(|f| f.0).collect::<Vec<_>>(), [2, 1, 0]);
    assert!(ledger.suspect_reason("bad", Some("west"), T0).is_some());
    assert!(ledger.suspect_reason("bad", None, T0).is_none(), "keyed by cluster too");
    ledger.remove(2, &runs[2]);
    ledger.remove(1, &runs[1]);
    assert!(!ledger.summaries(T0, None).iter().any(|s| s.suspect));
    ledger.remove(0, &runs[0]);
    assert!(ledger.detail("bad", None, T0).is_empty(), "a node with no events is forgotten");
    assert_eq!(ledger.summaries(T0, None).len(), 2);
}

#[test]
fn application_failures_a_lost_controller_and_signals_from_no_one_known_make_no_suspect() {
    let kinds = [
        (CauseKind::UserError, CauseClass::Application),
        (CauseKind::UserError, CauseClass::Application),
        (CauseKind::LostController, CauseClass::Infrastructure),
        (CauseKind::Preempted, CauseClass::Interrupted),
        // A person's kill -9 or the code's segfault as often as the node's.
        (CauseKind::SystemError, CauseClass::Infrastructure),
        (CauseKind::SystemError, CauseClass::Infrastructure),
        (CauseKind::SystemError, CauseClass::Infrastructure),
    ];
    assert_eq!(verdict(&kinds, T0), None);
    let infra = [
        (CauseKind::Hardware, CauseClass::Infrastructure),
        (CauseKind::NodeLost, CauseClass::Infrastructure),
    ];
    let reason = verdict(&infra, T0).unwrap();
    assert!(reason.contains("1 NODE_LOST, 1 HARDWARE"), "{reason}");
}

#[test]
fn a_node_keeps_a_bounded_number_of_events_the_newest() {
    let mut ledger = NodeLedger::default();
    let one =
        |at: u64| Contribution { cluster: None, events: vec![("n".into(), at, Tag::Attempt(1))] };
    for i in 0..(MAX_EVENTS_PER_NODE as u64 + 10) {
        ledger.add(i as RunKey, &one(T0 + i));
    }
    assert_eq!(ledger.summaries(0, None)[0].attempts as usize, MAX_EVENTS_PER_NODE);
    assert_eq!(ledger.oldest_ms(), Some(T0 + 10));
}

#[test]
fn stall_culprits_and_new_stragglers_are_named_on_their_nodes() {
    let json = r#"{"start_time_ms":1,"workers":[{"world_rank":0,"node_id":"a"},{"world_rank":1,"node_id":"b"}],
      "health_history":[{"state":"PROGRESSING","at_ms":5,"stragglers":[1]},
                        {"state":"PROGRESSING","at_ms":6,"stragglers":[1]},
                        {"state":"STALLED","at_ms":7,"ranks":[0,1]}]}"#;
    let c = contribution_of_json(json);
    let named: Vec<(&str, u64, Tag)> = c.events.iter().map(|(n, at, t)| (&**n, *at, *t)).collect();
    assert_eq!(
        named,
        [
            ("a", 1, Tag::Attempt(1)),
            ("b", 1, Tag::Attempt(1)),
            ("b", 5, Tag::Straggler),
            ("a", 7, Tag::StallSuspect),
            ("b", 7, Tag::StallSuspect),
        ]
    );
}

#[test]
fn an_attempt_weighs_each_node_by_its_gpus_or_its_workers_when_it_has_none() {
    let with_gpus = r#"{"start_time_ms":1,"workers":[
        {"world_rank":0,"node_id":"a","resources":{"GPU":2.0}},
        {"world_rank":1,"node_id":"a","gpu_ids":[0,1]},
        {"world_rank":2,"node_id":"b","resources":{"GPU":0.5}}]}"#;
    let c = contribution_of_json(with_gpus);
    let tags: Vec<(&str, Tag)> = c.events.iter().map(|(n, _, t)| (&**n, *t)).collect();
    assert_eq!(tags, [("a", Tag::Attempt(4)), ("b", Tag::Attempt(1))]);
    let without = r#"{"start_time_ms":1,"workers":[
        {"world_rank":0,"node_id":"a"},{"world_rank":1,"node_id":"a"},
        {"world_rank":2,"node_id":"b"}]}"#;
    let c = contribution_of_json(without);
    let tags: Vec<(&str, Tag)> = c.events.iter().map(|(n, _, t)| (&**n, *t)).collect();
    assert_eq!(tags, [("a", Tag::Attempt(2)), ("b", Tag::Attempt(1))]);
    // The weight lives in the event's padding: an event is still 16 bytes.
    assert_eq!(std::mem::size_of::<Event>(), 16);
}
