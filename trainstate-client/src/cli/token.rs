//! `trainstate token create|list|revoke`: administering a head's bearer
//! tokens over HTTP, with a token that has the scope `admin`.

use std::process::ExitCode;

use clap::Subcommand;
use trainstate_schema::text::escape_control;

use super::HeadArgs;
use super::runs::{connect_head, table, unreachable_head, utc};
use crate::api::{
    CreateTokenRequest, MAX_TOKEN_EXPIRES_IN_MS, MIN_TOKEN_EXPIRES_IN_MS, TokenInfo, TokenScope,
};

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
        /// How long the token is valid from its creation, on the head's
        /// clock: a number and a unit, s, m, h or d (`90m`, `30d`); 1 s to
        /// ten years. Without it the token never expires.
        #[arg(long, value_parser = parse_expires_in)]
        expires_in: Option<u64>,
        /// The creation's idempotency key (16 to 128 visible ASCII
        /// characters, best random): running the same command again with
        /// it prints the same token and secret instead of creating another.
        /// Without it, one is made for this run (its retries use it).
        #[arg(long)]
        idempotency_key: Option<String>,
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

/// A lifetime as `--expires-in` takes it (`30d`), in ms.
fn parse_expires_in(text: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "--expires-in is a number and a unit, s, m, h or d (for example 30d), from 1s to \
             3650d; not {text:?}"
        )
    };
    let text = text.trim();
    let unit_at = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(unit_at);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let unit_ms = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    let ms = number.checked_mul(unit_ms).ok_or_else(bad)?;
    if !(MIN_TOKEN_EXPIRES_IN_MS..=MAX_TOKEN_EXPIRES_IN_MS).contains(&ms) {
        return Err(bad());
    }
    Ok(ms)
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
        TokenCommand::Create { head, scopes, cluster, name, expires_in, idempotency_key } => {
            let request = CreateTokenRequest::new(scopes)
                .with_cluster(cluster)
                .with_name(name)
                .with_expires_in_ms(expires_in);
            let handle = connect_head(&head)?;
            let created = match &idempotency_key {
                Some(key) => handle.create_token_with_key(&request, key).await,
                None => handle.create_token(&request).await,
            }
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
                "EXPIRES (UTC)".into(),
            ]];
            for token in &listed.tokens {
                rows.push(vec![
                    token.id.clone(),
                    escape_control(token.name.as_deref().unwrap_or("-")).into_owned(),
                    scopes(token),
                    escape_control(token.cluster.as_deref().unwrap_or("-")).into_owned(),
                    utc(token.created_at_ms),
                    token.revoked_at_ms.map_or("-".to_owned(), utc),
                    match token.expires_at_ms {
                        None => "-".to_owned(),
                        Some(at) if token.expired => format!("{} (expired)", utc(at)),
                        Some(at) => utc(at),
                    },
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
    if let Some(at) = token.expires_at_ms {
        text.push_str(&format!(", expires {} UTC", utc(at)));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::parse_expires_in;

    #[test]
    fn expires_in_is_a_number_and_a_unit_within_its_bounds() {
        assert_eq!(parse_expires_in("30d"), Ok(30 * 86_400_000));
        assert_eq!(parse_expires_in("90m"), Ok(90 * 60_000));
        assert_eq!(parse_expires_in("1s"), Ok(1_000));
        for bad in ["", "30", "d", "30w", "0s", "3651d", "-1d", "1.5h", "99999999999999999999d"] {
            let err = parse_expires_in(bad).unwrap_err();
            assert!(err.contains("--expires-in"), "{bad}: {err}");
        }
    }
}
