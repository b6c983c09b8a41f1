//! Property tests: valid runs round-trip; each mutation of a valid run is
//! refused naming the field and rule it breaks, or accepted when it breaks
//! none.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use serde_json::{Value, json};
use trainstate_schema::{NewRun, Rule, RunStatus, TrainRunInfo, TrainRunInfoDraft};

use crate::common::valid_run;

/// A valid run document: `nodes` nodes with `per_node` workers each, in a
/// shuffled order, some datasets, any status.
fn run_document() -> impl Strategy<Value = Value> {
    (1usize..5, 1usize..5, 0usize..3, 0usize..4, any::<u64>(), 0u64..1_000_000, "[a-z][a-z0-9_-]{0,20}")
        .prop_flat_map(|(nodes, per_node, datasets, status, seed, duration, name)| {
            let n = nodes * per_node;
            (Just((nodes, per_node, datasets, status, duration, name)), Just(seed), Just(n))
                .prop_flat_map(|(params, seed, n)| {
                    (Just(params), Just(seed), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
                })
        })
        .prop_map(|((nodes, per_node, datasets, status, duration, name), seed, order)| {
            let _ = nodes;
            let workers: Vec<Value> = order
                .iter()
                .map(|&rank| {
                    let node = rank / per_node;
                    json!({
                        "actor_id": format!("a{rank}-{seed:x}"), "world_rank": rank,
                        "local_rank": rank % per_node, "node_rank": node,
                        "node_id": format!("n{node}"), "node_ip": format!("fd00::{node:x}"),
                        "pid": rank + 1, "gpu_ids": [rank % per_node],
                        "status": if rank % 3 == 0 { "DEAD" } else { "ALIVE" },
                        "resources": {"CPU": rank as f64 / 2.0}
                    })
                })
                .collect();
            let status = RunStatus::ALL[status];
            let start = 1_700_000_000_000u64 + seed % 1_000_000;
            json!({
                "name": name, "id": format!("{seed:032x}"), "job_id": "j", "controller_actor_id": "c",
                "workers": workers,
                "datasets": (0..datasets).map(|i| json!({"name": format!("d{i}"), "dataset_uuid": "u", "dataset_name": null})).collect::<Vec<_>>(),
                "run_status": status.as_str(), "status_detail": "",
                "start_time_ms": start,
                "end_time_ms": if status.is_terminal() { json!(start + duration) } else { Value::Null },
            })
        })
}

/// Rules checked independently of the crate's validator.
fn assert_obeys_rules(run: &TrainRunInfo) {
    let ranks: Vec<u32> = run.workers().iter().map(|w| w.world_rank()).collect();
    assert_eq!(ranks, (0..run.workers().len() as u32).collect::<Vec<_>>());
    let mut node_rank_of: HashMap<&str, u32> = HashMap::new();
    let mut local: HashSet<(&str, u32)> = HashSet::new();
    for w in run.workers() {
        assert_eq!(*node_rank_of.entry(w.node_id()).or_insert(w.node_rank()), w.node_rank());
        assert!(local.insert((w.node_id(), w.local_rank())));
        assert!(w.pid() > 0);
        assert!(w.node_ip().parse::<std::net::IpAddr>().is_ok());
        assert!(w.resources().iter().all(|(_, v)| v.is_finite() && v >= 0.0));
    }
    let distinct: HashSet<u32> = node_rank_of.values().copied().collect();
    assert_eq!(distinct.len(), node_rank_of.len());
    if run.run_status() == RunStatus::Running {
        assert_eq!(run.end_time_ms(), None);
    }
    if let Some(end) = run.end_time_ms() {
        assert!(end >= run.start_time_ms());
    }
    assert!(!run.status_detail().contains('\0'));
}

/// What a mutated document must come to.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
    /// Refused by the rules: the error names `field` and `rule`.
    Broken { field: String, rule: Rule },
    /// Refused by its shape (a type, a variant): the error's path is `field`.
    Shape { field: String },
    /// A valid stored run, refused as a client's write
    /// (`NewRun::check_client_rules`) naming `field` and `rule`.
    Client { field: String, rule: Rule },
    /// Accepted, from a client too.
    Accepted,
    /// Accepted, and the same run as the document before the mutation.
    Same,
    /// Accepted, with this status detail.
    Detail(&'static str),
}

fn broken(field: impl Into<String>, rule: Rule) -> Option<Expect> {
    Some(Expect::Broken { field: field.into(), rule })
}

fn client(field: impl Into<String>, rule: Rule) -> Option<Expect> {
    Some(Expect::Client { field: field.into(), rule })
}

fn shape(field: impl Into<String>) -> Option<Expect> {
    Some(Expect::Shape { field: field.into() })
}

/// What a mutation needs to know of the document it breaks.
struct Layout {
    /// By position in the `workers` array: world rank, local rank, node
    /// (the number in `node_id`), node rank.
    ranks: Vec<u32>,
    locals: Vec<u32>,
    nodes: Vec<u32>,
    node_ranks: Vec<u32>,
    datasets: usize,
    status: RunStatus,
    start: u64,
}

impl Layout {
    fn of(doc: &Value) -> Self {
        let workers = doc["workers"].as_array().unwrap();
        let field = |name: &str| -> Vec<u32> {
            workers.iter().map(|w| w[name].as_u64().unwrap() as u32).collect()
        };
        let nodes = workers
            .iter()
            .map(|w| {
                let id = w["node_id"].as_str().unwrap();
                id.trim_start_matches(|c: char| !c.is_ascii_digit()).parse().unwrap()
            })
            .collect();
        Self {
            ranks: field("world_rank"),
            locals: field("local_rank"),
            nodes,
            node_ranks: field("node_rank"),
            datasets: doc["datasets"].as_array().map_or(0, Vec::len),
            status: serde_json::from_value(doc["run_status"].clone()).unwrap(),
            start: doc["start_time_ms"].as_u64().unwrap(),
        }
    }

    fn n(&self) -> usize {
        self.ranks.len()
    }

    /// Positions of the workers on `node`, in array order.
    fn on_node(&self, node: u32) -> Vec<usize> {
        (0..self.n()).filter(|&p| self.nodes[p] == node).collect()
    }
}

/// A mutation: what it breaks, and how, returning what the document must
/// then come to (`None`: it does not apply to this document). `pick`
/// chooses the worker (and the like) it breaks.
type Mutate = fn(&mut Value, &Layout, usize) -> Option<Expect>;

fn worker(doc: &mut Value, p: usize) -> &mut Value {
    &mut doc["workers"][p]
}

const MUTATIONS: &[(&str, Mutate)] = &[
    ("a run id with a slash", |d, _, _| {
        d["id"] = "a/b".into();
        broken("id", Rule::RunIdFormat)
    }),
    ("an empty job id", |d, _, _| {
        d["job_id"] = "".into();
        broken("job_id", Rule::Empty)
    }),
    ("a control character in the name", |d, _, _| {
        d["name"] = "a\u{7}b".into();
        broken("name", Rule::ControlCharacter)
    }),
    ("a NUL in the status detail", |d, _, _| {
        d["status_detail"] = "a\u{0}".into();
        broken("status_detail", Rule::NulCharacter)
    }),
    ("a world rank out of range", |d, l, pick| {
        let (p, n) = (pick % l.n(), l.n());
        worker(d, p)["world_rank"] = n.into();
        broken(
            format!("workers[{p}].world_rank"),
            Rule::WorldRankOutOfRange { rank: n as u32, workers: n },
        )
    }),
    ("a world rank twice", |d, l, pick| {
        let n = l.n();
        (n >= 2).then_some(())?;
        let (p, q) = (pick % n, (pick + 1) % n);
        worker(d, p)["world_rank"] = l.ranks[q].into();
        // Found at the second of the two, in array order.
        broken(
            format!("workers[{}].world_rank", p.max(q)),
            Rule::DuplicateWorldRank { rank: l.ranks[q] },
        )
    }),
    ("a local rank twice on a node", |d, l, pick| {
        let p = pick % l.n();
        let q = *l.on_node(l.nodes[p]).iter().find(|&&q| q != p)?;
        worker(d, p)["local_rank"] = l.locals[q].into();
        broken(
            format!("workers[{}].local_rank", p.max(q)),
            Rule::DuplicateLocalRank { rank: l.locals[q] },
        )
    }),
    ("two node ranks on one node", |d, l, pick| {
        let p = pick % l.n();
        let on_node = l.on_node(l.nodes[p]);
        (on_node.len() >= 2).then_some(())?;
        worker(d, p)["node_rank"] = 99.into();
        // The node's rank is the one its first worker (in array order) gives.
        if on_node[0] == p {
            broken(
                format!("workers[{}].node_rank", on_node[1]),
                Rule::InconsistentNodeRank { expected: 99 },
            )
        } else {
            broken(
                format!("workers[{p}].node_rank"),
                Rule::InconsistentNodeRank { expected: l.node_ranks[on_node[0]] },
            )
        }
    }),
    ("one node rank on two nodes", |d, l, pick| {
        let a = l.nodes[pick % l.n()];
        let b = *l.nodes.iter().find(|&&node| node != a)?;
        let rank = l.node_ranks[l.on_node(b)[0]];
        for p in l.on_node(a) {
            worker(d, p)["node_rank"] = rank.into();
        }
        // Found at the first worker of whichever node comes second.
        let second = l.on_node(a)[0].max(l.on_node(b)[0]);
        broken(format!("workers[{second}].node_rank"), Rule::NodeRankShared { rank })
    }),
    ("a node IP that is no address", |d, l, pick| {
        let p = pick % l.n();
        worker(d, p)["node_ip"] = "10.0.0.300".into();
        broken(format!("workers[{p}].node_ip"), Rule::IpAddress)
    }),
    ("a pid of zero", |d, l, pick| {
        let p = pick % l.n();
        worker(d, p)["pid"] = 0.into();
        broken(format!("workers[{p}].pid"), Rule::PidZero)
    }),
    ("a GPU id twice on a worker", |d, l, pick| {
        let p = pick % l.n();
        worker(d, p)["gpu_ids"] = json!([3, 3]);
        broken(format!("workers[{p}].gpu_ids[1]"), Rule::DuplicateGpuId { gpu_id: 3 })
    }),
    ("a negative resource", |d, l, pick| {
        let p = pick % l.n();
        worker(d, p)["resources"] = json!({"CPU": -1.0});
        broken(format!("workers[{p}].resources.CPU"), Rule::Negative)
    }),
    ("an end time the status forbids", |d, l, _| {
        if l.status.is_terminal() {
            d["end_time_ms"] = (l.start - 1).into();
            broken("end_time_ms", Rule::EndBeforeStart)
        } else {
            d["end_time_ms"] = (l.start + 1).into();
            broken("end_time_ms", Rule::EndTimeWhileRunning)
        }
    }),
    ("a dataset name twice", |d, l, _| {
        let dataset = json!({"name": "twice", "dataset_uuid": "u", "dataset_name": null});
        let datasets = d["datasets"].as_array_mut().unwrap();
        datasets.push(dataset.clone());
        datasets.push(dataset);
        broken(format!("datasets[{}].name", l.datasets + 1), Rule::DuplicateDatasetName)
    }),
    // The rules of what a client may write, on top of a stored run's.
    ("a cause on a run that did not fail", |d, l, _| {
        d["cause"] = json!({"kind": "USER_ERROR"});
        match l.status {
            RunStatus::Errored | RunStatus::Aborted => Some(Expect::Accepted),
            _ => client("cause", Rule::CauseWithoutFailure),
        }
    }),
    ("a lost controller written by a client", |d, l, _| {
        d["cause"] = json!({"kind": "LOST_CONTROLLER"});
        match l.status {
            RunStatus::Errored | RunStatus::Aborted => {
                client("cause.kind", Rule::CauseReservedForHead)
            }
            _ => client("cause", Rule::CauseWithoutFailure),
        }
    }),
    ("a failed rank the run does not have", |d, l, _| {
        let n = l.n();
        d["cause"] = json!({"kind": "USER_ERROR", "failed_world_rank": n});
        match l.status {
            RunStatus::Errored | RunStatus::Aborted => client(
                "cause.failed_world_rank",
                Rule::FailedRankOutOfRange { rank: n as u32, workers: n },
            ),
            _ => client("cause", Rule::CauseWithoutFailure),
        }
    }),
    ("a start time in seconds", |d, l, _| {
        d["start_time_ms"] = (l.start / 1000).into();
        client("start_time_ms", Rule::ImplausibleTime)
    }),
    ("a negative world rank", |d, l, pick| {
        let p = pick % l.n();
        worker(d, p)["world_rank"] = (-1).into();
        shape(format!("workers[{p}].world_rank"))
    }),
    ("a pid as a string", |d, l, pick| {
        let p = pick % l.n();
        worker(d, p)["pid"] = "4000".into();
        shape(format!("workers[{p}].pid"))
    }),
    ("an unknown run status", |d, _, _| {
        d["run_status"] = "PENDING".into();
        shape("run_status")
    }),
    ("workers that are not a list", |d, _, _| {
        d["workers"] = json!({});
        shape("workers")
    }),
    // Changes that break nothing are accepted: the test cannot pass by
    // refusing everything.
    ("an unknown key", |d, l, pick| {
        d["job_details"] = json!({"type": "DRIVER"});
        worker(d, pick % l.n())["gpus"] = json!([]);
        Some(Expect::Same)
    }),
    ("the workers in another order", |d, _, _| {
        d["workers"].as_array_mut().unwrap().reverse();
        Some(Expect::Same)
    }),
    ("another status detail", |d, _, _| {
        d["status_detail"] = "Rank 0 worker raised an error.".into();
        Some(Expect::Detail("Rank 0 worker raised an error."))
    }),
];

/// Reads a document the way the head does (its shape, with the path of a
/// shape error; then the rules) and checks it comes to `expected`.
fn check(what: &str, doc: &Value, before: &TrainRunInfo, expected: &Expect) {
    let read: Result<TrainRunInfoDraft, _> = serde_path_to_error::deserialize(doc.clone());
    // The plain `Deserialize` of the validated type agrees on every document.
    let direct = serde_json::from_value::<TrainRunInfo>(doc.clone());
    let draft = match (read, expected) {
        (Err(err), Expect::Shape { field }) => {
            assert_eq!(&err.path().to_string(), field, "{what}: {err}");
            assert!(direct.is_err(), "{what}: the plain Deserialize accepted it");
            return;
        }
        (Err(err), _) => panic!("{what}: refused by its shape, not as {expected:?}: {err}"),
        (Ok(draft), _) => draft,
    };
    match (draft.validate(), expected) {
        (Err(err), Expect::Broken { field, rule }) => {
            assert_eq!((err.field(), err.rule()), (field.as_str(), rule), "{what}");
            assert!(direct.is_err(), "{what}: the plain Deserialize accepted it");
        }
        (Ok(run), Expect::Client { field, rule }) => {
            assert_obeys_rules(&run);
            let err = NewRun::check_client_rules(&run).unwrap_err();
            assert_eq!((err.field(), err.rule()), (field.as_str(), rule), "{what}");
        }
        (Ok(run), Expect::Accepted) => {
            assert_obeys_rules(&run);
            NewRun::check_client_rules(&run).unwrap();
            assert_eq!(direct.unwrap(), run, "{what}");
        }
        (Ok(run), Expect::Same) => {
            assert_obeys_rules(&run);
            NewRun::check_client_rules(&run).unwrap();
            assert_eq!(&run, before, "{what}");
            assert_eq!(direct.unwrap(), run, "{what}");
        }
        (Ok(run), Expect::Detail(detail)) => {
            assert_obeys_rules(&run);
            NewRun::check_client_rules(&run).unwrap();
            assert_eq!(run.status_detail(), *detail, "{what}");
            assert_eq!(direct.unwrap(), run, "{what}");
        }
        (got, _) => panic!("{what}: expected {expected:?}, got {got:?}"),
    }
}

/// Applies mutation `index` to `doc` and checks the outcome; false when the
/// mutation does not apply to the document.
fn mutate_and_check(doc: &Value, index: usize, pick: usize) -> bool {
    let before: TrainRunInfo = serde_json::from_value(doc.clone()).unwrap();
    let (what, mutate) = MUTATIONS[index];
    let mut mutated = doc.clone();
    let Some(expected) = mutate(&mut mutated, &Layout::of(doc), pick) else { return false };
    check(what, &mutated, &before, &expected);
    true
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn valid_runs_round_trip(doc in run_document()) {
        let run: TrainRunInfo = serde_json::from_value(doc).unwrap();
        assert_obeys_rules(&run);
        let text = serde_json::to_string(&run).unwrap();
        let again: TrainRunInfo = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(&run, &again);
        prop_assert_eq!(run.clone().into_draft().validate().unwrap(), run);
    }

    /// One mutation of a valid document, knowing the rule and field it
    /// breaks: the document is refused naming exactly that field and rule
    /// (or accepted, for the mutations that break nothing).
    #[test]
    fn each_mutation_is_refused_naming_the_rule_and_field_it_breaks(
        doc in run_document(),
        index in 0..MUTATIONS.len(),
        pick in any::<usize>(),
    ) {
        prop_assume!(mutate_and_check(&doc, index, pick), "{} does not apply", MUTATIONS[index].0);
    }
}

#[test]
fn the_fixed_valid_run_obeys_the_rules() {
    assert_obeys_rules(&serde_json::from_value(valid_run()).unwrap());
}

/// Every mutation, on the fixed valid run, at every worker: none is left to
/// chance.
#[test]
fn every_mutation_is_checked_on_the_fixed_run() {
    let mut doc = valid_run();
    // Without the run's copy of the workers' resources, so that a worker's
    // resource breaks only its own rule.
    doc.as_object_mut().unwrap().remove("resources");
    for (index, (what, _)) in MUTATIONS.iter().enumerate() {
        let applied = (0..4).filter(|&pick| mutate_and_check(&doc, index, pick)).count();
        assert!(applied > 0, "{what} never applied");
    }
}
