//! `trainstate goodput [--since T] [--by cluster|node|name] [--cluster C]`:
//! what the fleet's runs cost, as a table: per group, its runs, its
//! goodput, the GPU-hours it held and its largest badput buckets.

use std::process::ExitCode;

use clap::{Args, ValueEnum};
use trainstate_schema::text::escape_control;
use trainstate_schema::{GoodputBucket, goodput_ratio};

use super::HeadArgs;
use super::runs::{connect_head, table, unreachable_head, utc};
use crate::api::{GoodputBy, GoodputGroup, GoodputQuery, GoodputResponse, GoodputTotals};

/// How many badput buckets a row names, largest first.
const BUCKETS_SHOWN: usize = 2;

/// GPU-ms in an hour.
const GPU_MS_PER_HOUR: f64 = 3_600_000.0;

/// `trainstate goodput …`: the fleet's goodput over a window.
#[derive(Debug, Args)]
pub struct GoodputArgs {
    /// The head.
    #[command(flatten)]
    pub head: HeadArgs,
    /// Count from this time: Unix ms or RFC 3339 (default: 7 days ago).
    #[arg(long)]
    pub since: Option<String>,
    /// What to sum by.
    #[arg(long, value_enum, default_value_t = By::Cluster)]
    pub by: By,
    /// Only the runs of this cluster (on a hub).
    #[arg(long)]
    pub cluster: Option<String>,
}

/// What `trainstate goodput` sums by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum By {
    /// The runs' cluster.
    Cluster,
    /// The nodes the runs' attempts ran on.
    Node,
    /// The runs' name.
    Name,
}

impl From<By> for GoodputBy {
    fn from(by: By) -> Self {
        match by {
            By::Cluster => GoodputBy::Cluster,
            By::Node => GoodputBy::Node,
            By::Name => GoodputBy::Name,
        }
    }
}

/// Runs `goodput`: what it prints on stdout, or its error on stderr.
pub fn goodput(args: GoodputArgs) -> ExitCode {
    super::block_on(answer(args))
}

async fn answer(args: GoodputArgs) -> Result<String, String> {
    let GoodputArgs { head, since, by, cluster } = args;
    let mut query = GoodputQuery::default();
    query.since = since;
    query.by = Some(by.into());
    query.cluster = cluster;
    let answer = connect_head(&head)?.goodput(query).await.map_err(|e| match e {
        crate::StateError::Invalid { field, message } => format!("{field}: {message}"),
        other => unreachable_head(&head.url, other),
    })?;
    if head.json {
        return Ok(format!("{}\n", serde_json::to_string(&answer).expect("serializes")));
    }
    Ok(render(&answer))
}

/// The answer as text: the retention line when the window is beyond it,
/// then the table with a total row.
fn render(answer: &GoodputResponse) -> String {
    let mut out = String::new();
    if answer.beyond_retention
        && let Some(oldest) = answer.retained_since_ms
    {
        out.push_str(&format!(
            "the window starts before what the head retains: counted from {}\n",
            utc(oldest)
        ));
    }
    if answer.groups.is_empty() {
        out.push_str(&format!("no runs with goodput since {}\n", utc(answer.since_ms)));
        return out;
    }
    out.push_str(&table(&rows(answer)));
    out
}

/// The table of `goodput`, with its header and a total row.
fn rows(answer: &GoodputResponse) -> Vec<Vec<String>> {
    let with_cluster = answer.by != GoodputBy::Cluster;
    let key = match answer.by {
        GoodputBy::Node => "NODE",
        GoodputBy::Name => "NAME",
        _ => "CLUSTER",
    };
    let mut header = vec![key];
    if with_cluster {
        header.push("CLUSTER");
    }
    header.extend(["RUNS", "LIVE", "GOODPUT", "GPU-HOURS", "LOST GPU-HOURS", "LARGEST BADPUT"]);
    let mut rows = vec![header.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>()];
    let text = |t: Option<&str>| t.map_or("-".to_owned(), |t| escape_control(t).into_owned());
    for GoodputGroup { key, cluster, totals, .. } in &answer.groups {
        let mut row = vec![text(key.as_deref())];
        if with_cluster {
            row.push(text(cluster.as_deref()));
        }
        row.extend(figures(totals));
        rows.push(row);
    }
    let mut total = vec!["(total)".to_owned()];
    if with_cluster {
        total.push(String::new());
    }
    total.extend(figures(&answer.total));
    rows.push(total);
    rows
}

/// A row's figures: runs, live, goodput %, GPU-hours held and lost, and
/// the largest badput buckets with their share of the time held.
fn figures(totals: &GoodputTotals) -> Vec<String> {
    let percent = |part: u64| {
        goodput_ratio(part, totals.wall_gpu_ms).map_or("-".into(), |r| format!("{:.1}%", r * 100.0))
    };
    let hours = |gpu_ms: u64| format!("{:.1}", gpu_ms as f64 / GPU_MS_PER_HOUR);
    let mut buckets: Vec<(GoodputBucket, u64)> = GoodputBucket::ALL
        .iter()
        .skip(1)
        .map(|b| (*b, totals.badput_gpu_ms.get(*b)))
        .filter(|(_, ms)| *ms > 0)
        .collect();
    buckets.sort_by_key(|(_, ms)| std::cmp::Reverse(*ms));
    let largest: Vec<String> = buckets
        .iter()
        .take(BUCKETS_SHOWN)
        .map(|(bucket, ms)| format!("{bucket} {}", percent(*ms)))
        .collect();
    vec![
        totals.runs.to_string(),
        totals.live.to_string(),
        percent(totals.productive_gpu_ms),
        hours(totals.wall_gpu_ms),
        hours(totals.wall_gpu_ms.saturating_sub(totals.productive_gpu_ms)),
        if largest.is_empty() { "-".into() } else { largest.join(", ") },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_names_its_largest_badput_buckets_with_their_share() {
        let mut totals = GoodputTotals::default();
        totals.runs = 2;
        totals.wall_gpu_ms = 7_200_000;
        totals.productive_gpu_ms = 3_600_000;
        totals.badput_gpu_ms.stalled_ms = 2_700_000;
        totals.badput_gpu_ms.restarting_ms = 900_000;
        let row = figures(&totals);
        assert_eq!(row, ["2", "0", "50.0%", "2.0", "1.0", "stalled 37.5%, restarting 12.5%"]);
    }
}
