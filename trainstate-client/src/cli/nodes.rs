//! `trainstate nodes [--suspect] [--since …]` and `trainstate nodes show
//! NODE`: the node ledger of a head, as a table.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use trainstate_schema::text::escape_control;

use super::HeadArgs;
use super::runs::{connect_head, table, unreachable_head, utc};
use crate::api::{NodeQuery, NodeSummary, NodesQuery};

/// `trainstate nodes …`: the nodes seen under runs, and the suspects.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct NodesArgs {
    /// `show NODE`; none lists the nodes.
    #[command(subcommand)]
    pub command: Option<NodesCommand>,
    /// What the listing takes.
    #[command(flatten)]
    pub list: NodesList,
}

/// The listing's flags.
#[derive(Debug, Args)]
pub struct NodesList {
    /// The head.
    #[command(flatten)]
    pub head: HeadArgs,
    /// Only the suspects.
    #[arg(long)]
    pub suspect: bool,
    /// Count from this time: Unix ms or RFC 3339 (default: 14 days ago).
    #[arg(long)]
    pub since: Option<String>,
    /// Only the nodes of this cluster (on a hub).
    #[arg(long)]
    pub cluster: Option<String>,
}

/// `trainstate nodes show NODE`.
#[derive(Debug, Subcommand)]
pub enum NodesCommand {
    /// One node: its counts, its verdict and the runs behind each count.
    Show {
        /// The head.
        #[command(flatten)]
        head: HeadArgs,
        /// The node (its workers' node_name, else node_id).
        node: String,
        /// Count from this time: Unix ms or RFC 3339 (default: 14 days ago).
        #[arg(long)]
        since: Option<String>,
        /// Only the node of this name in this cluster (on a hub).
        #[arg(long)]
        cluster: Option<String>,
    },
}

/// Runs a `nodes` command: what it prints on stdout, or its error on stderr.
pub fn nodes(args: NodesArgs) -> ExitCode {
    super::block_on(answer(args))
}

async fn answer(args: NodesArgs) -> Result<String, String> {
    match args.command {
        None => {
            let NodesList { head, suspect, since, cluster } = args.list;
            let mut query = NodesQuery::default();
            query.since = since;
            query.suspect = suspect.then_some(true);
            query.cluster = cluster;
            let listed = connect_head(&head)?
                .list_nodes(&query)
                .await
                .map_err(|e| unreachable_head(&head.url, e))?;
            if head.json {
                return Ok(format!("{}\n", serde_json::to_string(&listed).expect("serializes")));
            }
            let mut out = String::new();
            if listed.beyond_retention
                && let Some(oldest) = listed.retained_since_ms
            {
                out.push_str(&format!(
                    "the window starts before what the head retains: counted from {}\n",
                    utc(oldest)
                ));
            }
            if listed.nodes.is_empty() {
                out.push_str(&format!("no nodes since {}\n", utc(listed.since_ms)));
                return Ok(out);
            }
            out.push_str(&table(&rows(&listed.nodes)));
            Ok(out)
        }
        Some(NodesCommand::Show { head, node, since, cluster }) => {
            let mut query = NodeQuery::default();
            query.since = since;
            query.cluster = cluster;
            let detail =
                connect_head(&head)?.get_node(&node, &query).await.map_err(|e| match e {
                    // A 404 names no run: the head's words say which node.
                    crate::StateError::Unsupported { reason } => reason,
                    other => unreachable_head(&head.url, other),
                })?;
            if head.json {
                return Ok(format!("{}\n", serde_json::to_string(&detail).expect("serializes")));
            }
            let mut out = String::new();
            for node in &detail.nodes {
                let s = &node.summary;
                out.push_str(&table(&rows(std::slice::from_ref(s))));
                if let Some(reason) = &s.reason {
                    out.push_str(&format!("suspect: {}\n", escape_control(reason)));
                }
                for failure in &node.runs.failures {
                    out.push_str(&format!(
                        "failure  {}  {} ({})  {}\n",
                        utc(failure.at_ms),
                        failure.kind,
                        failure.class,
                        failure.run_id
                    ));
                }
                let lists = [
                    ("attempts", &node.runs.attempts),
                    ("stall suspect", &node.runs.stall_suspect),
                    ("straggler", &node.runs.straggler),
                ];
                for (what, runs) in lists {
                    if !runs.is_empty() {
                        let ids: Vec<String> = runs.iter().map(ToString::to_string).collect();
                        out.push_str(&format!("{what}: {}\n", ids.join(" ")));
                    }
                }
            }
            Ok(out)
        }
    }
}

/// The table of `nodes`, with its header.
fn rows(nodes: &[NodeSummary]) -> Vec<Vec<String>> {
    let header = [
        "NODE",
        "CLUSTER",
        "VERDICT",
        "ATTEMPTS",
        "INFRA",
        "APP",
        "INTERRUPTED",
        "NO_PROGRESS",
        "STALLS",
        "STRAGGLER",
        "LAST SEEN",
    ];
    let mut rows = vec![header.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>()];
    for n in nodes {
        rows.push(vec![
            escape_control(&n.node).into_owned(),
            n.cluster.as_deref().map_or("-".into(), |c| escape_control(c).into_owned()),
            if n.suspect { "SUSPECT".into() } else { "ok".into() },
            n.attempts.to_string(),
            n.failures.infrastructure.to_string(),
            n.failures.application.to_string(),
            n.failures.interrupted.to_string(),
            n.failures.no_progress.to_string(),
            n.stall_suspect.to_string(),
            n.straggler.to_string(),
            n.last_seen_ms.map_or("-".into(), utc),
        ]);
    }
    rows
}
