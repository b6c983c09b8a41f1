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

#[test]
fn the_python_package_has_a_type_for_every_wire_type() {
    let files = xtask::generated_files();
    let module = files.iter().find(|f| f.path == "python/trainstate/types.py").unwrap();
    for name in
        ["TrainRunInfo", "TrainWorkerInfo", "JoinRequest", "RankEndRequest", "RendezvousResponse"]
    {
        assert!(module.contents.contains(&format!("\nclass {name}(")), "{name}");
    }
    for name in ["RunStatus", "CauseKind", "ErrorCode"] {
        assert!(module.contents.contains(&format!("\n{name} = Literal[")), "{name}");
    }
    assert!(module.contents.contains("\"RUNNING\", \"FINISHED\", \"ERRORED\", \"ABORTED\""));
}

#[test]
fn python_and_the_page_get_every_route_and_rusts_retry_rule() {
    use trainstate_schema::api::ErrorCode;

    let files = xtask::generated_files();
    let file = |path: &str| &files.iter().find(|f| f.path == path).unwrap().contents;
    let (python, page) =
        (file("python/trainstate/_contract.py"), file("trainstate-actor/web/contract.js"));
    for route in trainstate_schema::routes::routes() {
        let method = route.method.as_lower_str().to_ascii_uppercase();
        assert!(
            python.contains(&format!(" = Route({method:?}, {:?})\n", route.path)),
            "{}",
            route.path
        );
        assert!(
            page.contains(&format!("\"{}\": {{", route.operation_id)),
            "{}",
            route.operation_id
        );
    }
    let retryable: Vec<String> = ErrorCode::ALL
        .into_iter()
        .filter(|code| code.is_retryable())
        .map(|code| format!("{:?}", code.as_str()))
        .collect();
    assert!(
        python.contains(&format!("frozenset(({}))", retryable.join(", "))),
        "Python retries after exactly the codes Rust retries after"
    );
    assert!(
        page.contains(&format!(
            "\"retryableErrorCodes\": [\n    {}\n  ]",
            retryable.join(",\n    ")
        ))
    );
}

#[test]
fn python_and_the_page_quote_no_path_of_their_own() {
    let root = xtask::workspace_root();
    let mut sources = vec![root.join("trainstate-actor/web/app.js")];
    for entry in std::fs::read_dir(root.join("python/trainstate")).unwrap() {
        let path = entry.unwrap().path();
        let generated = ["types.py", "_contract.py"].iter().any(|name| path.ends_with(name));
        if path.extension().is_some_and(|ext| ext == "py") && !generated {
            sources.push(path);
        }
    }
    assert!(sources.len() > 5, "{sources:?}");
    for path in sources {
        let text = std::fs::read_to_string(&path).unwrap();
        for quote in ['\'', '"', '`'] {
            for prefix in ["/api/", "/runs/", "/healthz"] {
                let literal = format!("{quote}{prefix}");
                assert!(
                    !text.contains(&literal),
                    "{} quotes {literal}: take the path from the generated contract",
                    path.display()
                );
            }
        }
    }
}
