//! Each crate keeps to the dependencies its role allows (PRODUCT.md's
//! table), checked on `cargo metadata`.
//!
//! `cargo metadata --no-deps` and `cargo tree` read manifests and the lock
//! file; unlike `cargo build` they do not wait on the build directory lock.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

fn cargo(args: &[&str]) -> Vec<u8> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(args)
        .args(["--offline", "--locked"])
        .current_dir(xtask::workspace_root())
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

/// The direct normal (non-dev, non-build) dependencies of a workspace package.
fn direct_normal_dependencies(package: &str) -> BTreeSet<String> {
    let meta: Value =
        serde_json::from_slice(&cargo(&["metadata", "--format-version", "1", "--no-deps"]))
            .unwrap();
    let pkg = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == package)
        .unwrap_or_else(|| panic!("no package {package}"));
    pkg["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"].is_null())
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Every package `cargo tree -e normal -p <package>` shows, by name.
fn normal_closure(package: &str) -> BTreeSet<String> {
    let tree =
        cargo(&["tree", "-e", "normal", "-p", package, "--prefix", "none", "--format", "{p}"]);
    String::from_utf8(tree)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(String::from)
        .collect()
}

#[test]
fn schema_crate_depends_on_serde_uuid_and_schemars_only() {
    let direct = direct_normal_dependencies("trainstate-schema");
    let allowed: BTreeSet<String> = ["serde", "uuid", "schemars"].map(String::from).into();
    assert!(direct.is_subset(&allowed), "trainstate-schema depends on {direct:?}");
}

#[test]
fn client_and_manager_never_pull_in_the_server_or_the_store() {
    for package in ["trainstate-client", "trainstate-manager"] {
        let closure = normal_closure(package);
        for forbidden in ["axum", "rusqlite", "libsqlite3-sys"] {
            assert!(!closure.contains(forbidden), "{package} pulls in {forbidden}");
        }
    }
}

#[test]
fn schema_crate_pulls_in_nothing_async_nor_actor_nor_http() {
    let closure = normal_closure("trainstate-schema");
    for forbidden in ["tokio", "ractor", "axum", "hyper", "reqwest", "rusqlite"] {
        assert!(!closure.contains(forbidden), "trainstate-schema pulls in {forbidden}");
    }
}
