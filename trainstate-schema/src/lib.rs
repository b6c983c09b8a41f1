//! The wire types of trainstate: what a training run is.
//!
//! A run serialises exactly as Ray's V1 `TrainRunInfo` (field names, types,
//! enum spellings), so tools written for Ray read trainstate's output
//! unchanged, plus a few extension fields of trainstate's own (attempt
//! history, last heartbeat, a machine-readable cause, the run restored from,
//! log file paths).
//!
//! Values are immutable and valid by construction. A caller fills in a draft
//! and validates it; deserializing validates too, so an invalid document
//! never becomes a value:
//!
//! ```
//! use trainstate_schema::{TrainRunInfo, RunStatus};
//!
//! let json = r#"{
//!   "name": "llama-pretrain", "id": "0192f0c5a4e27c3db1c1a2b3c4d5e6f7",
//!   "job_id": "01000000", "controller_actor_id": "c0ffee",
//!   "workers": [{
//!     "actor_id": "a0", "world_rank": 0, "local_rank": 0, "node_rank": 0,
//!     "node_id": "n0", "node_ip": "10.0.0.1", "pid": 4242, "gpu_ids": [0],
//!     "status": "ALIVE", "resources": {"GPU": 1.0}
//!   }],
//!   "datasets": [], "run_status": "RUNNING", "status_detail": "",
//!   "start_time_ms": 1760000000000, "end_time_ms": null, "resources": [{"GPU": 1.0}]
//! }"#;
//! let run: TrainRunInfo = serde_json::from_str(json).unwrap();
//! assert_eq!(run.run_status(), RunStatus::Running);
//! assert_eq!(run.workers()[0].gpu_ids(), &[0]);
//!
//! // A broken rule is an error naming the field path and the rule.
//! let mut draft = run.into_draft();
//! draft.workers[0].pid = 0;
//! let err = draft.validate().unwrap_err();
//! assert_eq!(err.field(), "workers[0].pid");
//! ```
//!
//! # Features
//!
//! - `schemars` (default): every public wire type implements
//!   `schemars::JsonSchema`, generating JSON Schema 2020-12 whose
//!   descriptions are these doc comments. The schemas describe what is
//!   accepted: extension fields are optional and unknown keys are allowed.
//!   With it, [`routes`] describes each route's documents and `openapi`
//!   generates the OpenAPI 3.1 document of the head service.
//!
//! # Routes
//!
//! [`routes`] is the route table of the head service as data: each route's
//! method, path template, access rule, error codes and documents. It names
//! no HTTP library; the head builds its router from it and the remote
//! client its URLs.
//!
//! # Dependencies
//!
//! serde, uuid and (optionally, with `schemars`) schemars and serde_json,
//! and nothing else: nothing async, no actor runtime, no HTTP library, no
//! storage.

pub mod api;
mod draft;
mod error;
mod goodput;
mod health;
mod id;
mod json;
pub mod limits;
mod model;
mod object;
#[cfg(feature = "schemars")]
pub mod openapi;
pub mod ray_v2;
mod resources;
pub mod routes;
mod status;
pub mod text;
mod validate;
mod workers;

pub use draft::{
    RunAttemptDraft, StatusChange, TrainDatasetInfoDraft, TrainRunInfoDraft, TrainWorkerInfoDraft,
};
pub use error::{Rule, ValidationError};
pub use goodput::{
    Badput, CheckpointMark, GoodputBucket, RESTART_LOOP_RESTARTS, RunGoodput, SLOW_STEP_FACTOR,
    ratio as goodput_ratio,
};
pub use health::{HealthChange, HealthState, RunHealth, StallCapture, Straggler};
pub use id::{MAX_RUN_ID_QUALIFIER_LEN, RUN_ID_PATTERN, RunId};
pub use json::JsonValue;
pub use model::{NewRun, RunAttempt, TrainDatasetInfo, TrainRunInfo, TrainWorkerInfo};
pub use resources::Resources;
pub use status::{
    ActorStatus, AttemptStatus, CauseClass, CauseKind, FailureMode, RunCause, RunStatus,
};
pub use validate::{validate_client_cause, validate_name, validate_time};
pub use workers::WorkerList;

/// Version of the wire schema: bumped when a field is added, with the crate
/// version otherwise.
pub const WIRE_SCHEMA_VERSION: &str = "1.0.0";
