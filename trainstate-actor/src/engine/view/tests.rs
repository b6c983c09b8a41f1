//! The indexed listing against the walk of every run it replaced.

use trainstate_client::{Cursor, RunQuery};
use trainstate_schema::{
    ActorStatus, Resources, RunStatus, TrainRunInfoDraft, TrainWorkerInfoDraft,
};

use super::*;

/// A small deterministic generator (xorshift64*), so a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

const JOBS: &[&str] = &["j1", "j2", "j3", "j4", "absent-job"];
const NODES: &[&str] = &["n1", "n2", "n3", "n4", "n5", "absent-node"];
const IPS: &[&str] = &["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.9.9.9"];
const CLUSTERS: &[&str] = &["c1", "c2", "absent-cluster"];
/// Name pieces: short texts, three-byte ones and longer, some in no name.
const TEXTS: &[&str] =
    &["", "a", "ab", "abc", "bca", "-b", "a-b", "abca", "ca-ab", "zzz", "abcab-", "aaaa", "x"];

/// A random run; few ids of time and short names, so that runs share
/// start milliseconds and names share pieces.
fn run(rng: &mut Rng, id: &str, start: Option<u64>) -> Arc<RunRecord> {
    let status = RunStatus::ALL[rng.below(RunStatus::ALL.len() as u64) as usize];
    let start = start.unwrap_or(1_760_000_000_000 + rng.below(12));
    let name: String =
        (0..1 + rng.below(8)).map(|_| ['a', 'b', 'c', '-'][rng.below(4) as usize]).collect();
    let workers = rng.below(4) as u32;
    // Node ranks in order of first appearance; each node keeps one IP.
    let mut nodes: Vec<usize> = Vec::new();
    let mut local = [0u32; 5];
    let mut draft = TrainRunInfoDraft {
        workers: (0..workers)
            .map(|rank| {
                let node = rng.below(5) as usize;
                let node_rank = match nodes.iter().position(|n| *n == node) {
                    Some(at) => at,
                    None => {
                        nodes.push(node);
                        nodes.len() - 1
                    }
                };
                TrainWorkerInfoDraft {
                    actor_id: format!("actor{rank}"),
                    world_rank: rank,
                    local_rank: {
                        local[node] += 1;
                        local[node] - 1
                    },
                    node_rank: node_rank as u32,
                    node_id: NODES[node].into(),
                    node_ip: IPS[node % 4].into(),
                    pid: 100 + rank,
                    gpu_ids: vec![],
                    status: ActorStatus::Alive,
                    resources: Resources::from_iter([("CPU", 1.0)]),
                    worker_log_file_path: None,
                    node_name: None,
                }
            })
            .collect(),
        datasets: vec![],
        ..TrainRunInfoDraft::new(id, name, rng.pick(&JOBS[..4]), "ctrl", start)
    };
    draft.run_status = status;
    if !status.is_live() {
        draft.end_time_ms = Some(start + 1);
    }
    draft.cluster = match rng.below(3) {
        0 => None,
        _ => Some(rng.pick(&CLUSTERS[..2]).into()),
    };
    RunRecord::new(&draft.validate().expect("a valid run")).expect("a record")
}

fn query(rng: &mut Rng) -> RunQuery {
    let mut query = RunQuery::default();
    let maybe = |rng: &mut Rng| rng.below(3) == 0;
    if maybe(rng) {
        query.statuses = (0..1 + rng.below(2))
            .map(|_| RunStatus::ALL[rng.below(RunStatus::ALL.len() as u64) as usize])
            .collect();
    }
    if maybe(rng) {
        query.job_id = Some(rng.pick(JOBS).into());
    }
    if maybe(rng) {
        query.name_contains = Some(rng.pick(TEXTS).into());
    }
    if maybe(rng) {
        query.node_id = Some(rng.pick(NODES).into());
    }
    if maybe(rng) {
        query.node_ip = Some(rng.pick(IPS).into());
    }
    if maybe(rng) {
        query.cluster = Some(rng.pick(CLUSTERS).into());
    }
    query.limit = match rng.below(4) {
        0 => None,
        _ => Some(1 + rng.below(7) as usize),
    };
    query
}

/// What the listing answered before the indexes: every run, newest first,
/// checked against each filter.
fn naive(runs: &HashMap<RunId, Arc<RunRecord>>, query: &RunQuery) -> Vec<Arc<RunRecord>> {
    let mut all: Vec<_> = runs
        .values()
        .filter(|r| {
            (query.statuses.is_empty() || query.statuses.iter().any(|s| s.matches(r.status)))
                && query.job_id.as_deref().is_none_or(|j| *r.job_id == *j)
                && query.name_contains.as_deref().is_none_or(|t| r.name.contains(t))
                && query.node_id.as_deref().is_none_or(|n| r.node_ids.contains(n))
                && query.node_ip.as_deref().is_none_or(|n| r.node_ips.contains(n))
                && query.cluster.as_deref().is_none_or(|c| r.cluster.as_deref() == Some(c))
        })
        .cloned()
        .collect();
    all.sort_by(|a, b| (b.start_time_ms, &b.id).cmp(&(a.start_time_ms, &a.id)));
    all
}

/// Pages through `query` to the end, checking each page, its total and
/// its cursor against the naive listing.
fn check(view: &View, runs: &HashMap<RunId, Arc<RunRecord>>, mut query: RunQuery) {
    let expected = naive(runs, &query);
    let limit = query.limit.unwrap_or(usize::MAX);
    let mut at: usize = 0;
    loop {
        let page = view.list(&query, |_| None);
        assert_eq!(page.total, expected.len(), "total of {query:?}");
        let want = &expected[at..(at.saturating_add(limit)).min(expected.len())];
        let got: Vec<_> = page.runs.iter().map(|d| d.body().into_owned()).collect();
        let want_bodies: Vec<_> =
            want.iter().map(|r| r.document(None).body().into_owned()).collect();
        assert_eq!(got, want_bodies, "page at {at} of {query:?}");
        at += want.len();
        match page.next_cursor {
            Some(cursor) => {
                assert!(at < expected.len(), "a cursor after the last match of {query:?}");
                let last = &expected[at - 1];
                assert_eq!(cursor, Cursor::new(last.start_time_ms, last.id.clone()));
                query.cursor = Some(cursor);
            }
            None => {
                assert_eq!(at, expected.len(), "no cursor before the end of {query:?}");
                return;
            }
        }
    }
}

#[test]
fn regression_indexed_listing_answers_as_the_walk_of_every_run() {
    for seed in 1..=6u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut view = View::new(16, 1 << 20);
        let mut runs: HashMap<RunId, Arc<RunRecord>> = HashMap::new();
        let ids: Vec<String> = (0..160).map(|i| format!("{:032x}", i * 7919 + seed)).collect();
        for step in 0..500 {
            let id = &ids[rng.below(ids.len() as u64) as usize];
            let run_id = RunId::parse(id).expect("an id");
            if rng.below(8) == 0 {
                view.apply(&StoreOp::Delete(run_id.clone()));
                runs.remove(&run_id);
            } else {
                // A new run, or a new version of one (status, nodes, even
                // name changed), as a later write would store it.
                // Mostly with the same start time, as later versions keep it.
                let start = runs.get(&run_id).map(|old| old.start_time_ms);
                let keep = rng.below(4) != 0;
                let record = run(&mut rng, id, start.filter(|_| keep));
                view.apply(&StoreOp::Put(record.clone()));
                runs.insert(run_id, record);
            }
            if step == 250 {
                // A reload: the same runs, every index built again; a run
                // read twice is the last version read.
                let mut all: Vec<_> = runs.values().cloned().collect();
                if let Some(first) = all.first().map(|r| r.id.to_string()) {
                    all.insert(0, run(&mut rng, &first, None));
                }
                view.replace_all(&all);
            }
            if step % 25 == 0 {
                for _ in 0..40 {
                    check(&view, &runs, query(&mut rng));
                }
            }
        }
        assert_eq!(view.len(), runs.len());
        let counts = view.count_by_status();
        for (i, status) in RunStatus::ALL.iter().enumerate() {
            assert_eq!(counts[i], runs.values().filter(|r| r.status == *status).count());
        }
    }
}

#[test]
fn regression_status_running_lists_every_live_status_from_the_index() {
    let mut rng = Rng(42);
    let mut view = View::new(16, 1 << 20);
    let mut runs = HashMap::new();
    for i in 0..200u64 {
        let record = run(&mut rng, &format!("{:032x}", i + 1), None);
        view.apply(&StoreOp::Put(record.clone()));
        runs.insert(record.id.clone(), record);
    }
    let mut query = RunQuery::default();
    query.statuses = vec![RunStatus::Running];
    let live = runs.values().filter(|r| r.status.is_live()).count();
    assert!(live > runs.values().filter(|r| r.status == RunStatus::Running).count());
    assert_eq!(view.list(&query, |_| None).total, live);
    check(&view, &runs, query);
}

#[test]
fn regression_a_rendezvous_key_finds_its_run_by_index_among_the_runs_of_its_job() {
    let record = |id: u64, controller: &str, start: u64| {
        let draft = TrainRunInfoDraft::new(format!("{id:032x}"), "train", "job", controller, start);
        RunRecord::new(&draft.validate().expect("a valid run")).expect("a record")
    };
    let mut view = View::new(16, 1 << 20);
    // Thousands of runs of the same job, none of the key's: never read.
    for i in 0..5_000u64 {
        view.apply(&StoreOp::Put(record(i + 1, "ctrl", 1_760_000_000_000 + i)));
    }
    let key = "rendezvous:torchrun:10.0.0.1-29500.00ff";
    let older = record(10_001, key, 1_760_000_000_000);
    let newer = record(10_002, key, 1_760_000_000_100);
    view.apply(&StoreOp::Put(older.clone()));
    view.apply(&StoreOp::Put(newer.clone()));
    assert_eq!(view.newest_of_rendezvous(key).map(|r| &r.id), Some(&newer.id));
    assert!(view.newest_of_rendezvous("rendezvous:other").is_none());
    assert!(view.newest_of_rendezvous("ctrl").is_none(), "only rendezvous runs are indexed");
    // Kept in step with deletes (retention).
    view.apply(&StoreOp::Delete(newer.id.clone()));
    assert_eq!(view.newest_of_rendezvous(key).map(|r| &r.id), Some(&older.id));
    view.apply(&StoreOp::Delete(older.id.clone()));
    assert!(view.newest_of_rendezvous(key).is_none());
}

/// Round two, finding 4: views started at the same instant (heads started
/// back to back) name different streams, so an id of one, even at the
/// same count, is never resumed by another: it gets a snapshot. Within a
/// stream, ids count up by one and resume exactly.
#[test]
fn regression_an_id_of_another_view_is_never_resumed_whatever_the_start_times() {
    let (events, _) = tokio::sync::broadcast::channel(16);
    let mut views: Vec<View> = (0..64).map(|_| View::new(16, 1 << 20)).collect();
    let firsts: std::collections::HashSet<u64> = views.iter().map(|v| v.last_seq).collect();
    assert_eq!(firsts.len(), views.len(), "every view names its own stream");
    for view in &mut views {
        for i in 0..3 {
            view.publish(&events, EventKind::Deleted, RunId::new_v7(), None);
            assert_eq!(view.last_seq & ((1 << COUNTER_BITS) - 1), i + 1);
        }
        assert!(view.last_seq < 1 << ID_BITS, "ids are exact JavaScript numbers");
    }
    let (a, b) = (&views[0], &views[1]);
    for after in [b.last_seq - 1, b.last_seq, a.last_seq - 1] {
        let resumed_by_a = matches!(a.follow(Some(after)).0, Start::After(_));
        assert_eq!(resumed_by_a, after == a.last_seq - 1, "id {after:#x}");
    }
    assert!(a.events_after(b.last_seq - 1, 10).is_err(), "another stream's id has lagged");
    assert_eq!(a.events_after(a.last_seq - 2, 10).unwrap().len(), 2);
}
