//! The committed generated files equal what the generator produces now.

#[test]
fn generated_files_are_fresh() {
    let stale = xtask::check(&xtask::workspace_root());
    assert!(stale.is_empty(), "stale generated files {stale:?}: run `cargo xtask codegen`");
}

#[test]
fn every_wire_type_has_a_schema_and_a_doc_section() {
    let files = xtask::generated_files();
    let doc = files.iter().find(|f| f.path == "docs/schema.md").unwrap();
    for name in ["TrainRunInfo", "TrainWorkerInfo", "TrainDatasetInfo", "RunAttempt", "RunStatus"] {
        assert!(files.iter().any(|f| f.path == format!("schemas/{name}.schema.json")), "{name}");
        assert!(doc.contents.contains(&format!("\n## {name}\n")), "{name}");
    }
}
