//! Each crate keeps to the dependencies its role allows (PRODUCT.md's
//! table), checked on `cargo metadata`.
//!
//! `cargo metadata --no-deps` and `cargo tree` read manifests and the lock
//! file; unlike `cargo build` they do not wait on the build directory lock.

use std::collections::{BTreeMap, BTreeSet};
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
    normal_closure_with(package, &[])
}

/// Every package `cargo tree -e normal -p <package> <features>` shows, by name.
fn normal_closure_with(package: &str, features: &[&str]) -> BTreeSet<String> {
    let mut args = vec!["tree", "-e", "normal", "-p", package];
    args.extend(features);
    args.extend(["--prefix", "none", "--format", "{p}"]);
    String::from_utf8(cargo(&args))
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(String::from)
        .collect()
}

#[test]
fn schema_crate_depends_on_serde_uuid_and_schemars_only() {
    let direct = direct_normal_dependencies("trainstate-schema");
    // serde_json only with `schemars`: the OpenAPI document is JSON.
    let allowed: BTreeSet<String> =
        ["serde", "uuid", "schemars", "serde_json"].map(String::from).into();
    assert!(direct.is_subset(&allowed), "trainstate-schema depends on {direct:?}");
}

/// The PostgreSQL client and anything of it; sqlx never, anywhere.
const POSTGRES: &[&str] = &["tokio-postgres", "postgres-protocol", "deadpool-postgres", "sqlx"];

#[test]
fn client_and_manager_never_pull_in_the_server_or_the_store() {
    // The client with every feature (the ingester, HTTPS, schemars) too:
    // what talks to a head from outside never builds the head.
    let builds = [
        ("trainstate-client", &[][..]),
        ("trainstate-client", &["--all-features"][..]),
        ("trainstate-client", &["--no-default-features", "--features", "ray-export"][..]),
        ("trainstate-client", &["--no-default-features", "--features", "cli"][..]),
        ("trainstate-manager", &[][..]),
    ];
    for (package, features) in builds {
        let closure = normal_closure_with(package, features);
        let server = ["axum", "rusqlite", "libsqlite3-sys"];
        for forbidden in server.iter().chain(POSTGRES) {
            assert!(!closure.contains(*forbidden), "{package} {features:?} pulls in {forbidden}");
        }
    }
}

/// The third-party crates each light crate may name as its direct normal
/// dependencies, whatever its features; a new one is a decision, made here.
const THIRD_PARTY: &[(&str, &[&str])] = &[
    (
        "trainstate-client",
        &[
            "ractor",
            "tokio",
            "thiserror",
            "serde",
            "serde_json",
            "tracing",
            // `schemars`: RunDocument's JSON Schema.
            "schemars",
            // `http` and `rustls`: the remote handle.
            "reqwest",
            "rustls",
            // `ray-export`: Ray's ids are base64.
            "base64",
            // `cli`: the commands' flags, and the link templates they fill.
            "clap",
            "url",
        ],
    ),
    ("trainstate-manager", &["ractor", "tokio", "tracing", "thiserror"]),
];

#[test]
fn light_crates_name_only_their_allowed_third_party_crates() {
    for (package, allowed) in THIRD_PARTY {
        let direct = direct_normal_dependencies(package);
        let third_party: BTreeSet<&str> =
            direct.iter().map(String::as_str).filter(|d| !d.starts_with("trainstate-")).collect();
        let allowed: BTreeSet<&str> = allowed.iter().copied().collect();
        let extra: Vec<&&str> = third_party.difference(&allowed).collect();
        assert!(extra.is_empty(), "{package} depends on {extra:?}, not in THIRD_PARTY");
    }
}

#[test]
fn the_manager_builds_no_json_schema_and_the_client_none_by_default() {
    for package in ["trainstate-manager", "trainstate-client"] {
        let closure = normal_closure(package);
        assert!(!closure.contains("schemars"), "{package} pulls in schemars");
    }
}

#[test]
fn postgresql_is_behind_the_actors_feature_and_sqlx_is_nowhere() {
    let tree = |features: &[&str]| {
        let mut args = vec!["tree", "-e", "normal", "-p", "trainstate-actor"];
        args.extend(features);
        args.extend(["--prefix", "none", "--format", "{p}"]);
        String::from_utf8(cargo(&args))
            .unwrap()
            .lines()
            .filter_map(|line| line.split_whitespace().next().map(String::from))
            .collect::<BTreeSet<String>>()
    };
    let without = tree(&["--no-default-features", "--features", "server"]);
    for forbidden in POSTGRES {
        assert!(
            !without.contains(*forbidden),
            "trainstate-actor without `postgres` pulls in {forbidden}"
        );
    }
    let with = tree(&["--no-default-features", "--features", "postgres"]);
    assert!(with.contains("tokio-postgres"), "the `postgres` feature brings tokio-postgres");
    let everything = tree(&["--all-features"]);
    assert!(!everything.contains("sqlx"), "sqlx beside rusqlite");
}

#[test]
fn tls_is_behind_the_clients_feature_with_one_crypto_provider() {
    let tree = |args: &[&str]| {
        let mut all = vec!["tree"];
        all.extend(args);
        all.extend(["--prefix", "none", "--format", "{p}"]);
        String::from_utf8(cargo(&all))
            .unwrap()
            .lines()
            .filter_map(|line| line.split_whitespace().next().map(String::from))
            .collect::<BTreeSet<String>>()
    };
    // A controller reaching its head over plain HTTP builds no TLS stack.
    let plain = normal_closure("trainstate-client");
    for tls in ["rustls", "aws-lc-rs", "aws-lc-sys", "ring"] {
        assert!(!plain.contains(tls), "trainstate-client without `rustls` pulls in {tls}");
    }
    let client = tree(&["-e", "normal", "-p", "trainstate-client", "--features", "rustls"]);
    assert!(client.contains("rustls"), "the `rustls` feature brings rustls");
    // One crypto provider, aws-lc-rs, for the head, its clients and the tests.
    let everything = tree(&["-e", "normal,dev", "--workspace", "--all-features"]);
    assert!(everything.contains("aws-lc-rs"), "aws-lc-rs is the crypto provider");
    assert!(!everything.contains("ring"), "a second crypto provider, ring, is built");
}

#[test]
fn schema_crate_pulls_in_nothing_async_nor_actor_nor_http() {
    let closure = normal_closure("trainstate-schema");
    for forbidden in ["tokio", "ractor", "axum", "hyper", "reqwest", "rusqlite"] {
        assert!(!closure.contains(forbidden), "trainstate-schema pulls in {forbidden}");
    }
}

/// The arrows from one of our packages to the others.
struct Arrows {
    package: &'static str,
    /// The ones of ours it may depend on directly (`None`: any).
    may_use: Option<&'static [&'static str]>,
    /// The ones of ours it must never reach, even through another of ours.
    never: &'static [&'static str],
}

/// PRODUCT.md's "our crates it may use" column.
const ARROWS: &[Arrows] = &[
    Arrows {
        package: "trainstate-schema",
        may_use: Some(&[]),
        never: &["trainstate-client", "trainstate-actor", "trainstate-manager", "xtask"],
    },
    Arrows {
        package: "trainstate-client",
        may_use: Some(&["trainstate-schema"]),
        never: &["trainstate-actor", "trainstate-manager", "xtask"],
    },
    Arrows {
        package: "trainstate-actor",
        may_use: Some(&["trainstate-client", "trainstate-schema"]),
        never: &["trainstate-manager", "xtask"],
    },
    Arrows {
        package: "trainstate-manager",
        may_use: Some(&["trainstate-client", "trainstate-schema"]),
        never: &["trainstate-actor", "xtask"],
    },
    Arrows {
        package: "trainstate-testkit",
        may_use: Some(&["trainstate-client", "trainstate-schema"]),
        never: &["trainstate-actor", "trainstate-manager", "xtask"],
    },
    Arrows { package: "xtask", may_use: None, never: &[] },
];

/// The normal dependencies of each workspace package on the others, by
/// name, as `cargo metadata` resolves them with default features (for the
/// whole workspace at once, so a feature another package turns on counts).
fn arrows_between_our_packages() -> BTreeMap<String, BTreeSet<String>> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc).arg("-vV").output().expect("rustc runs");
    let version = String::from_utf8(version.stdout).unwrap();
    let host = version
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .expect("rustc -vV names the host");
    let meta: Value = serde_json::from_slice(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        // Only this platform's packages, which are the ones a build has downloaded.
        "--filter-platform",
        host,
    ]))
    .unwrap();
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap())
        .collect();
    let names: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| members.contains(p["id"].as_str().unwrap()))
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|node| Some((names.get(node["id"].as_str().unwrap())?, node)))
        .map(|(name, node)| {
            let ours = node["deps"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|dep| {
                    dep["dep_kinds"].as_array().unwrap().iter().any(|k| k["kind"].is_null())
                })
                .filter_map(|dep| names.get(dep["pkg"].as_str().unwrap()))
                .map(|dep| dep.to_string())
                .collect();
            (name.to_string(), ours)
        })
        .collect()
}

#[test]
fn arrows_between_our_crates_are_the_allowed_ones() {
    let arrows = arrows_between_our_packages();
    let table: BTreeSet<&str> = ARROWS.iter().map(|row| row.package).collect();
    let workspace: BTreeSet<&str> = arrows.keys().map(String::as_str).collect();
    assert_eq!(table, workspace, "every workspace package has a row in ARROWS");

    for Arrows { package, may_use, never } in ARROWS {
        let direct = &arrows[*package];
        if let Some(may_use) = may_use {
            let allowed: BTreeSet<String> = may_use.iter().map(|p| p.to_string()).collect();
            assert_eq!(direct, &allowed, "{package} depends on these of our crates");
        }
        // Everything of ours it reaches, through any chain of normal dependencies.
        let mut reached = BTreeSet::new();
        let mut next: Vec<&String> = direct.iter().collect();
        while let Some(dep) = next.pop() {
            if reached.insert(dep.as_str()) {
                next.extend(&arrows[dep]);
            }
        }
        for forbidden in *never {
            assert!(!reached.contains(forbidden), "{package} reaches {forbidden}: {reached:?}");
        }
    }
}

/// The test helpers drive a head from outside, as a black box: besides the
/// contract and the client (see `ARROWS`), only tokio. No crate of ours
/// depends on them but in its dev-dependencies (`ARROWS` lists exactly
/// what each may use).
#[test]
fn the_testkit_uses_the_contract_the_client_and_tokio_only() {
    let direct = direct_normal_dependencies("trainstate-testkit");
    let allowed: BTreeSet<String> =
        ["trainstate-schema", "trainstate-client", "tokio"].map(String::from).into();
    assert!(direct.is_subset(&allowed), "trainstate-testkit depends on {direct:?}");
}
