//! The rules of a worker group on their own (`WorkerList`) and the name
//! rule (`validate_name`): the same rules, paths and messages as a run's.

use serde_json::json;
use trainstate_schema::limits::{MAX_NAME_LEN, MAX_WORKERS};
use trainstate_schema::{Rule, TrainWorkerInfo, TrainWorkerInfoDraft, WorkerList, validate_name};

use crate::common::{read_run, valid_run};
use crate::invalid::CASES;

fn drafts(workers: &serde_json::Value) -> Vec<TrainWorkerInfoDraft> {
    serde_json::from_value(workers.clone()).unwrap()
}

#[test]
fn a_worker_list_breaks_a_run_s_worker_rules_with_the_same_path_and_message() {
    let (mut from_drafts, mut from_workers) = (0, 0);
    for (what, mutate, field, _) in CASES.iter().filter(|case| case.2.starts_with("workers[")) {
        let mut doc = valid_run();
        mutate(&mut doc);
        let expected = read_run(&doc.to_string()).unwrap_err();
        let Ok(drafts) =
            serde_json::from_value::<Vec<TrainWorkerInfoDraft>>(doc["workers"].clone())
        else {
            continue; // A structural error: no draft to check.
        };
        let err = WorkerList::try_from(drafts.clone()).unwrap_err();
        assert_eq!(err.field(), *field, "{what}");
        assert_eq!(err.rule().to_string(), expected.message, "{what}");
        from_drafts += 1;

        // Validated workers: only the rules across workers are left.
        let Ok(workers) = drafts
            .into_iter()
            .map(TrainWorkerInfoDraft::validate)
            .collect::<Result<Vec<TrainWorkerInfo>, _>>()
        else {
            continue;
        };
        let err = WorkerList::try_from(workers).unwrap_err();
        assert_eq!((err.field(), err.rule().to_string()), (*field, expected.message), "{what}");
        from_workers += 1;
    }
    assert!(from_drafts >= 9 && from_workers >= 5, "{from_drafts} {from_workers}");
}

#[test]
fn a_valid_worker_list_is_sorted_by_world_rank_as_a_run_s_workers_are() {
    let doc = valid_run();
    let run = read_run(&doc.to_string()).unwrap();
    let mut shuffled = drafts(&doc["workers"]);
    shuffled.reverse();
    let list = WorkerList::try_from(shuffled.clone()).unwrap();
    assert_eq!(&*list, run.workers());

    let validated: Vec<TrainWorkerInfo> =
        shuffled.into_iter().map(|d| d.validate().unwrap()).collect();
    assert_eq!(WorkerList::try_from(validated).unwrap(), list);
    assert_eq!(serde_json::to_value(&list).unwrap(), json!(run.workers()));
    assert!(WorkerList::try_from(Vec::<TrainWorkerInfo>::new()).unwrap().is_empty());
}

#[test]
fn a_worker_list_has_at_most_max_workers() {
    let worker = drafts(&valid_run()["workers"]).swap_remove(0).validate().unwrap();
    let err = WorkerList::try_from(vec![worker; MAX_WORKERS + 1]).unwrap_err();
    assert_eq!(err.field(), "workers");
    assert_eq!(err.rule(), &Rule::TooMany { max: MAX_WORKERS });
}

#[test]
fn validate_name_is_the_rule_a_run_applies_to_its_names() {
    let cases: &[(&str, Option<Rule>)] = &[
        ("pretrain", None),
        (&"é".repeat(MAX_NAME_LEN), None),
        ("", Some(Rule::Empty)),
        (&"é".repeat(MAX_NAME_LEN + 1), Some(Rule::TooLong { max: MAX_NAME_LEN })),
        ("tab\there", Some(Rule::ControlCharacter)),
        ("nul\0", Some(Rule::ControlCharacter)),
    ];
    for (text, rule) in cases {
        let got = validate_name("job_id", text);
        assert_eq!(got.as_ref().err().map(|e| e.rule()), rule.as_ref(), "{text:?}");
        assert!(got.as_ref().err().is_none_or(|e| e.field() == "job_id"));

        let mut doc = valid_run();
        doc["job_id"] = json!(text);
        let run = read_run(&doc.to_string());
        assert_eq!(run.err().map(|e| e.message), rule.as_ref().map(Rule::to_string), "{text:?}");
    }
}
