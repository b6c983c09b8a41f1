//! One line of Ray's export event file, from protobuf JSON to Ray's own
//! documents.
//!
//! Ray writes each event with protobuf's JSON mapping
//! (`always_print_fields_with_no_presence`, field names as in the
//! `.proto`, enums by name), which differs from the JSON its dashboard
//! serves for the same run:
//!
//! - `bytes` fields (job, actor and node ids) are base64; the dashboard
//!   shows them as lowercase hex.
//! - 64-bit integers (times in ns) are strings.
//! - Enums are names: `TRAINING_FRAMEWORK_UNSPECIFIED`, `MAX`; the
//!   dashboard has `null`, `"max"`.
//! - Oneofs are one of several fields: `num_workers_fixed` or
//!   `num_workers_range {min, max}` for `num_workers`; `all {}` or
//!   `datasets {values}` for `datasets_to_split`.
//! - An unset optional field is absent; the dashboard has `null`.
//!
//! Decoding reads the proto3 JSON mapping leniently, as protobuf's own
//! parsers do (integers as numbers or strings, enums as names or numbers,
//! base64 with either alphabet, padded or not), and writes exactly the
//! shape of Ray's `TrainRun` and `TrainRunAttempt` pydantic models, which
//! then deserializes into [`ray_v2::TrainRun`] and
//! [`ray_v2::TrainRunAttempt`].

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_PAD_INDIFFERENT, URL_SAFE_PAD_INDIFFERENT};
use serde_json::{Map, Value, json};
use trainstate_schema::ray_v2;

/// `source_type` of an event that carries a Train run
/// (`ExportTrainRunEventData`).
pub const EXPORT_TRAIN_RUN: &str = "EXPORT_TRAIN_RUN";
/// `source_type` of an event that carries a Train run attempt
/// (`ExportTrainRunAttemptEventData`).
pub const EXPORT_TRAIN_RUN_ATTEMPT: &str = "EXPORT_TRAIN_RUN_ATTEMPT";

/// `source_type` of an event that carries an actor (`ExportActorData`).
pub const EXPORT_ACTOR: &str = "EXPORT_ACTOR";
/// `source_type` of an event that carries a driver job
/// (`ExportDriverJobEventData`).
pub const EXPORT_DRIVER_JOB: &str = "EXPORT_DRIVER_JOB";
/// `source_type` of an event that carries a node (`ExportNodeData`).
pub const EXPORT_NODE: &str = "EXPORT_NODE";

/// `ExportActorData.ActorState`, by number.
const ACTOR_STATES: &[&str] =
    &["DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD"];
/// `ExportNodeData.GcsNodeState`, by number.
const NODE_STATES: &[&str] = &["ALIVE", "DEAD"];
/// `NodeDeathInfo.Reason` (of `ExportNodeData` and of an actor's death
/// cause), by number.
const NODE_DEATH_REASONS: &[&str] = &[
    "UNSPECIFIED",
    "EXPECTED_TERMINATION",
    "UNEXPECTED_TERMINATION",
    "AUTOSCALER_DRAIN_PREEMPTED",
    "AUTOSCALER_DRAIN_IDLE",
];
/// `ActorDiedErrorContext.Reason`, by number.
const ACTOR_DEATH_REASONS: &[&str] = &[
    "UNSPECIFIED",
    "WORKER_DIED",
    "OWNER_DIED",
    "NODE_DIED",
    "RAY_KILL",
    "OUT_OF_SCOPE",
    "REF_DELETED",
];

/// `ExportTrainRunEventData.RunStatus`, by number.
const RUN_STATUSES: &[&str] = &[
    "RUN_STATUS_UNSPECIFIED",
    "INITIALIZING",
    "SCHEDULING",
    "RUNNING",
    "RESTARTING",
    "RESIZING",
    "FINISHED",
    "ERRORED",
    "ABORTED",
];
/// `ExportTrainRunAttemptEventData.RunAttemptStatus`, by number.
const ATTEMPT_STATUSES: &[&str] =
    &["RUN_ATTEMPT_STATUS_UNSPECIFIED", "PENDING", "RUNNING", "FINISHED", "ERRORED", "ABORTED"];
/// `ExportTrainRunAttemptEventData.ActorStatus`, by number.
const ACTOR_STATUSES: &[&str] = &["ACTOR_STATUS_UNSPECIFIED", "ALIVE", "DEAD"];

/// A Train event of Ray's export API, as Ray's own documents.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ExportEvent {
    /// A run, whole, as it is now (`EXPORT_TRAIN_RUN`).
    Run(Box<ray_v2::TrainRun>),
    /// An attempt of a run, whole, as it is now (`EXPORT_TRAIN_RUN_ATTEMPT`).
    Attempt(Box<ray_v2::TrainRunAttempt>),
}

impl ExportEvent {
    /// The id of the run the event is about.
    pub fn run_id(&self) -> &str {
        match self {
            ExportEvent::Run(run) => &run.id,
            ExportEvent::Attempt(attempt) => &attempt.run_id,
        }
    }
}

/// The death of something a run depends on, as Ray's GCS reports it in
/// its export events: ids in lowercase hex, as Ray's dashboard and the
/// Train events' documents have them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Death {
    /// An actor died (`EXPORT_ACTOR`, state `DEAD`).
    Actor {
        /// The actor's id.
        actor_id: String,
        /// The id of the actor's job.
        job_id: String,
        /// The actor's class (`TrainController` for a Train V2 run's controller).
        class_name: String,
        /// Why, by Ray's `ActorDiedErrorContext.Reason` (`OWNER_DIED`,
        /// `NODE_DIED`, `RAY_KILL`, ...), or the kind of its death cause
        /// (`CREATION_TASK_FAILED`, `RUNTIME_ENV_FAILED`, `UNSCHEDULABLE`,
        /// `OUT_OF_MEMORY`); `None` when Ray gives none.
        reason: Option<&'static str>,
        /// Ray's words for it (the death cause's error message).
        message: String,
        /// The death of the actor's node, when that killed it.
        node: Option<NodeDeath>,
    },
    /// A driver job ended (`EXPORT_DRIVER_JOB`, `is_dead`).
    Job {
        /// The job's id.
        job_id: String,
        /// When the job started (Unix ms), if Ray says.
        start_time_ms: Option<u64>,
        /// When it ended (Unix ms), if Ray says.
        end_time_ms: Option<u64>,
        /// The driver's process id, if Ray says.
        driver_pid: Option<u64>,
        /// What the driver ran.
        entrypoint: String,
    },
    /// A node died (`EXPORT_NODE`, state `DEAD`).
    Node {
        /// The node's id.
        node_id: String,
        /// The node's address.
        address: String,
        /// When it died (Unix ms), if Ray says.
        end_time_ms: Option<u64>,
        /// Why.
        death: NodeDeath,
    },
}

/// Why a node died: Ray's `NodeDeathInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeDeath {
    /// `UNEXPECTED_TERMINATION`, `AUTOSCALER_DRAIN_PREEMPTED`, ...;
    /// `UNSPECIFIED` when Ray gives none.
    pub reason: &'static str,
    /// Ray's words for it; may be empty.
    pub message: String,
}

/// What one line of an export event file holds.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Decoded {
    /// A Train event.
    Train {
        /// Ray's id of the event (random, for logs).
        event_id: String,
        /// When Ray wrote it (Unix ms; Ray's `timestamp`, in seconds), if
        /// it says.
        at_ms: Option<u64>,
        /// The event.
        event: ExportEvent,
    },
    /// The death of an actor, a driver job or a node.
    Death {
        /// Ray's id of the event (random, for logs).
        event_id: String,
        /// When Ray wrote it (Unix ms; Ray's `timestamp`, in seconds), if
        /// it says.
        at_ms: Option<u64>,
        /// What died.
        death: Death,
    },
    /// An event of another source (jobs, actors, datasets, ...): not ours.
    Other {
        /// Its `source_type`.
        source_type: String,
    },
}

/// Why a line is not a Train event: the field (a path such as
/// `event_data.workers[1].actor_id`, empty for the line itself) and what is
/// wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if field.is_empty() { String::new() } else { format!("{field}: ") })]
#[non_exhaustive]
pub struct DecodeError {
    /// The path of the offending field; empty for the whole line.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl DecodeError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }
}

type Result<T> = std::result::Result<T, DecodeError>;

/// Decodes one line of an export event file (without its line break).
pub fn decode_line(line: &[u8]) -> Result<Decoded> {
    let value: Value =
        serde_json::from_slice(line).map_err(|e| DecodeError::new("", format!("not JSON: {e}")))?;
    let event = Obj::root(&value, "")?;
    let Some(source_type) = event.opt_string("source_type")? else {
        return Err(DecodeError::new("source_type", "missing"));
    };
    let decoded = match source_type.as_str() {
        EXPORT_TRAIN_RUN => ExportEvent::Run(Box::new(decode_run(&event.required("event_data")?)?)),
        EXPORT_TRAIN_RUN_ATTEMPT => {
            ExportEvent::Attempt(Box::new(decode_attempt(&event.required("event_data")?)?))
        }
        EXPORT_ACTOR | EXPORT_DRIVER_JOB | EXPORT_NODE => {
            let data = event.required("event_data")?;
            let death = match source_type.as_str() {
                EXPORT_ACTOR => decode_actor_death(&data)?,
                EXPORT_DRIVER_JOB => decode_job_death(&data)?,
                _ => decode_node_death(&data)?,
            };
            return Ok(match death {
                Some(death) => Decoded::Death {
                    event_id: event.string("event_id")?,
                    at_ms: event_time_ms(&event)?,
                    death,
                },
                None => Decoded::Other { source_type },
            });
        }
        _ => return Ok(Decoded::Other { source_type }),
    };
    Ok(Decoded::Train {
        event_id: event.string("event_id")?,
        at_ms: event_time_ms(&event)?,
        event: decoded,
    })
}

/// When Ray wrote an event, in Unix ms: its `timestamp` is in seconds
/// (`ExportEvent.timestamp`); a value already in milliseconds or in
/// nanoseconds is taken as such. `None` when absent or zero.
fn event_time_ms(event: &Obj<'_>) -> Result<Option<u64>> {
    Ok(event.opt_uint("timestamp")?.filter(|&t| t > 0).map(|t| match t {
        t if t < 100_000_000_000 => t.saturating_mul(1_000),
        t if t < 100_000_000_000_000 => t,
        t => t / 1_000_000,
    }))
}

/// `ExportActorData` → the actor's death, if it is dead.
fn decode_actor_death(data: &Obj<'_>) -> Result<Option<Death>> {
    if data.enum_name_or_first("state", ACTOR_STATES)? != "DEAD" {
        return Ok(None);
    }
    let empty = Map::new();
    let cause = data.object_or_empty("death_cause", &empty)?;
    let (mut reason, mut message, mut node) = (None, String::new(), None);
    if let Some(died) = cause.object("actor_died_error_context")? {
        reason = died.enum_name("reason", ACTOR_DEATH_REASONS)?;
        message = died.opt_string("error_message")?.unwrap_or_default();
        node = died.object("node_death_info")?.map(|info| node_death(&info)).transpose()?;
    } else {
        let contexts = [
            ("creation_task_failure_context", "formatted_exception_string", "CREATION_TASK_FAILED"),
            ("runtime_env_failed_context", "error_message", "RUNTIME_ENV_FAILED"),
            ("actor_unschedulable_context", "error_message", "UNSCHEDULABLE"),
            ("oom_context", "error_message", "OUT_OF_MEMORY"),
        ];
        for (context, text, kind) in contexts {
            if let Some(context) = cause.object(context)? {
                reason = Some(kind);
                message = context.opt_string(text)?.unwrap_or_default();
                break;
            }
        }
    }
    Ok(Some(Death::Actor {
        actor_id: data.hex_bytes("actor_id")?,
        job_id: data.hex_bytes("job_id")?,
        class_name: data.opt_string("class_name")?.unwrap_or_default(),
        reason,
        message,
        node,
    }))
}

/// `ExportDriverJobEventData` → the job's end, if it is dead.
fn decode_job_death(data: &Obj<'_>) -> Result<Option<Death>> {
    if !data.bool("is_dead")? {
        return Ok(None);
    }
    Ok(Some(Death::Job {
        job_id: data.hex_bytes("job_id")?,
        start_time_ms: data.opt_uint("start_time")?.filter(|&t| t > 0),
        end_time_ms: data.opt_uint("end_time")?.filter(|&t| t > 0),
        driver_pid: data.opt_uint("driver_pid")?.filter(|&p| p > 0),
        entrypoint: data.opt_string("entrypoint")?.unwrap_or_default(),
    }))
}

/// `ExportNodeData` → the node's death, if it is dead.
fn decode_node_death(data: &Obj<'_>) -> Result<Option<Death>> {
    if data.enum_name_or_first("state", NODE_STATES)? != "DEAD" {
        return Ok(None);
    }
    let empty = Map::new();
    Ok(Some(Death::Node {
        node_id: data.hex_bytes("node_id")?,
        address: data.opt_string("node_manager_address")?.unwrap_or_default(),
        end_time_ms: data.opt_uint("end_time_ms")?.filter(|&t| t > 0),
        death: node_death(&data.object_or_empty("death_info", &empty)?)?,
    }))
}

/// A `NodeDeathInfo`.
fn node_death(info: &Obj<'_>) -> Result<NodeDeath> {
    Ok(NodeDeath {
        reason: info.enum_name("reason", NODE_DEATH_REASONS)?.unwrap_or("UNSPECIFIED"),
        message: info.opt_string("reason_message")?.unwrap_or_default(),
    })
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut text, b| {
        let _ = write!(text, "{b:02x}");
        text
    })
}

/// The lowercase hex of a protobuf `bytes` field's JSON (base64, standard
/// or URL-safe alphabet, padded or not): how Ray's dashboard shows ids.
pub fn base64_to_hex(text: &str) -> std::result::Result<String, String> {
    STANDARD_PAD_INDIFFERENT
        .decode(text)
        .or_else(|_| URL_SAFE_PAD_INDIFFERENT.decode(text))
        .map(|bytes| hex(&bytes))
        .map_err(|e| format!("{text:?} is not base64: {e}"))
}

/// `ExportTrainRunEventData` → Ray's `TrainRun`.
fn decode_run(data: &Obj<'_>) -> Result<ray_v2::TrainRun> {
    let status = data.required_enum("status", RUN_STATUSES)?;
    let mut run = json!({
        "id": data.string("id")?,
        "name": data.string("name")?,
        "job_id": data.hex_bytes("job_id")?,
        "controller_actor_id": data.hex_bytes("controller_actor_id")?,
        "status": status,
        "status_detail": data.opt_string("status_detail")?,
        "start_time_ns": data.uint("start_time_ns")?,
        "end_time_ns": data.opt_uint("end_time_ns")?,
        "controller_log_file_path": data.opt_string("controller_log_file_path")?,
        "framework_versions": data.string_map("framework_versions")?,
    });
    if let Some(settings) = data.object("run_settings")? {
        run["run_settings"] = run_settings(&settings)?;
    }
    data.document(run)
}

/// `ExportTrainRunAttemptEventData` → Ray's `TrainRunAttempt`.
fn decode_attempt(data: &Obj<'_>) -> Result<ray_v2::TrainRunAttempt> {
    let status = data.required_enum("status", ATTEMPT_STATUSES)?;
    let resources = data
        .objects("resources")?
        .iter()
        .map(|r| Ok(json!({ "resources": r.number_map("resources")? })))
        .collect::<Result<Vec<_>>>()?;
    let workers = data.objects("workers")?.iter().map(worker).collect::<Result<Vec<_>>>()?;
    let attempt = json!({
        "run_id": data.string("run_id")?,
        "attempt_id": data.string("attempt_id")?,
        "status": status,
        "status_detail": data.opt_string("status_detail")?,
        "start_time_ns": data.uint("start_time_ns")?,
        "end_time_ns": data.opt_uint("end_time_ns")?,
        "resources": resources,
        "workers": workers,
    });
    data.document(attempt)
}

/// `ExportTrainRunAttemptEventData.TrainWorker` → Ray's `TrainWorker`.
fn worker(w: &Obj<'_>) -> Result<Value> {
    let resources = match w.object("resources")? {
        Some(r) => r.number_map("resources")?,
        None => Value::Object(Map::new()),
    };
    Ok(json!({
        "world_rank": w.uint32("world_rank")?,
        "local_rank": w.uint32("local_rank")?,
        "node_rank": w.uint32("node_rank")?,
        "actor_id": w.hex_bytes("actor_id")?,
        "node_id": w.hex_bytes("node_id")?,
        "node_ip": w.string("node_ip")?,
        "pid": w.uint32("pid")?,
        "gpu_ids": w.uint32s("gpu_ids")?,
        "status": w.enum_name("status", ACTOR_STATUSES)?,
        "resources": { "resources": resources },
        "log_file_path": w.opt_string("log_file_path")?,
    }))
}

/// `RunSettings` in protobuf JSON → Ray's `RunSettings` as its dashboard
/// serves it (members in the pydantic model's order).
pub fn run_settings_value(proto: &Value) -> Result<Value> {
    run_settings(&Obj::root(proto, "run_settings")?)
}

fn run_settings(s: &Obj<'_>) -> Result<Value> {
    let empty = Map::new();
    let backend = s.object_or_empty("backend_config", &empty)?;
    let scaling = s.object_or_empty("scaling_config", &empty)?;
    let data = s.object_or_empty("data_config", &empty)?;
    let run = s.object_or_empty("run_config", &empty)?;
    Ok(json!({
        "train_loop_config": s.struct_or_null("train_loop_config")?,
        "backend_config": {
            "framework": framework(&backend)?,
            "config": backend.struct_or_empty("config")?,
        },
        "scaling_config": scaling_config(&scaling)?,
        "datasets": s.strings("datasets")?,
        "data_config": data_config(&data)?,
        "run_config": run_config(&run)?,
    }))
}

/// `TrainingFramework`: unspecified is `null`, a name its lowercase
/// (`TORCH` → `torch`), as Ray's `TrainingFramework` enum spells it.
fn framework(backend: &Obj<'_>) -> Result<Value> {
    Ok(match backend.get("framework") {
        None => Value::Null,
        Some(Value::String(name)) if name.ends_with("_UNSPECIFIED") => Value::Null,
        Some(Value::String(name)) => Value::String(name.to_lowercase()),
        Some(Value::Number(n)) if n.as_u64() == Some(0) => Value::Null,
        Some(_) => return Err(backend.error("framework", "expected an enum name")),
    })
}

fn scaling_config(sc: &Obj<'_>) -> Result<Value> {
    // oneof num_workers { int32 num_workers_fixed; IntRange num_workers_range; },
    // a plain `num_workers` before Ray had elastic training.
    let num_workers = if sc.get("num_workers_fixed").is_some() {
        json!(sc.int("num_workers_fixed")?)
    } else if let Some(range) = sc.object("num_workers_range")? {
        json!([range.int("min")?, range.int("max")?])
    } else {
        json!(sc.int("num_workers")?)
    };
    let resources_per_worker = match sc.object("resources_per_worker")? {
        Some(r) => r.number_map("values")?,
        None => Value::Null,
    };
    // oneof bundle_label_selector { StringMap label_selector_single;
    // StringMapList label_selector_list; }, a repeated StringMap before.
    let bundle_label_selector = if let Some(single) = sc.object("label_selector_single")? {
        single.string_map("values")?
    } else if let Some(list) = sc.object("label_selector_list")? {
        Value::Array(
            list.objects("values")?
                .iter()
                .map(|m| m.string_map("values"))
                .collect::<Result<_>>()?,
        )
    } else {
        let selectors = sc.objects("bundle_label_selector")?;
        if selectors.is_empty() {
            Value::Null
        } else {
            Value::Array(selectors.iter().map(|m| m.string_map("values")).collect::<Result<_>>()?)
        }
    };
    Ok(json!({
        "num_workers": num_workers,
        "use_gpu": sc.bool("use_gpu")?,
        "resources_per_worker": resources_per_worker,
        "placement_strategy": sc.string("placement_strategy")?,
        "accelerator_type": sc.opt_string("accelerator_type")?,
        "use_tpu": sc.bool("use_tpu")?,
        "topology": sc.opt_string("topology")?,
        "bundle_label_selector": bundle_label_selector,
    }))
}

fn data_config(dc: &Obj<'_>) -> Result<Value> {
    // oneof datasets_to_split { Empty all; StringList datasets; }
    let datasets_to_split = match dc.object("datasets")? {
        Some(list) if dc.get("all").is_none() => Value::Array(list.strings("values")?),
        _ => Value::from("all"),
    };
    let data_execution_options = match dc.object("data_execution_options")? {
        Some(options) => Value::Object(options.map.clone()),
        // Before Ray exported them: Ray Data's defaults, so the document
        // stays valid under Ray's current model, which requires them.
        None => json!({
            "default": {
                "resource_limits": {},
                "exclude_resources": {},
                "preserve_order": false,
                "actor_locality_enabled": true,
                "verbose_progress": true,
            },
            "per_dataset_execution_options": {},
        }),
    };
    Ok(json!({
        "datasets_to_split": datasets_to_split,
        "execution_options": dc.struct_or_null("execution_options")?,
        "data_execution_options": data_execution_options,
        "enable_shard_locality": dc.bool("enable_shard_locality")?,
    }))
}

fn run_config(rc: &Obj<'_>) -> Result<Value> {
    let empty = Map::new();
    let failure = rc.object_or_empty("failure_config", &empty)?;
    let checkpoint = rc.object_or_empty("checkpoint_config", &empty)?;
    // CheckpointScoreOrder: `MAX` → `max`; unset is Ray's default, `max`.
    let order = match checkpoint.get("checkpoint_score_order") {
        None => "max".to_owned(),
        Some(Value::String(name)) if name.ends_with("_UNSPECIFIED") => "max".to_owned(),
        Some(Value::String(name)) => name.to_lowercase(),
        Some(_) => {
            return Err(checkpoint.error("checkpoint_score_order", "expected an enum name"));
        }
    };
    Ok(json!({
        "name": rc.string("name")?,
        "failure_config": {
            "max_failures": failure.int("max_failures")?,
            "controller_failure_limit": failure.int("controller_failure_limit")?,
        },
        "worker_runtime_env": rc.struct_or_empty("worker_runtime_env")?,
        "checkpoint_config": {
            "num_to_keep": checkpoint.opt_int("num_to_keep")?,
            "checkpoint_score_attribute": checkpoint.opt_string("checkpoint_score_attribute")?,
            "checkpoint_score_order": order,
        },
        "storage_path": rc.string("storage_path")?,
        "storage_filesystem": rc.opt_string("storage_filesystem")?,
    }))
}

/// A JSON object of a protobuf message, read by the proto3 JSON mapping:
/// an absent member (or `null`) is the field's default (`""`, `0`,
/// `false`, empty) or, for a field with presence, unset.
struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    fn root(value: &'a Value, path: &str) -> Result<Self> {
        match value {
            Value::Object(map) => Ok(Self { map, path: path.to_owned() }),
            _ => Err(DecodeError::new(path, "expected a JSON object")),
        }
    }

    fn field(&self, key: &str) -> String {
        if self.path.is_empty() { key.to_owned() } else { format!("{}.{key}", self.path) }
    }

    fn error(&self, key: &str, message: impl Into<String>) -> DecodeError {
        DecodeError::new(self.field(key), message)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn required(&self, key: &str) -> Result<Obj<'a>> {
        self.object(key)?.ok_or_else(|| self.error(key, "missing"))
    }

    fn object(&self, key: &str) -> Result<Option<Obj<'a>>> {
        self.get(key).map(|v| Obj::root(v, &self.field(key))).transpose()
    }

    fn object_or_empty(&self, key: &str, empty: &'a Map<String, Value>) -> Result<Obj<'a>> {
        Ok(self.object(key)?.unwrap_or_else(|| Obj { map: empty, path: self.field(key) }))
    }

    /// A `google.protobuf.Struct`: any JSON object, kept as it is.
    fn struct_or_null(&self, key: &str) -> Result<Value> {
        Ok(self.object(key)?.map_or(Value::Null, |o| Value::Object(o.map.clone())))
    }

    fn struct_or_empty(&self, key: &str) -> Result<Value> {
        Ok(self.object(key)?.map_or_else(|| json!({}), |o| Value::Object(o.map.clone())))
    }

    /// The objects of a repeated message field.
    fn objects(&self, key: &str) -> Result<Vec<Obj<'a>>> {
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| Obj::root(v, &format!("{}[{i}]", self.field(key))))
            .collect()
    }

    fn array(&self, key: &str) -> Result<&'a [Value]> {
        match self.get(key) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(_) => Err(self.error(key, "expected an array")),
        }
    }

    fn opt_string(&self, key: &str) -> Result<Option<String>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.error(key, "expected a string")),
        }
    }

    fn string(&self, key: &str) -> Result<String> {
        Ok(self.opt_string(key)?.unwrap_or_default())
    }

    fn strings(&self, key: &str) -> Result<Vec<Value>> {
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(_) => Ok(v.clone()),
                _ => {
                    Err(DecodeError::new(format!("{}[{i}]", self.field(key)), "expected a string"))
                }
            })
            .collect()
    }

    fn bool(&self, key: &str) -> Result<bool> {
        match self.get(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(self.error(key, "expected true or false")),
        }
    }

    /// An integer field: a JSON number or, as protobuf writes 64-bit
    /// integers, a string of digits.
    fn opt_int(&self, key: &str) -> Result<Option<i64>> {
        let Some(value) = self.get(key) else { return Ok(None) };
        integer(value).map(Some).map_err(|message| self.error(key, message))
    }

    fn int(&self, key: &str) -> Result<i64> {
        Ok(self.opt_int(key)?.unwrap_or(0))
    }

    fn opt_uint(&self, key: &str) -> Result<Option<u64>> {
        let Some(value) = self.get(key) else { return Ok(None) };
        unsigned(value).map(Some).map_err(|message| self.error(key, message))
    }

    fn uint(&self, key: &str) -> Result<u64> {
        Ok(self.opt_uint(key)?.unwrap_or(0))
    }

    fn uint32(&self, key: &str) -> Result<u32> {
        u32::try_from(self.uint(key)?)
            .map_err(|_| self.error(key, "out of range for a 32-bit integer"))
    }

    fn uint32s(&self, key: &str) -> Result<Vec<u32>> {
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| {
                unsigned(v)
                    .and_then(|n| u32::try_from(n).map_err(|_| "out of range".to_owned()))
                    .map_err(|message| {
                        DecodeError::new(format!("{}[{i}]", self.field(key)), message)
                    })
            })
            .collect()
    }

    /// A `bytes` field (base64) as lowercase hex.
    fn hex_bytes(&self, key: &str) -> Result<String> {
        base64_to_hex(&self.string(key)?).map_err(|message| self.error(key, message))
    }

    /// A `map<string, string>`.
    fn string_map(&self, key: &str) -> Result<Value> {
        let Some(map) = self.object(key)? else { return Ok(json!({})) };
        for (k, v) in map.map {
            if !v.is_string() {
                return Err(map.error(k, "expected a string"));
            }
        }
        Ok(Value::Object(map.map.clone()))
    }

    /// A `map<string, double>`.
    fn number_map(&self, key: &str) -> Result<Value> {
        let Some(map) = self.object(key)? else { return Ok(json!({})) };
        for (k, v) in map.map {
            if !v.is_number() {
                return Err(map.error(k, "expected a number"));
            }
        }
        Ok(Value::Object(map.map.clone()))
    }

    /// An enum field (a name, or its number): `None` when unset or
    /// unspecified (number 0).
    fn enum_name(&self, key: &str, names: &'static [&'static str]) -> Result<Option<&'static str>> {
        let index = match self.get(key) {
            None => return Ok(None),
            Some(Value::String(name)) => names
                .iter()
                .position(|n| n == name)
                .ok_or_else(|| self.error(key, format!("unknown value {name:?}")))?,
            Some(Value::Number(n)) => n
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n < names.len())
                .ok_or_else(|| self.error(key, format!("unknown value {n}")))?,
            Some(_) => return Err(self.error(key, "expected an enum name")),
        };
        Ok((index != 0).then(|| names[index]))
    }

    /// An enum field whose first value (number 0) is a real one, as
    /// `ActorState`'s `DEPENDENCIES_UNREADY`: unset reads as it.
    fn enum_name_or_first(
        &self,
        key: &str,
        names: &'static [&'static str],
    ) -> Result<&'static str> {
        Ok(self.enum_name(key, names)?.unwrap_or(names[0]))
    }

    fn required_enum(&self, key: &str, names: &'static [&'static str]) -> Result<&'static str> {
        self.enum_name(key, names)?.ok_or_else(|| self.error(key, "missing or unspecified"))
    }

    /// Ray's document, built from this message, as its typed form.
    fn document<T: serde::de::DeserializeOwned>(&self, document: Value) -> Result<T> {
        serde_json::from_value(document)
            .map_err(|e| DecodeError::new(self.path.clone(), e.to_string()))
    }
}

fn integer(value: &Value) -> std::result::Result<i64, String> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| {
                n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15).map(|f| f as i64)
            })
            .ok_or_else(|| format!("{n} is not a 64-bit integer")),
        Value::String(s) => s.parse().map_err(|_| format!("{s:?} is not an integer")),
        _ => Err("expected an integer".into()),
    }
}

fn unsigned(value: &Value) -> std::result::Result<u64, String> {
    match value {
        Value::Number(n) => n
            .as_u64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < 9.0e15)
                    .map(|f| f as u64)
            })
            .ok_or_else(|| format!("{n} is not an unsigned integer")),
        Value::String(s) => s.parse().map_err(|_| format!("{s:?} is not an unsigned integer")),
        _ => Err("expected an unsigned integer".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/ray-v2").join(name);
        std::fs::read_to_string(path).unwrap()
    }

    /// The first run event of the fixture, with `edit` applied to its
    /// `event_data`.
    fn run_line(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
        let mut event: Value =
            serde_json::from_str(fixture("event_EXPORT_TRAIN_STATE.log").lines().next().unwrap())
                .unwrap();
        edit(&mut event["event_data"]);
        serde_json::to_vec(&event).unwrap()
    }

    /// The first attempt event of the fixture that has workers, edited.
    fn attempt_line(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
        let mut event: Value = fixture("event_EXPORT_TRAIN_STATE.log")
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|e| {
                e["source_type"] == EXPORT_TRAIN_RUN_ATTEMPT
                    && e["event_data"]["workers"].as_array().is_some_and(|w| !w.is_empty())
            })
            .unwrap();
        edit(&mut event["event_data"]);
        serde_json::to_vec(&event).unwrap()
    }

    fn run_of(line: &[u8]) -> Result<ray_v2::TrainRun> {
        match decode_line(line)? {
            Decoded::Train { event: ExportEvent::Run(run), .. } => Ok(*run),
            other => panic!("not a run: {other:?}"),
        }
    }

    fn attempt_of(line: &[u8]) -> Result<ray_v2::TrainRunAttempt> {
        match decode_line(line)? {
            Decoded::Train { event: ExportEvent::Attempt(attempt), .. } => Ok(*attempt),
            other => panic!("not an attempt: {other:?}"),
        }
    }

    fn settings_of(line: &[u8]) -> Value {
        serde_json::to_value(&run_of(line).unwrap().run_settings).unwrap()
    }

    /// JSON numbers by value: Ray's dashboard writes some whole floats as
    /// integers (`0` where the event has `0.0`), JSON does not tell them
    /// apart.
    fn by_value(value: &Value) -> Value {
        match value {
            Value::Number(n) => json!(n.as_f64().unwrap()),
            Value::Array(items) => Value::Array(items.iter().map(by_value).collect()),
            Value::Object(map) => {
                Value::Object(map.iter().map(|(k, v)| (k.clone(), by_value(v))).collect())
            }
            other => other.clone(),
        }
    }

    #[test]
    fn ids_of_jobs_actors_and_nodes_are_base64_of_bytes_and_become_hex() {
        for (base64, hex) in [
            ("AQAAAA==", "01000000"),
            ("AQAAAA", "01000000"),
            ("0cLz9mATp06vl8JxAQAAAA==", "d1c2f3f66013a74eaf97c27101000000"),
            (
                "C2Jl7BkuP5P+lTzfSzqlKtC5Xu6MNgoTphOmaw==",
                "0b6265ec192e3f93fe953cdf4b3aa52ad0b95eee8c360a13a613a66b",
            ),
            (
                "C2Jl7BkuP5P-lTzfSzqlKtC5Xu6MNgoTphOmaw",
                "0b6265ec192e3f93fe953cdf4b3aa52ad0b95eee8c360a13a613a66b",
            ),
            ("", ""),
        ] {
            assert_eq!(base64_to_hex(base64).as_deref(), Ok(hex), "{base64}");
            let run = run_of(&run_line(|d| d["job_id"] = base64.into())).unwrap();
            assert_eq!(run.job_id, hex);
        }
        for bad in ["!!!!", "AQAAAA=x", "A"] {
            let err = run_of(&run_line(|d| d["controller_actor_id"] = bad.into())).unwrap_err();
            assert_eq!(err.field, "event_data.controller_actor_id", "{bad}");
            assert!(err.message.contains("not base64"), "{err}");
        }
        let attempt =
            attempt_of(&attempt_line(|d| d["workers"][1]["actor_id"] = "AQI=".into())).unwrap();
        assert_eq!(attempt.workers[1].actor_id, "0102");
        let err = attempt_of(&attempt_line(|d| d["workers"][1]["node_id"] = 7.into())).unwrap_err();
        assert_eq!(err.field, "event_data.workers[1].node_id");
    }

    #[test]
    fn times_are_64_bit_integers_as_strings_or_numbers() {
        for (given, expected) in [
            (json!("1796133828185297424"), Ok(1_796_133_828_185_297_424_u64)),
            (json!(1_796_133_828_185_297_424_u64), Ok(1_796_133_828_185_297_424)),
            (json!("0"), Ok(0)),
            (json!(1.0e9), Ok(1_000_000_000)),
            (json!("-1"), Err(())),
            (json!(-1), Err(())),
            (json!("1.5"), Err(())),
            (json!(1.5), Err(())),
            (json!("18446744073709551616"), Err(())),
            (json!(true), Err(())),
        ] {
            let line = run_line(|d| {
                d["start_time_ns"] = given.clone();
                d["end_time_ns"] = given.clone();
            });
            match (run_of(&line), expected) {
                (Ok(run), Ok(ns)) => {
                    assert_eq!((run.start_time_ns, run.end_time_ns), (ns, Some(ns)), "{given}");
                }
                (Err(err), Err(())) => assert_eq!(err.field, "event_data.start_time_ns", "{given}"),
                (got, expected) => panic!("{given}: got {got:?}, expected {expected:?}"),
            }
        }
        // Unset: the proto default for a plain field, null for an optional one.
        let run = run_of(&run_line(|d| {
            d.as_object_mut().unwrap().remove("start_time_ns");
            d.as_object_mut().unwrap().remove("end_time_ns");
        }))
        .unwrap();
        assert_eq!((run.start_time_ns, run.end_time_ns), (0, None));
    }

    #[test]
    fn enums_are_names_or_numbers_and_unspecified_is_unset() {
        let status = |s: Value| run_of(&run_line(|d| d["status"] = s)).map(|r| r.status);
        assert_eq!(status(json!("RESTARTING")).unwrap(), trainstate_schema::RunStatus::Restarting);
        assert_eq!(status(json!(7)).unwrap(), trainstate_schema::RunStatus::Errored);
        for bad in [json!("RUN_STATUS_UNSPECIFIED"), json!(0), json!("DONE"), json!(9), json!(null)]
        {
            assert_eq!(status(bad.clone()).unwrap_err().field, "event_data.status", "{bad}");
        }
        let worker_status = |s: Value| {
            attempt_of(&attempt_line(|d| d["workers"][0]["status"] = s))
                .map(|a| a.workers[0].status)
        };
        assert_eq!(
            worker_status(json!("DEAD")).unwrap(),
            Some(trainstate_schema::ActorStatus::Dead)
        );
        assert_eq!(worker_status(json!(1)).unwrap(), Some(trainstate_schema::ActorStatus::Alive));
        assert_eq!(worker_status(json!("ACTOR_STATUS_UNSPECIFIED")).unwrap(), None);
        assert_eq!(worker_status(json!(null)).unwrap(), None);
    }

    #[test]
    fn oneofs_and_enums_of_run_settings_take_the_shape_rays_dashboard_serves() {
        // (what to set in the event's run_settings, JSON pointer, what the dashboard has there)
        let cases: Vec<(Value, &str, Value)> = vec![
            (
                json!({"scaling_config": {"num_workers_fixed": 4}}),
                "/scaling_config/num_workers",
                json!(4),
            ),
            (
                json!({"scaling_config": {"num_workers_fixed": "4"}}),
                "/scaling_config/num_workers",
                json!(4),
            ),
            (
                json!({"scaling_config": {"num_workers_range": {"min": 2, "max": 8}}}),
                "/scaling_config/num_workers",
                json!([2, 8]),
            ),
            (
                json!({"scaling_config": {"num_workers": 3}}),
                "/scaling_config/num_workers",
                json!(3),
            ),
            (json!({"scaling_config": {}}), "/scaling_config/resources_per_worker", json!(null)),
            (
                json!({"scaling_config": {"resources_per_worker": {"values": {"GPU": 1.0}}}}),
                "/scaling_config/resources_per_worker",
                json!({"GPU": 1.0}),
            ),
            (
                json!({"scaling_config": {"label_selector_single": {"values": {"k": "v"}}}}),
                "/scaling_config/bundle_label_selector",
                json!({"k": "v"}),
            ),
            (
                json!({"scaling_config": {"label_selector_list": {"values": [{"values": {"k1": "v1"}}, {"values": {"k2": "v2"}}]}}}),
                "/scaling_config/bundle_label_selector",
                json!([{"k1": "v1"}, {"k2": "v2"}]),
            ),
            (
                json!({"scaling_config": {"bundle_label_selector": []}}),
                "/scaling_config/bundle_label_selector",
                json!(null),
            ),
            (
                json!({"scaling_config": {"accelerator_type": "A100"}}),
                "/scaling_config/accelerator_type",
                json!("A100"),
            ),
            (json!({"scaling_config": {}}), "/scaling_config/topology", json!(null)),
            (json!({"data_config": {"all": {}}}), "/data_config/datasets_to_split", json!("all")),
            (
                json!({"data_config": {"datasets": {"values": ["train", "val"]}}}),
                "/data_config/datasets_to_split",
                json!(["train", "val"]),
            ),
            (json!({"data_config": {}}), "/data_config/execution_options", json!(null)),
            (
                json!({"data_config": {}}),
                "/data_config/data_execution_options/default/verbose_progress",
                json!(true),
            ),
            (
                json!({"backend_config": {"framework": "TRAINING_FRAMEWORK_UNSPECIFIED"}}),
                "/backend_config/framework",
                json!(null),
            ),
            (
                json!({"backend_config": {"framework": "TORCH"}}),
                "/backend_config/framework",
                json!("torch"),
            ),
            (
                json!({"backend_config": {"framework": "LIGHTGBM"}}),
                "/backend_config/framework",
                json!("lightgbm"),
            ),
            (json!({"backend_config": {}}), "/backend_config/config", json!({})),
            (
                json!({"run_config": {"checkpoint_config": {"checkpoint_score_order": "MIN"}}}),
                "/run_config/checkpoint_config/checkpoint_score_order",
                json!("min"),
            ),
            (
                json!({"run_config": {"checkpoint_config": {}}}),
                "/run_config/checkpoint_config/checkpoint_score_order",
                json!("max"),
            ),
            (
                json!({"run_config": {"checkpoint_config": {}}}),
                "/run_config/checkpoint_config/num_to_keep",
                json!(null),
            ),
            (
                json!({"run_config": {"checkpoint_config": {"num_to_keep": 3}}}),
                "/run_config/checkpoint_config/num_to_keep",
                json!(3),
            ),
            (
                json!({"run_config": {"storage_filesystem": "s3"}}),
                "/run_config/storage_filesystem",
                json!("s3"),
            ),
            (json!({"run_config": {}}), "/run_config/storage_filesystem", json!(null)),
            (
                json!({"run_config": {"failure_config": {"max_failures": "2"}}}),
                "/run_config/failure_config/max_failures",
                json!(2),
            ),
            // JSON null is the field unset, as absent is.
            (json!({"train_loop_config": null}), "/train_loop_config", json!(null)),
            (json!({"train_loop_config": {"lr": 0.1}}), "/train_loop_config", json!({"lr": 0.1})),
        ];
        for (given, pointer, expected) in cases {
            let line = run_line(|d| {
                for (section, fields) in given.as_object().unwrap() {
                    d["run_settings"][section] = fields.clone();
                }
            });
            let settings = settings_of(&line);
            assert_eq!(settings.pointer(pointer), Some(&expected), "{given} at {pointer}");
        }
        // No settings at all (an older Ray): left unset.
        let run = run_of(&run_line(|d| drop(d.as_object_mut().unwrap().remove("run_settings"))));
        assert_eq!(run.unwrap().run_settings, trainstate_schema::JsonValue::Null);
    }

    #[test]
    fn what_is_not_a_train_event_says_which_field_and_why() {
        for (line, field) in [
            (&b"not json"[..], ""),
            (b"[1, 2]", ""),
            (b"{\"event_data\": {}}", "source_type"),
            (b"{\"source_type\": \"EXPORT_TRAIN_RUN\"}", "event_data"),
            (b"{\"source_type\": \"EXPORT_TRAIN_RUN_ATTEMPT\", \"event_data\": []}", "event_data"),
        ] {
            let err = decode_line(line).unwrap_err();
            assert_eq!(err.field, field, "{}: {err}", String::from_utf8_lossy(line));
        }
        let err = attempt_of(&attempt_line(|d| d["workers"][0]["pid"] = json!(-5))).unwrap_err();
        assert_eq!(err.field, "event_data.workers[0].pid");
        let err = attempt_of(&attempt_line(|d| d["resources"][1]["resources"]["CPU"] = json!("x")))
            .unwrap_err();
        assert_eq!(err.field, "event_data.resources[1].resources.CPU");
        assert_eq!(err.to_string(), "event_data.resources[1].resources.CPU: expected a number");
        assert_eq!(
            decode_line(br#"{"source_type": "EXPORT_SUBMISSION_JOB", "event_data": {}}"#).unwrap(),
            Decoded::Other { source_type: "EXPORT_SUBMISSION_JOB".into() }
        );
    }

    #[test]
    fn every_line_of_rays_file_decodes_and_its_last_word_on_each_run_is_what_rays_dashboard_says() {
        let dashboard: Value = serde_json::from_str(&fixture("dashboard-v2-runs.json")).unwrap();
        let mut runs = std::collections::BTreeMap::new();
        let mut attempts = std::collections::BTreeMap::new();
        for line in fixture("event_EXPORT_TRAIN_STATE.log").lines() {
            match decode_line(line.as_bytes()).unwrap() {
                Decoded::Train { event: ExportEvent::Run(run), .. } => {
                    runs.insert(run.id.clone(), serde_json::to_value(&run).unwrap());
                }
                Decoded::Train { event: ExportEvent::Attempt(a), .. } => {
                    attempts.insert(a.attempt_id.clone(), serde_json::to_value(&a).unwrap());
                }
                other => panic!("{other:?}"),
            }
        }
        for rays in dashboard["train_runs"].as_array().unwrap() {
            let ours = &runs[rays["id"].as_str().unwrap()];
            for key in [
                "id",
                "name",
                "job_id",
                "controller_actor_id",
                "status",
                "status_detail",
                "start_time_ns",
                "end_time_ns",
                "controller_log_file_path",
                "framework_versions",
            ] {
                assert_eq!(ours[key], rays[key], "{} {key}", rays["name"]);
            }
            assert_eq!(by_value(&ours["run_settings"]), by_value(&rays["run_settings"]));
            for rays_attempt in rays["attempts"].as_array().unwrap() {
                let mut rays_attempt = rays_attempt.clone();
                for worker in rays_attempt["workers"].as_array_mut().unwrap() {
                    let worker = worker.as_object_mut().unwrap();
                    worker.remove("processStats");
                    worker.remove("gpus");
                }
                let ours = &attempts[rays_attempt["attempt_id"].as_str().unwrap()];
                assert_eq!(by_value(ours), by_value(&rays_attempt));
            }
        }
    }
}
