//! Tells the integration tests what this machine has, so that a test which
//! needs PostgreSQL or a browser is reported as ignored (not passed) when
//! it is missing. Under `CI=true` both are taken as present: a test that
//! then finds one missing fails.

use std::path::Path;

/// Where the web page's tests look for Chromium and chromedriver (the
/// same lists as `tests/web.rs`).
const CHROMIUM: &[&str] = &["/usr/bin/chromium", "/usr/bin/chromium-browser"];
const CHROMEDRIVER: &[&str] = &["/usr/bin/chromedriver"];

fn main() {
    println!("cargo::rustc-check-cfg=cfg(has_postgres)");
    println!("cargo::rustc-check-cfg=cfg(has_browser)");
    println!("cargo::rerun-if-env-changed=TRAINSTATE_TEST_POSTGRES_URL");
    println!("cargo::rerun-if-env-changed=CI");
    println!("cargo::rerun-if-changed=build.rs");

    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let postgres = std::env::var("TRAINSTATE_TEST_POSTGRES_URL").is_ok_and(|v| !v.is_empty());
    let installed = |candidates: &[&str]| {
        let found = candidates.iter().find(|p| Path::new(p).is_file());
        // A program removed later is seen (its file goes), and so is one
        // installed later (its directory changes).
        let watched = found.map_or_else(|| parent(candidates[0]), |p| (*p).to_owned());
        println!("cargo::rerun-if-changed={watched}");
        found.is_some()
    };
    let (chromium, chromedriver) = (installed(CHROMIUM), installed(CHROMEDRIVER));
    let browser = chromium && chromedriver;
    if postgres || ci {
        println!("cargo::rustc-cfg=has_postgres");
    }
    if browser || ci {
        println!("cargo::rustc-cfg=has_browser");
    }
}

/// The directory of `path`.
fn parent(path: &str) -> String {
    Path::new(path).parent().map_or_else(|| "/".into(), |p| p.display().to_string())
}
