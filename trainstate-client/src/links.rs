//! Links out of the page and the CLI: URL templates an operator configures
//! for logs and metrics dashboards, checked once and filled per run or
//! worker.

use trainstate_schema::{TrainRunInfo, TrainWorkerInfo};

use crate::api::{RUN_LINK_PLACEHOLDERS, WORKER_LINK_PLACEHOLDERS};

/// Checks a template: an `http://` or `https://` URL with a host, whose
/// placeholders are all known and stand only in its path, query or
/// fragment, never in its scheme, host or port: a run's values (a run
/// named `.evil.example`) can then never send the link to another site.
/// The error says what is wrong, for the flag's message.
pub fn check_template(template: &str) -> Result<(), String> {
    let Some(after_scheme) =
        template.strip_prefix("http://").or_else(|| template.strip_prefix("https://"))
    else {
        return Err(format!("{template:?} must start with http:// or https://"));
    };
    for name in placeholders(template)? {
        let known =
            RUN_LINK_PLACEHOLDERS.contains(&name) || WORKER_LINK_PLACEHOLDERS.contains(&name);
        if !known {
            return Err(format!(
                "{template:?} names {{{name}}}; known: {}",
                RUN_LINK_PLACEHOLDERS
                    .iter()
                    .chain(&WORKER_LINK_PLACEHOLDERS)
                    .map(|p| format!("{{{p}}}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    let authority =
        &after_scheme[..after_scheme.find(['/', '?', '#']).unwrap_or(after_scheme.len())];
    if authority.contains(['{', '}']) {
        return Err(format!(
            "{template:?} has a placeholder in its host or port ({authority:?}); placeholders \
             may stand only in the path, query or fragment, so that a run's values cannot send \
             the link to another site"
        ));
    }
    let sample = fill_with(template, |_| "x".to_owned());
    let url = url::Url::parse(&sample).map_err(|e| format!("{template:?} is not a URL: {e}"))?;
    if authority.is_empty() || url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{template:?} names no host"));
    }
    Ok(())
}

/// True when the template links a worker, not a run.
pub fn is_per_worker(template: &str) -> bool {
    placeholders(template)
        .is_ok_and(|names| names.iter().any(|n| WORKER_LINK_PLACEHOLDERS.contains(n)))
}

/// The template filled for `run` (its current attempt) and, for a
/// per-worker template, `worker`.
pub fn fill(template: &str, run: &TrainRunInfo, worker: Option<&TrainWorkerInfo>) -> String {
    let value = |name: &str| -> String {
        match name {
            "run_id" => run.id().to_string(),
            "run_name" => run.name().to_owned(),
            "job_id" => run.job_id().to_owned(),
            "attempt_id" => {
                run.attempts().last().map(|a| a.attempt_id().to_owned()).unwrap_or_default()
            }
            "start_ms" => run.start_time_ms().to_string(),
            "end_ms" => run.end_time_ms().map(|t| t.to_string()).unwrap_or_default(),
            "rank" => worker.map(|w| w.world_rank().to_string()).unwrap_or_default(),
            "node_id" => worker.map(|w| w.node_id().to_owned()).unwrap_or_default(),
            "node_ip" => worker.map(|w| w.node_ip().to_owned()).unwrap_or_default(),
            "pid" => worker.map(|w| w.pid().to_string()).unwrap_or_default(),
            _ => String::new(),
        }
    };
    fill_with(template, value)
}

/// The template with each placeholder replaced by `value` of its name,
/// encoded as one URL component (a space is %20, as in a browser; `/`,
/// `?`, `#`, `@` and `:` are encoded too), so that no value changes the
/// URL's structure.
fn fill_with(template: &str, value: impl Fn(&str) -> String) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else { break };
        let name = &rest[open + 1..open + close];
        let encoded: String =
            url::form_urlencoded::byte_serialize(value(name).as_bytes()).collect();
        out.push_str(&encoded.replace('+', "%20"));
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

/// The placeholder names of a template, in order.
fn placeholders(template: &str) -> Result<Vec<&str>, String> {
    let mut names = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let close =
            rest[open..].find('}').ok_or_else(|| format!("{template:?} has an unclosed {{"))?;
        names.push(&rest[open + 1..open + close]);
        rest = &rest[open + close + 1..];
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_known_placeholders_only() {
        let cases = [
            ("https://logs/{run_id}/{rank}", true),
            ("http://grafana/d/x?var-run={run_id}&from={start_ms}", true),
            ("ftp://logs/{run_id}", false),
            ("https://logs/{run}", false),
            ("https://logs/{run_id", false),
            ("https://logs{run_name}/x", false),
            ("https://{run_name}.example/x", false),
            ("https://logs.example:{pid}/x", false),
            ("https://{run_id}@logs.example/x", false),
            ("https://logs.example#{run_id}", true),
            ("https://logs.example?run={run_id}", true),
            ("https:///{run_id}", false),
        ];
        for (template, ok) in cases {
            assert_eq!(check_template(template).is_ok(), ok, "{template}");
        }
        assert!(is_per_worker("https://logs/{run_id}/{node_ip}"));
        assert!(!is_per_worker("https://logs/{run_id}"));
    }
}
