//! The facts of the HTTP API that clients written in other languages need,
//! read from the route table and `trainstate-schema`: every route's method
//! and path template, the error codes with their statuses and whether a
//! retry may help, the run statuses, the event kinds and the limits.
//!
//! The Python client (`python.rs`) and the web page (`page.rs`) render the
//! same [`Contract`], so neither copies a path, a limit or an enumeration.

use serde_json::Value;
use trainstate_schema::api::{
    ErrorCode, MAX_JOIN_TIMEOUT_MS, MAX_RENDEZVOUS_KEY_LEN, RENDEZVOUS_KEY_PATTERN,
    RUN_LINK_PLACEHOLDERS, WORKER_LINK_PLACEHOLDERS,
};
use trainstate_schema::routes::routes;
use trainstate_schema::{RunStatus, limits};

use crate::codegen::NamedSchema;

/// Everything the other clients are generated from.
pub(crate) struct Contract {
    /// Every route, in the table's order.
    pub(crate) routes: Vec<ContractRoute>,
    /// Every error code, in `ErrorCode::ALL`'s order.
    pub(crate) error_codes: Vec<ContractErrorCode>,
    /// Every run status, in lifecycle order.
    pub(crate) run_statuses: Vec<&'static str>,
    /// The statuses a run ends with.
    pub(crate) terminal_run_statuses: Vec<&'static str>,
    /// The statuses a V1 reader sees (every live status is `RUNNING`), and
    /// so the statuses the listing's filter tells apart.
    pub(crate) v1_run_statuses: Vec<&'static str>,
    /// The event kinds of the live stream.
    pub(crate) event_kinds: Vec<String>,
    /// The placeholders of a run's link template.
    pub(crate) run_link_placeholders: Vec<&'static str>,
    /// The placeholders of a worker's link template, beside the run's.
    pub(crate) worker_link_placeholders: Vec<&'static str>,
    /// Limits of the wire format and the API.
    pub(crate) limits: Vec<Limit>,
}

/// One route: its name (the `operationId` in upper snake case), method
/// and path template.
pub(crate) struct ContractRoute {
    /// The OpenAPI `operationId`, for example `joinRendezvous`.
    pub(crate) operation_id: &'static str,
    /// The `operationId` in upper snake case, for example `JOIN_RENDEZVOUS`.
    pub(crate) constant: String,
    /// `GET`, `POST`, `PUT` or `DELETE`.
    pub(crate) method: String,
    /// The path template, with `{name}` parameters.
    pub(crate) path: &'static str,
    /// One line on what it does.
    pub(crate) summary: &'static str,
}

/// One error code.
pub(crate) struct ContractErrorCode {
    /// Its wire spelling.
    pub(crate) code: &'static str,
    /// Its HTTP status.
    pub(crate) status: u16,
    /// `ErrorCode::is_retryable`.
    pub(crate) retryable: bool,
}

/// One limit.
pub(crate) struct Limit {
    /// Its name, as `trainstate-schema` names it.
    pub(crate) name: &'static str,
    /// Its value.
    pub(crate) value: LimitValue,
    /// What it bounds.
    pub(crate) doc: &'static str,
}

/// A limit's value.
pub(crate) enum LimitValue {
    /// A number.
    Number(u64),
    /// A pattern (a regular expression that JavaScript and Python read alike).
    Pattern(&'static str),
}

/// The contract, from the route table, `trainstate-schema` and the schemas.
pub(crate) fn contract(schemas: &[NamedSchema]) -> Contract {
    let routes = routes()
        .into_iter()
        .map(|route| ContractRoute {
            operation_id: route.operation_id,
            constant: upper_snake(route.operation_id),
            method: route.method.as_lower_str().to_ascii_uppercase(),
            path: route.path,
            summary: route.summary,
        })
        .collect();
    let error_codes = ErrorCode::ALL
        .into_iter()
        .map(|code| ContractErrorCode {
            code: code.as_str(),
            status: code.http_status(),
            retryable: code.is_retryable(),
        })
        .collect();
    let mut v1_run_statuses: Vec<&'static str> = Vec::new();
    for status in RunStatus::ALL {
        let v1 = status.v1().as_str();
        if !v1_run_statuses.contains(&v1) {
            v1_run_statuses.push(v1);
        }
    }
    let list_limit_max = schema_named(schemas, "ListQuery")
        .and_then(|schema| schema.pointer("/properties/limit/maximum"))
        .and_then(Value::as_u64)
        .expect("ListQuery's schema bounds its limit");
    let event_kinds = schema_named(schemas, "RunEvent")
        .and_then(|schema| schema.pointer("/$defs/EventKind"))
        .map(enumeration)
        .filter(|kinds| !kinds.is_empty())
        .expect("RunEvent's schema defines EventKind as an enumeration");
    Contract {
        routes,
        error_codes,
        run_statuses: RunStatus::ALL.iter().map(|s| s.as_str()).collect(),
        terminal_run_statuses: RunStatus::ALL
            .iter()
            .filter(|s| s.is_terminal())
            .map(|s| s.as_str())
            .collect(),
        v1_run_statuses,
        event_kinds,
        run_link_placeholders: RUN_LINK_PLACEHOLDERS.to_vec(),
        worker_link_placeholders: WORKER_LINK_PLACEHOLDERS.to_vec(),
        limits: limits_list(list_limit_max),
    }
}

fn limits_list(list_limit_max: u64) -> Vec<Limit> {
    use LimitValue::{Number, Pattern};
    let n = |value: usize| Number(value as u64);
    vec![
        Limit {
            name: "MAX_RUN_ID_LEN",
            value: n(limits::MAX_RUN_ID_LEN),
            doc: "Longest run id, in characters.",
        },
        Limit {
            name: "MAX_NAME_LEN",
            value: n(limits::MAX_NAME_LEN),
            doc: "Longest name or non-run id (job_id, actor_id, node_id, ...), in characters.",
        },
        Limit {
            name: "MAX_TRACE_LEN",
            value: n(limits::MAX_TRACE_LEN),
            doc: "Longest error trace kept in a status detail, in characters (Ray keeps the last 50,000).",
        },
        Limit {
            name: "MAX_STATUS_DETAIL_LEN",
            value: n(limits::MAX_STATUS_DETAIL_LEN),
            doc: "Longest status detail, in characters.",
        },
        Limit {
            name: "MAX_WORKERS",
            value: n(limits::MAX_WORKERS),
            doc: "Most workers in one run (or one attempt).",
        },
        Limit {
            name: "MAX_GPUS_PER_WORKER",
            value: n(limits::MAX_GPUS_PER_WORKER),
            doc: "Most GPU ids on one worker.",
        },
        Limit {
            name: "MAX_RENDEZVOUS_KEY_LEN",
            value: n(MAX_RENDEZVOUS_KEY_LEN),
            doc: "Longest rendezvous key, in characters.",
        },
        Limit {
            name: "RENDEZVOUS_KEY_PATTERN",
            value: Pattern(RENDEZVOUS_KEY_PATTERN),
            doc: "The pattern of a rendezvous key: safe in a URL path.",
        },
        Limit {
            name: "MAX_JOIN_TIMEOUT_MS",
            value: Number(MAX_JOIN_TIMEOUT_MS),
            doc: "The longest a group may wait for its missing ranks, in milliseconds.",
        },
        Limit {
            name: "LIST_LIMIT_MAX",
            value: Number(list_limit_max),
            doc: "The largest page of GET /api/train/runs (its `limit`).",
        },
    ]
}

/// The root schema of the named wire type.
fn schema_named<'a>(schemas: &'a [NamedSchema], name: &str) -> Option<&'a Value> {
    schemas.iter().find(|named| named.name == name).map(|named| named.schema.as_value())
}

/// The values of a string enumeration (`enum`, or `oneOf` of `const`s).
fn enumeration(schema: &Value) -> Vec<String> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect();
    }
    schema
        .get("oneOf")
        .and_then(Value::as_array)
        .map(|alternatives| {
            alternatives
                .iter()
                .filter_map(|a| a.get("const").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// `joinRendezvous` as `JOIN_RENDEZVOUS`.
fn upper_snake(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_become_constants() {
        assert_eq!(upper_snake("joinRendezvous"), "JOIN_RENDEZVOUS");
        assert_eq!(upper_snake("listRunsRayV2"), "LIST_RUNS_RAY_V2");
        assert_eq!(upper_snake("health"), "HEALTH");
    }
}
