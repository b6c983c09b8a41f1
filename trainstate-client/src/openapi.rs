//! The JSON Schemas of the wire types and the OpenAPI 3.1 document of the
//! head service's HTTP API, generated from the Rust types.
//!
//! `cargo xtask codegen` commits their output under `schemas/`, and the head
//! serves the same documents, so a frontend can take either.

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value, json};
use trainstate_schema::{
    ActorStatus, CauseKind, Resources, RunAttempt, RunCause, RunId, RunStatus, TrainDatasetInfo,
    TrainRunInfo, TrainWorkerInfo,
};

use crate::api::{
    AttemptRequest, ErrorResponse, EventData, HeartbeatResponse, RayRunListResponse,
    RegisterResponse, RunListResponse, SnapshotData, StatusRequest, VersionResponse,
};

/// The JSON Schema (2020-12) of every public wire type, by type name, in
/// documentation order. These are deserialize contracts: what is accepted.
pub fn wire_schemas() -> Vec<(&'static str, Schema)> {
    fn of<T: JsonSchema>(name: &'static str) -> (&'static str, Schema) {
        let generator = SchemaSettings::draft2020_12().for_deserialize().into_generator();
        (name, generator.into_root_schema_for::<T>())
    }
    vec![
        of::<TrainRunInfo>("TrainRunInfo"),
        of::<TrainWorkerInfo>("TrainWorkerInfo"),
        of::<TrainDatasetInfo>("TrainDatasetInfo"),
        of::<RunAttempt>("RunAttempt"),
        of::<RunStatus>("RunStatus"),
        of::<ActorStatus>("ActorStatus"),
        of::<RunCause>("RunCause"),
        of::<CauseKind>("CauseKind"),
        of::<RunId>("RunId"),
        of::<Resources>("Resources"),
    ]
}

/// The text of a generated document: pretty JSON and a final newline, as
/// committed under `schemas/` and as the head serves it.
pub fn to_document_text(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    text.push('\n');
    text
}

/// The wire schema of `name`, if it is a public wire type.
pub fn wire_schema(name: &str) -> Option<Schema> {
    wire_schemas().into_iter().find(|(n, _)| *n == name).map(|(_, s)| s)
}

/// The OpenAPI 3.1 document of the head service.
pub fn document() -> Value {
    let mut settings = SchemaSettings::draft2020_12().for_deserialize();
    settings.definitions_path = "/components/schemas".into();
    let mut generator = settings.into_generator();
    let mut refs = Refs { generator: &mut generator };
    let run = refs.of::<TrainRunInfo>();
    let list = refs.of::<RunListResponse>();
    let ray_list = refs.of::<RayRunListResponse>();
    let register = refs.of::<RegisterResponse>();
    let status = refs.of::<StatusRequest>();
    let attempt = refs.of::<AttemptRequest>();
    let heartbeat = refs.of::<HeartbeatResponse>();
    let version = refs.of::<VersionResponse>();
    let error = refs.of::<ErrorResponse>();
    let event = refs.of::<EventData>();
    let snapshot = refs.of::<SnapshotData>();
    let components = generator.take_definitions(true);

    let json_body =
        |schema: &Value| json!({ "content": { "application/json": { "schema": schema } } });
    let error_response = |description: &str| json!({ "description": description, "content": { "application/json": { "schema": error } } });
    let ok = |description: &str, schema: &Value| json!({ "description": description, "content": { "application/json": { "schema": schema } } });
    let id_param = json!({
        "name": "id", "in": "path", "required": true,
        "description": "The run id.",
        "schema": { "type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$" }
    });
    let query = |name: &str, description: &str, schema: Value| json!({ "name": name, "in": "query", "required": false, "description": description, "schema": schema });
    let string = json!({ "type": "string" });
    let errors = |codes: &[(&str, &str)]| {
        let mut map = Map::new();
        for (code, description) in codes {
            map.insert((*code).into(), error_response(description));
        }
        map
    };
    let write_errors = [
        ("400", "Unparseable JSON or bad UTF-8."),
        ("401", "Missing or wrong bearer token."),
        ("404", "No run has this id."),
        ("409", "Conflict with the stored run, or an illegal transition."),
        ("413", "Body over the size limit."),
        ("415", "Content type is not application/json."),
        ("422", "Wrong type, missing field or a broken rule; names the field and the rule."),
        ("503", "Store unavailable or overloaded; retry later."),
    ];
    let with = |mut responses: Map<String, Value>, extra: Map<String, Value>| {
        responses.extend(extra);
        Value::Object(responses)
    };
    let one = |code: &str, response: Value| {
        let mut map = Map::new();
        map.insert(code.into(), response);
        map
    };

    json!({
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "trainstate head service",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Run-state tracking for distributed training. Runs serialise as Ray Train's V1 TrainRunInfo plus trainstate's extensions. Every error answer has the shape {\"error\": {\"code\", \"message\", \"field\"}}. When the head has a token, every write needs `Authorization: Bearer <token>` (and reads too when reads are protected; GET requests may pass `access_token` as a query parameter instead).",
            "license": { "name": "MIT OR Apache-2.0", "identifier": "MIT OR Apache-2.0" }
        },
        "components": {
            "schemas": components,
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } }
        },
        "paths": {
            "/api/train/runs": {
                "get": {
                    "operationId": "listRuns",
                    "summary": "List runs, newest first (start_time_ms desc, id desc), filtered and paged.",
                    "parameters": [
                        query("status", "Comma-separated statuses (RUNNING, FINISHED, ERRORED, ABORTED).", string.clone()),
                        query("job_id", "Only runs of this job.", string.clone()),
                        query("name", "Only runs whose name contains this text.", string.clone()),
                        query("node_id", "Only runs that had a worker on this node id.", string.clone()),
                        query("node_ip", "Only runs that had a worker on this node IP.", string.clone()),
                        query("limit", "Page size, 1 to 1000; default 100.", json!({ "type": "integer", "minimum": 1, "maximum": 1000 })),
                        query("cursor", "The next_cursor of the previous page.", string.clone())
                    ],
                    "responses": with(one("200", ok("One page.", &list)), errors(&[("401", "Missing or wrong token (protected reads)."), ("422", "A bad filter, limit or cursor.")]))
                },
                "post": {
                    "operationId": "registerRun",
                    "summary": "Register a run. Repeating it with identical static metadata is a no-op (200); with different metadata, 409.",
                    "security": [{ "bearer": [] }],
                    "requestBody": { "required": true, "content": { "application/json": { "schema": run } } },
                    "responses": with(
                        {
                            let mut m = one("201", ok("Registered.", &register));
                            m.insert("200".into(), ok("Already registered with the same metadata.", &register));
                            m
                        },
                        errors(&write_errors)
                    )
                }
            },
            "/api/train/v2/runs": {
                "get": {
                    "operationId": "listRunsRay",
                    "summary": "Every retained run, newest first, unpaged: Ray 2.60's dashboard route for Train V1 state.",
                    "responses": with(one("200", ok("Every run.", &ray_list)), errors(&[("401", "Missing or wrong token (protected reads).")]))
                }
            },
            "/api/train/runs/{id}": {
                "parameters": [id_param.clone()],
                "get": {
                    "operationId": "getRun",
                    "summary": "One run.",
                    "responses": with(one("200", ok("The run.", &run)), errors(&[("401", "Missing or wrong token (protected reads)."), ("404", "No run has this id.")]))
                },
                "delete": {
                    "operationId": "deleteRun",
                    "summary": "Delete an ended run.",
                    "security": [{ "bearer": [] }],
                    "responses": with(one("204", json!({ "description": "Deleted." })), errors(&[("401", "Missing or wrong bearer token."), ("404", "No run has this id."), ("409", "The run is live."), ("503", "Store unavailable.")]))
                }
            },
            "/api/train/runs/{id}/status": {
                "parameters": [id_param.clone()],
                "post": {
                    "operationId": "setRunStatus",
                    "summary": "Set a run's status along a legal transition. Repeating the current terminal status (same cause) is a no-op.",
                    "security": [{ "bearer": [] }],
                    "requestBody": json_body(&status),
                    "responses": with(one("200", ok("The run after the change.", &run)), errors(&write_errors))
                }
            },
            "/api/train/runs/{id}/attempts": {
                "parameters": [id_param.clone()],
                "post": {
                    "operationId": "startRunAttempt",
                    "summary": "Replace a live run's worker group with a new attempt. Repeating the current attempt is a no-op.",
                    "security": [{ "bearer": [] }],
                    "requestBody": json_body(&attempt),
                    "responses": with(one("200", ok("The run after the change.", &run)), errors(&write_errors))
                }
            },
            "/api/train/runs/{id}/heartbeat": {
                "parameters": [id_param],
                "post": {
                    "operationId": "heartbeatRun",
                    "summary": "Renew a live run's lease.",
                    "security": [{ "bearer": [] }],
                    "responses": with(one("200", ok("The renewed lease.", &heartbeat)), errors(&write_errors))
                }
            },
            "/api/train/events": {
                "get": {
                    "operationId": "runEvents",
                    "summary": "Server-Sent Events: a `snapshot` event (every run), then one event per committed change (`registered`, `status_changed`, `attempt_started`, `evicted`, `deleted`), each with its sequence number as id. Reconnect with Last-Event-ID (or `last_event_id`) to resume without gaps; when the head no longer keeps those events it sends a fresh snapshot instead.",
                    "parameters": [query("last_event_id", "Resume after this event id.", json!({ "type": "integer", "minimum": 0 }))],
                    "responses": with(
                        one("200", json!({
                            "description": "The event stream. Each event's data is an EventData, or a SnapshotData for `snapshot` events.",
                            "content": { "text/event-stream": { "schema": { "oneOf": [event, snapshot] } } }
                        })),
                        errors(&[("401", "Missing or wrong token (protected reads)."), ("503", "Too many subscribers.")])
                    )
                }
            },
            "/api/schemas/{type}": {
                "get": {
                    "operationId": "getSchema",
                    "summary": "The JSON Schema (2020-12) of a wire type, for example TrainRunInfo.",
                    "parameters": [{ "name": "type", "in": "path", "required": true, "schema": string.clone() }],
                    "responses": with(one("200", json!({ "description": "The schema.", "content": { "application/schema+json": { "schema": { "type": "object" } } } })), errors(&[("404", "No such type.")]))
                }
            },
            "/openapi.json": {
                "get": {
                    "operationId": "getOpenApi",
                    "summary": "This document.",
                    "responses": { "200": { "description": "The OpenAPI document.", "content": { "application/json": { "schema": { "type": "object" } } } } }
                }
            },
            "/api/version": {
                "get": {
                    "operationId": "getVersion",
                    "summary": "Service and schema versions.",
                    "responses": { "200": ok("Versions.", &version) }
                }
            },
            "/healthz": {
                "get": {
                    "operationId": "health",
                    "summary": "Liveness: 200 while the head serves and its state actor answers.",
                    "responses": with(one("200", json!({ "description": "Healthy." })), errors(&[("503", "The state actor does not answer.")]))
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "summary": "Prometheus text exposition: runs by status, requests by route and code, request latency, store commits, subscribers.",
                    "responses": { "200": { "description": "Metrics.", "content": { "text/plain": { "schema": { "type": "string" } } } } }
                }
            }
        }
    })
}

struct Refs<'a> {
    generator: &'a mut SchemaGenerator,
}

impl Refs<'_> {
    fn of<T: JsonSchema>(&mut self) -> Value {
        self.generator.subschema_for::<T>().to_value()
    }
}
