//! The committed JSON Schemas accept every Ray document and reject what
//! they can express as invalid.

use std::path::PathBuf;

use serde_json::Value;

use crate::common::{fixture, valid_run};

fn committed_schema(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../schemas")
        .join(format!("{name}.schema.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn every_ray_fixture_validates_against_the_committed_run_schema() {
    let validator = jsonschema::validator_for(&committed_schema("TrainRunInfo")).unwrap();
    let mut docs = vec![fixture("ray-v1-run.json"), valid_run()];
    docs.extend(fixture("ray-v1-runs.json").as_array().unwrap().iter().cloned());
    docs.extend(
        fixture("ray-v1-dashboard-response.json")["train_runs"].as_array().unwrap().iter().cloned(),
    );
    for doc in &docs {
        let errors: Vec<String> = validator.iter_errors(doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", doc["id"]);
    }
}

#[test]
fn our_serialized_run_validates_and_the_schema_rejects_what_it_can_express() {
    let validator = jsonschema::validator_for(&committed_schema("TrainRunInfo")).unwrap();
    let run: trainstate_schema::TrainRunInfo = serde_json::from_value(valid_run()).unwrap();
    assert!(validator.is_valid(&serde_json::to_value(&run).unwrap()));

    let mut bad = valid_run();
    bad["id"] = "has space".into();
    assert!(!validator.is_valid(&bad));
    let mut bad = valid_run();
    bad["workers"][0]["pid"] = 0.into();
    assert!(!validator.is_valid(&bad));
    let mut bad = valid_run();
    bad["run_status"] = "PENDING".into();
    assert!(!validator.is_valid(&bad));
    let mut started = valid_run();
    started["run_status"] = "STARTED".into();
    assert!(validator.is_valid(&started));
}
