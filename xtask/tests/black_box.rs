//! xtask reaches the head only as programs it builds and starts (the
//! `trainstate` binary and trainstate-actor's `inproc` example), never as a
//! library: `cargo xtask codegen` builds the schema and client crates, not
//! the server.

use std::process::Command;

use serde_json::Value;

fn cargo(args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(args)
        .args(["--offline", "--locked"])
        .current_dir(xtask::workspace_root())
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn xtask_does_not_depend_on_the_actor_even_to_test_or_build() {
    let tree = cargo(&[
        "tree",
        "-p",
        "xtask",
        "-e",
        "normal,build,dev",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ]);
    let ours: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with("trainstate"))
        .collect();
    assert!(ours.contains(&"trainstate-schema"), "xtask reaches {ours:?}");
    assert!(!ours.contains(&"trainstate-actor"), "xtask depends on trainstate-actor");
}

#[test]
fn the_programs_the_benchmark_starts_are_targets_of_the_actor() {
    let meta: Value =
        serde_json::from_str(&cargo(&["metadata", "--format-version", "1", "--no-deps"])).unwrap();
    let actor = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "trainstate-actor")
        .expect("the trainstate-actor package");
    let targets: Vec<(String, String)> = actor["targets"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| {
            let name = t["name"].as_str().unwrap().to_owned();
            t["kind"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |k| (k.as_str().unwrap().into(), name.clone()))
        })
        .collect();
    for wanted in [("bin", "trainstate"), ("example", "inproc")] {
        assert!(
            targets.iter().any(|(kind, name)| (kind.as_str(), name.as_str()) == wanted),
            "trainstate-actor has no {wanted:?} target: {targets:?}"
        );
    }
}
