//! `trainstate token create|list|revoke`: administering a head's bearer
//! tokens over HTTP, with a token that has the scope `admin`.

use std::process::ExitCode;

use clap::Subcommand;
use trainstate_schema::text::escape_control;

use super::HeadArgs;
use super::runs::{connect_head, table, unreachable_head, utc};
use crate::api::{CreateTokenRequest, TokenInfo, TokenScope};

/// `trainstate token …`: a head's bearer tokens.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print its secret (shown this once) on stdout.
    Create {
        /// The head.
        #[command(flatten)]
        head: HeadArgs,
        /// What the token may do: read, write, admin (repeat, or comma-separated).
        #[arg(long = "scope", required = true, value_delimiter = ',', value_parser = parse_scope)]
        scopes: Vec<TokenScope>,
        /// Bind the token to this cluster: it may only forward that cluster's
        /// runs to a hub (needs exactly --scope write).
        #[arg(long)]
        cluster: Option<String>,
        /// What the token is for, shown by `token list`.
        #[arg(long)]
        name: Option<String>,
    },
    /// List every token (never a secret), revoked ones included.
    List {
        /// The head.
        #[command(flatten)]
        head: HeadArgs,
    },
    /// Revoke a token: the head refuses it from then on.
    Revoke {
        /// The head.
        #[command(flatten)]
        head: HeadArgs,
        /// The token's id, as `token list` shows it.
        id: String,
    },
}

fn parse_scope(text: &str) -> Result<TokenScope, String> {
    TokenScope::parse(text.trim())
        .ok_or_else(|| format!("unknown scope {text:?}: one of read, write, admin"))
}

/// Runs a `token` command: what it prints on stdout, or its error on stderr.
pub fn token(command: TokenCommand) -> ExitCode {
    super::block_on(answer(command))
}

async fn answer(command: TokenCommand) -> Result<String, String> {
    match command {
        TokenCommand::Create { head, scopes, cluster, name } => {
            let request = CreateTokenRequest::new(scopes).with_cluster(cluster).with_name(name);
            let created = connect_head(&head)?
                .create_token(&request)
                .await
                .map_err(|e| unreachable_head(&head.url, e))?;
            if head.json {
                return Ok(format!("{}\n", serde_json::to_string(&created).expect("serializes")));
            }
            eprintln!(
                "created token {} ({}); its secret is printed once, below",
                created.token.id,
                describe(&created.token)
            );
            Ok(format!("{}\n", created.secret))
        }
        TokenCommand::List { head } => {
            let listed = connect_head(&head)?
                .list_tokens()
                .await
                .map_err(|e| unreachable_head(&head.url, e))?;
            if head.json {
                return Ok(format!("{}\n", serde_json::to_string(&listed).expect("serializes")));
            }
            let mut rows = vec![vec![
                "ID".to_owned(),
                "NAME".into(),
                "SCOPES".into(),
                "CLUSTER".into(),
                "CREATED (UTC)".into(),
                "REVOKED (UTC)".into(),
            ]];
            for token in &listed.tokens {
                rows.push(vec![
                    token.id.clone(),
                    escape_control(token.name.as_deref().unwrap_or("-")).into_owned(),
                    scopes(token),
                    escape_control(token.cluster.as_deref().unwrap_or("-")).into_owned(),
                    utc(token.created_at_ms),
                    token.revoked_at_ms.map_or("-".to_owned(), utc),
                ]);
            }
            Ok(table(&rows))
        }
        TokenCommand::Revoke { head, id } => {
            let revoked = connect_head(&head)?
                .revoke_token(&id)
                .await
                .map_err(|e| unreachable_head(&head.url, e))?;
            if head.json {
                return Ok(format!("{}\n", serde_json::to_string(&revoked).expect("serializes")));
            }
            Ok(format!("revoked token {} ({})\n", revoked.id, describe(&revoked)))
        }
    }
}

fn scopes(token: &TokenInfo) -> String {
    token.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",")
}

fn describe(token: &TokenInfo) -> String {
    let mut text = format!("scopes {}", scopes(token));
    if let Some(cluster) = &token.cluster {
        text.push_str(&format!(", cluster {}", escape_control(cluster)));
    }
    if let Some(name) = &token.name {
        text.push_str(&format!(", name {}", escape_control(name)));
    }
    text
}
