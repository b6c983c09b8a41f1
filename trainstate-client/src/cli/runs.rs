//! `trainstate runs …`: reading a head service.

use std::process::ExitCode;
use std::time::Duration;

use trainstate_schema::ray_v2::attempt_budget;
use trainstate_schema::text::escape_control;
use trainstate_schema::{
    CauseClass, CauseKind, GoodputBucket, HealthState, RunGoodput, RunHealth, Straggler,
    TrainRunInfo,
};

use super::{HeadArgs, RunsCommand};
use crate::api::{LinksResponse, RankProgressServed, RunListResponse, StatusFilter};
use crate::links::{fill, is_per_worker};
use crate::{RunQuery, StateHandle};

/// Runs a `runs` command: what it prints on stdout, or its error on stderr.
pub fn runs(command: RunsCommand) -> ExitCode {
    super::block_on(run_command(command))
}

pub(super) fn connect_head(head: &HeadArgs) -> Result<StateHandle, String> {
    let token = head.token_file.as_deref().map(super::read_token_file).transpose()?;
    let cas = super::read_ca_cert(head.ca_cert.as_deref())?;
    super::connect("--url", &head.url, token, head.ca_cert.as_deref(), cas.as_ref())
        .map(|h| h.with_timeout(Duration::from_secs(5)))
}

async fn run_command(command: RunsCommand) -> Result<String, String> {
    match command {
        RunsCommand::List { head, status, job, name, health, limit } => {
            let state = connect_head(&head)?;
            let mut query = RunQuery::new().limit(limit);
            query.statuses = status.join(",").to_uppercase().parse::<StatusFilter>()?.0;
            query.job_id = job;
            query.name_contains = name;
            query.health = health.as_deref().map(parse_health).transpose()?;
            let page = state.list(query).await.map_err(|e| unreachable_head(&head.url, e))?;
            if head.json {
                let total = page.total as u64;
                let answer = RunListResponse::new(page.runs, page.next_cursor, total);
                return Ok(format!("{}\n", serde_json::to_string(&answer).expect("serializes")));
            }
            let runs: Vec<TrainRunInfo> = page
                .runs
                .iter()
                .map(|r| r.parse())
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            let mut rows = vec![vec![
                "ID".to_owned(),
                "NAME".into(),
                "STATUS".into(),
                "HEALTH".into(),
                "JOB".into(),
                "STARTED (UTC)".into(),
                "DURATION".into(),
                "WORKERS".into(),
                "GPUS".into(),
            ]];
            for run in &runs {
                let gpus: usize = run.workers().iter().map(|w| w.gpu_ids().len()).sum();
                rows.push(vec![
                    run.id().to_string(),
                    escape_control(run.name()).into_owned(),
                    run.status().to_string(),
                    health_cell(run.health()),
                    escape_control(run.job_id()).into_owned(),
                    utc(run.start_time_ms()),
                    duration(run.start_time_ms(), run.end_time_ms()),
                    run.workers().len().to_string(),
                    gpus.to_string(),
                ]);
            }
            let mut out = table(&rows);
            out.push_str(&format!("{} of {} runs\n", runs.len(), page.total));
            Ok(out)
        }
        RunsCommand::Show { head, id } => {
            let state = connect_head(&head)?;
            let id = trainstate_schema::RunId::parse(&id).map_err(|e| e.to_string())?;
            let run = state.get(id).await.map_err(|e| unreachable_head(&head.url, e))?;
            if head.json {
                return Ok(format!("{}\n", run.to_json()));
            }
            // Links are a nicety: a head without them (or an older one) still shows the run.
            let links = state.links().await.unwrap_or_default();
            show(&run.parse().map_err(|e| e.to_string())?, &links, &served_progress(&run))
        }
        RunsCommand::Stacks { head, id, capture, all } => {
            let state = connect_head(&head)?;
            let id = trainstate_schema::RunId::parse(&id).map_err(|e| e.to_string())?;
            super::stacks::stacks(&state, &head, &id, capture, all).await
        }
    }
}

/// The state `--health` names (`STALLED`, `progressing`), or an error
/// naming the flag and the states it takes.
fn parse_health(text: &str) -> Result<HealthState, String> {
    HealthState::parse(&text.trim().to_uppercase()).ok_or_else(|| {
        let states: Vec<&str> = HealthState::ALL.iter().map(|s| s.as_str()).collect();
        format!("--health: {text:?} is not a health state: one of {}", states.join(", "))
    })
}

/// Whose fault a cause of `class` was, in words.
fn class_words(class: CauseClass) -> &'static str {
    match class {
        CauseClass::Infrastructure => "the machine's fault",
        CauseClass::Application => "the code's fault",
        CauseClass::Interrupted => "stopped on purpose",
        CauseClass::NoProgress => "it had stopped making progress",
        _ => "whose fault is not said",
    }
}

/// A run's health in the list: its state, `-` for none, and `ENDED
/// WHILE STALLED` for a run that ended while stalled (no live stall).
fn health_cell(health: Option<&RunHealth>) -> String {
    match health {
        None => "-".to_owned(),
        Some(h) if h.ended_ms.is_some() => "ENDED WHILE STALLED".to_owned(),
        Some(h) => h.state.to_string(),
    }
}

pub(super) fn unreachable_head(url: &str, err: crate::StateError) -> String {
    match err {
        crate::StateError::Unavailable { reason } => {
            format!("head service at {url} is unreachable: {reason}")
        }
        other => other.to_string(),
    }
}

/// Each rank's progress as the head served it with the run (the
/// `rank_progress` member of a remote answer, which is kept as it came).
fn served_progress(run: &crate::RunDocument) -> Vec<Option<RankProgressServed>> {
    #[derive(serde::Deserialize)]
    struct Served {
        #[serde(default)]
        rank_progress: Vec<Option<RankProgressServed>>,
    }
    match run.rank_progress() {
        Some(ranks) => ranks.to_vec(),
        None => serde_json::from_str::<Served>(&run.to_json())
            .map(|served| served.rank_progress)
            .unwrap_or_default(),
    }
}

/// A run's progress as its ranks last reported it: the highest step, the
/// largest total, and when a rank last advanced.
struct Progress {
    step: u64,
    total: Option<u64>,
    last_advance_ms: Option<u64>,
}

impl Progress {
    fn of(ranks: &[Option<RankProgressServed>]) -> Option<Self> {
        let reported = ranks.iter().flatten();
        let step = reported.clone().filter_map(|p| p.step).max()?;
        let total = reported.clone().filter_map(|p| p.total_steps).filter(|&t| t > 0).max();
        let last_advance_ms = reported.filter_map(|p| p.last_advance_ms).max();
        Some(Self { step, total, last_advance_ms })
    }

    /// `step 40 of 100 (40 %), about 3m00s left`: the estimate at the run's
    /// average pace since it started (`elapsed_ms`), for a live run. A run
    /// that is stalled (`stalled_for_ms`: how long no rank advanced) has
    /// no estimate: `step 40 of 100 (40 %), stalled for 16m00s`.
    fn text(&self, elapsed_ms: Option<u64>, stalled_for_ms: Option<u64>) -> String {
        let Some(total) = self.total else {
            return match stalled_for_ms {
                Some(stalled) => format!("step {}, stalled for {}", self.step, since(stalled)),
                None => format!("step {}", self.step),
            };
        };
        let done = self.step.min(total);
        let mut text = format!("step {} of {total} ({} %)", self.step, done * 100 / total);
        if let Some(stalled) = stalled_for_ms {
            text.push_str(&format!(", stalled for {}", since(stalled)));
            return text;
        }
        if let Some(elapsed) = elapsed_ms.filter(|_| self.step > 0 && self.step < total) {
            let left = elapsed as u128 * u128::from(total - self.step) / u128::from(self.step);
            text.push_str(&format!(", about {} left", duration(0, Some(left as u64))));
        }
        text
    }
}

/// A node as people name it: `hostname (id)`, or its id alone when its
/// host name is unknown.
fn node_text(w: &trainstate_schema::TrainWorkerInfo) -> String {
    match w.node_name() {
        Some(name) => format!("{} ({})", escape_control(name), escape_control(w.node_id())),
        None => escape_control(w.node_id()).into_owned(),
    }
}

/// `run`, for a person; `ranks` is each rank's progress as served (an
/// ended run's: their last progress).
fn show(
    run: &TrainRunInfo,
    links: &LinksResponse,
    ranks: &[Option<RankProgressServed>],
) -> Result<String, String> {
    let progress = Progress::of(ranks);
    let progress = progress.as_ref();
    let mut out = String::new();
    let line = |out: &mut String, key: &str, value: &str| {
        out.push_str(&format!("{key:<16}{}\n", escape_control(value)));
    };
    line(&mut out, "id", run.id().as_str());
    line(&mut out, "name", run.name());
    line(&mut out, "status", run.status().as_str());
    line(&mut out, "job", run.job_id());
    // A run the rendezvous assembled has ranks, not a controller: its launch key.
    let launch = run.controller_actor_id().strip_prefix("rendezvous:");
    match launch {
        Some(key) => line(&mut out, "launch", key),
        None => line(&mut out, "controller", run.controller_actor_id()),
    }
    line(&mut out, "started (UTC)", &utc(run.start_time_ms()));
    line(&mut out, "ended (UTC)", &run.end_time_ms().map(utc).unwrap_or_else(|| "-".into()));
    line(&mut out, "duration", &duration(run.start_time_ms(), run.end_time_ms()));
    if let Some(cause) = run.cause() {
        let how = cause.how.map(|h| format!(", {}", h.as_str().to_lowercase())).unwrap_or_default();
        let at = cause.failed_at_ms.map(|t| format!(" at {} UTC", utc(t))).unwrap_or_default();
        let rank = cause
            .failed_world_rank
            .map(|r| format!(" (rank {r} failed first{how}{at})"))
            .unwrap_or_default();
        let label = match (cause.kind, launch) {
            (CauseKind::LostController, Some(_)) => " (no rank heard from)",
            _ => "",
        };
        line(&mut out, "cause", &format!("{}{label}{rank}", cause.kind));
        line(&mut out, "class", &format!("{} ({})", cause.class, class_words(cause.class)));
    }
    if let Some(from) = run.restored_from() {
        line(&mut out, "restored from", from.as_str());
    }
    if let Some(health) = run.health() {
        let ranks = match health.ranks.as_slice() {
            [] => String::new(),
            ranks => format!(
                ", ranks {}",
                ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ),
        };
        let since = utc(health.since_ms);
        let ended = match health.ended_ms {
            Some(ended) => format!(", ended while stalled at {} UTC", utc(ended)),
            None => String::new(),
        };
        line(
            &mut out,
            "health",
            &format!("{} since {since} UTC{ranks}{ended}", health.state.as_str()),
        );
        if !health.stragglers.is_empty() {
            line(&mut out, "stragglers", &stragglers_text(&health.stragglers));
        }
        if !health.detail.is_empty() {
            line(&mut out, "", &health.detail);
        }
    }
    if let Some(goodput) = run.goodput() {
        let mut lines = goodput_lines(goodput).into_iter();
        if let Some(first) = lines.next() {
            line(&mut out, "goodput", &first);
        }
        for more in lines {
            line(&mut out, "", &more);
        }
    }
    if let Some(progress) = progress {
        let live = run.end_time_ms().is_none();
        let elapsed = live.then(|| now_ms().saturating_sub(run.start_time_ms()));
        // A stalled run has no pace to estimate from: how long it has
        // stood still instead.
        let stalled_for = run.health().filter(|h| live && h.is_live_stall()).map(|h| {
            let from = h.last_advance_ms.or(progress.last_advance_ms).unwrap_or(h.since_ms);
            now_ms().saturating_sub(from)
        });
        let key = if live { "progress" } else { "last progress" };
        line(&mut out, key, &progress.text(elapsed, stalled_for));
    }
    let named = [("logs", links.logs.as_deref()), ("metrics", links.metrics.as_deref())];
    let run_links =
        named.iter().filter_map(|(n, t)| t.filter(|t| !is_per_worker(t)).map(|t| (*n, t)));
    for (name, template) in run_links {
        line(&mut out, name, &fill(template, run, None));
    }
    if !run.attempts().is_empty() {
        let budget = attempt_budget(run);
        let current = run.attempts().len();
        let title = match budget {
            Some(budget) => format!("\nattempts ({current} of at most {budget})\n"),
            None => "\nattempts\n".to_owned(),
        };
        out.push_str(&title);
        let mut rows = vec![
            ["ATTEMPT", "STATUS", "STARTED (UTC)", "DURATION", "WORKERS", "CAUSE"]
                .map(String::from)
                .to_vec(),
        ];
        for (i, a) in run.attempts().iter().enumerate() {
            let workers = a.workers().map_or(run.workers().len(), <[_]>::len);
            let workers = if i + 1 == current { run.workers().len() } else { workers };
            let cause = a.cause().map_or_else(
                || "-".to_owned(),
                |c| match c.failed_world_rank {
                    Some(rank) => match c.how {
                        Some(how) => format!(
                            "{} {} (rank {rank}, {})",
                            c.kind,
                            c.class,
                            how.as_str().to_lowercase()
                        ),
                        None => format!("{} {} (rank {rank})", c.kind, c.class),
                    },
                    None => format!("{} {}", c.kind, c.class),
                },
            );
            rows.push(vec![
                escape_control(a.attempt_id()).into_owned(),
                a.status().to_string(),
                utc(a.start_time_ms()),
                duration(a.start_time_ms(), a.end_time_ms()),
                workers.to_string(),
                cause,
            ]);
        }
        out.push_str(&table(&rows));
    }
    let worker_links: Vec<(&str, &str)> =
        named.iter().filter_map(|(n, t)| t.filter(|t| is_per_worker(t)).map(|t| (*n, t))).collect();
    out.push_str("\nworkers\n");
    let mut header: Vec<String> =
        ["RANK", "LOCAL", "NODE", "NODE ID", "NODE IP", "PID", "GPUS", "STATUS"]
            .map(String::from)
            .to_vec();
    // Each rank's step, phase and last advance: an ended run's, where its
    // ranks were when it ended.
    let with_progress = ranks.iter().any(Option::is_some);
    if with_progress {
        header.extend(["STEP", "PHASE", "LAST ADVANCE (UTC)"].map(String::from));
    }
    header.extend(worker_links.iter().map(|(n, _)| n.to_uppercase()));
    let mut rows = vec![header];
    for w in run.workers() {
        let mut row = vec![
            w.world_rank().to_string(),
            w.local_rank().to_string(),
            w.node_rank().to_string(),
            node_text(w),
            w.node_ip().to_owned(),
            w.pid().to_string(),
            w.gpu_ids().iter().map(u32::to_string).collect::<Vec<_>>().join(","),
            w.status().to_string(),
        ];
        if with_progress {
            let p = ranks.get(w.world_rank() as usize).and_then(Option::as_ref);
            let or_dash = |text: Option<String>| text.unwrap_or_else(|| "-".into());
            row.push(or_dash(p.and_then(|p| p.step).map(|s| s.to_string())));
            row.push(or_dash(
                p.and_then(|p| p.phase.as_deref()).map(|t| escape_control(t).into_owned()),
            ));
            row.push(or_dash(p.and_then(|p| p.last_advance_ms).map(utc)));
        }
        row.extend(worker_links.iter().map(|(_, t)| fill(t, run, Some(w))));
        rows.push(row);
    }
    out.push_str(&table(&rows));
    if !run.datasets().is_empty() {
        out.push_str("\ndatasets\n");
        let mut rows = vec![["NAME", "DATASET NAME", "UUID"].map(String::from).to_vec()];
        for d in run.datasets() {
            rows.push(vec![
                escape_control(d.name()).into_owned(),
                escape_control(d.dataset_name().unwrap_or("-")).into_owned(),
                escape_control(d.dataset_uuid()).into_owned(),
            ]);
        }
        out.push_str(&table(&rows));
    }
    if run.attempts().len() > 1 {
        out.push_str("\nattempts\n");
        let mut rows =
            vec![["ID", "STARTED (UTC)", "ENDED (UTC)", "WORKERS"].map(String::from).to_vec()];
        for a in run.attempts() {
            rows.push(vec![
                escape_control(a.attempt_id()).into_owned(),
                utc(a.start_time_ms()),
                a.end_time_ms().map(utc).unwrap_or_else(|| "-".into()),
                a.workers().map_or(run.workers().len(), |w| w.len()).to_string(),
            ]);
        }
        out.push_str(&table(&rows));
    }
    if !run.status_detail().is_empty() {
        out.push_str("\nstatus detail\n");
        out.push_str(&escape_control(run.status_detail()));
        out.push('\n');
    }
    Ok(out)
}

/// A bucket of a run's time, in words.
fn bucket_words(bucket: GoodputBucket) -> &'static str {
    match bucket {
        GoodputBucket::Productive => "productive",
        GoodputBucket::WaitingToStart => "waiting to start",
        GoodputBucket::Restarting => "restarting",
        GoodputBucket::Stalled => "stalled",
        GoodputBucket::Checkpointing => "checkpointing",
        GoodputBucket::ProgressLost => "progress lost",
        GoodputBucket::SlowerThanPace => "slower than pace",
        _ => "other",
    }
}

/// What a run cost, line by line: `53.8% of 2m10s`, the badput buckets
/// that are not zero with their durations, the checkpoint mark, and the
/// restart loop when the run is in one.
fn goodput_lines(goodput: &RunGoodput) -> Vec<String> {
    let ratio = goodput.ratio.map_or_else(|| "-".to_owned(), |r| format!("{:.1}%", r * 100.0));
    let mut lines = vec![format!("{ratio} of {}", since(goodput.wall_ms))];
    let badput: Vec<String> = GoodputBucket::ALL
        .iter()
        .filter(|b| **b != GoodputBucket::Productive && goodput.ms(**b) > 0)
        .map(|b| format!("{} {}", bucket_words(*b), since(goodput.ms(*b))))
        .collect();
    if !badput.is_empty() {
        lines.push(format!("lost to {}", badput.join(", ")));
    }
    if let Some(mark) = &goodput.checkpoint {
        lines.push(format!("checkpoint: step {} saved at {} UTC", mark.step, utc(mark.at_ms)));
    }
    if goodput.restart_loop {
        lines.push(format!(
            "restart loop: {} attempts failed since the last checkpoint",
            goodput.restarts_since_checkpoint
        ));
    }
    lines
}

/// `rank 1 2.0× (200 ms a step, its peers 100 ms), rank 3 1.6× (...)`.
fn stragglers_text(stragglers: &[Straggler]) -> String {
    let ms = |ms: f64| if ms < 100.0 { format!("{ms:.1} ms") } else { format!("{ms:.0} ms") };
    let named: Vec<String> = stragglers
        .iter()
        .map(|s| {
            format!(
                "rank {} {:.1}\u{d7} ({} a step, its peers {})",
                s.rank,
                s.ratio,
                ms(s.step_time_ms),
                ms(s.peers_step_time_ms)
            )
        })
        .collect();
    named.join(", ")
}

/// Left-aligned columns separated by two spaces.
pub(super) fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> =
            row.iter().zip(&widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `2026-11-29 18:26:59` from Unix milliseconds.
pub(super) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (hour, minute, second) = (rest / 3600, rest % 3600 / 60, rest % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02}")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `16m00s`: a length of time in ms, as [`duration`] writes it.
fn since(ms: u64) -> String {
    duration(0, Some(ms))
}

fn duration(start: u64, end: Option<u64>) -> String {
    let end = end.unwrap_or_else(|| now_ms().max(start));
    let secs = end.saturating_sub(start) / 1000;
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reads_the_highest_step_the_largest_total_and_an_estimate() {
        let rank = |step: Option<u64>, total: Option<u64>| {
            Some(RankProgressServed::new(step, total, None, None, Default::default()))
        };
        assert!(Progress::of(&[None, rank(None, Some(10))]).is_none(), "no step, no progress");
        let progress =
            Progress::of(&[rank(Some(40), Some(100)), None, rank(Some(37), None)]).unwrap();
        assert_eq!((progress.step, progress.total), (40, Some(100)));
        assert_eq!(progress.text(None, None), "step 40 of 100 (40 %)");
        // 40 steps took 2 minutes: the 60 left take 3 more at that pace.
        assert_eq!(progress.text(Some(120_000), None), "step 40 of 100 (40 %), about 3m00s left");
        let unknown = Progress::of(&[rank(Some(7), None)]).unwrap();
        assert_eq!(unknown.text(Some(1_000), None), "step 7");
    }

    #[test]
    fn a_stalled_run_says_how_long_it_stood_still_and_estimates_nothing() {
        let rank =
            Some(RankProgressServed::new(Some(40), Some(100), None, None, Default::default()));
        let progress = Progress::of(&[rank]).unwrap();
        let cases = [
            (Some(120_000), Some(960_000), "step 40 of 100 (40 %), stalled for 16m00s"),
            (None, Some(5_000), "step 40 of 100 (40 %), stalled for 5s"),
            (Some(120_000), None, "step 40 of 100 (40 %), about 3m00s left"),
        ];
        for (elapsed, stalled, expected) in cases {
            assert_eq!(progress.text(elapsed, stalled), expected, "{elapsed:?} {stalled:?}");
        }
        let untotalled = Progress { total: None, ..progress };
        assert_eq!(untotalled.text(Some(1_000), Some(61_000)), "step 40, stalled for 1m01s");
    }

    #[test]
    fn the_health_flag_takes_a_state_in_any_case_and_names_itself_otherwise() {
        assert_eq!(parse_health("stalled"), Ok(HealthState::Stalled));
        assert_eq!(parse_health("PROGRESSING"), Ok(HealthState::Progressing));
        let err = parse_health("stuck").unwrap_err();
        assert!(err.starts_with("--health: \"stuck\" is not a health state"), "{err}");
        assert!(err.ends_with("one of PROGRESSING, STALLED"), "{err}");
    }

    #[test]
    fn the_health_cell_tells_a_stall_the_run_ended_in_from_a_live_one() {
        let stalled = RunHealth::new(HealthState::Stalled, 1, vec![], String::new());
        let mut ended = stalled.clone();
        ended.ended_ms = Some(2);
        assert_eq!(health_cell(None), "-");
        assert_eq!(health_cell(Some(&stalled)), "STALLED");
        assert_eq!(health_cell(Some(&ended)), "ENDED WHILE STALLED");
    }

    #[test]
    fn stragglers_are_named_with_their_ratio_and_times() {
        let stragglers = [Straggler::new(1, 200.0, 100.0), Straggler::new(3, 12.0, 7.5)];
        assert_eq!(
            stragglers_text(&stragglers),
            "rank 1 2.0\u{d7} (200 ms a step, its peers 100 ms), \
             rank 3 1.6\u{d7} (12.0 ms a step, its peers 7.5 ms)"
        );
    }

    #[test]
    fn goodput_reads_its_ratio_and_wall_time_then_only_the_buckets_that_cost_something() {
        let mut goodput = RunGoodput::starting_at(0);
        goodput.add(GoodputBucket::WaitingToStart, 10_000);
        goodput.add(GoodputBucket::Productive, 70_000);
        goodput.add(GoodputBucket::Restarting, 20_000);
        goodput.add(GoodputBucket::Stalled, 30_000);
        assert_eq!(
            goodput_lines(&goodput),
            ["53.8% of 2m10s", "lost to waiting to start 10s, restarting 20s, stalled 30s"]
        );
        goodput.checkpoint =
            Some(trainstate_schema::CheckpointMark::new(40, 1_764_441_600_000, "1"));
        goodput.restarts_since_checkpoint = 3;
        goodput.restart_loop = true;
        let lines = goodput_lines(&goodput);
        assert_eq!(lines[2], "checkpoint: step 40 saved at 2025-11-29 18:40:00 UTC");
        assert_eq!(lines[3], "restart loop: 3 attempts failed since the last checkpoint");
        assert_eq!(goodput_lines(&RunGoodput::starting_at(5)), ["- of 0s"], "nothing counted yet");
    }

    #[test]
    fn utc_renders_civil_time() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_760_000_000_000), "2025-10-09 08:53:20");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
    }
}
