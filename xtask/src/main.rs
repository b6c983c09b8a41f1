//! `cargo xtask`: the workspace's code generator and benchmark driver.

mod bench;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask codegen [--check]

  codegen          write schemas/*.schema.json and docs/schema.md
  codegen --check  exit non-zero, naming each stale file, if any differs
  bench [...]      measure trainstate beside the Ray anchor (`cargo xtask bench --help`)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let root = xtask::workspace_root();
    match args.as_slice() {
        ["codegen"] => match xtask::write(&root) {
            Ok(()) => {
                println!("wrote {} files", xtask::generated_files().len());
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("error: writing generated files: {err}");
                ExitCode::FAILURE
            }
        },
        ["codegen", "--check"] => {
            let stale = xtask::check(&root);
            if stale.is_empty() {
                println!("generated files are fresh");
                ExitCode::SUCCESS
            } else {
                for path in &stale {
                    eprintln!("stale: {path} (run `cargo xtask codegen`)");
                }
                ExitCode::FAILURE
            }
        }
        ["bench", "--help" | "-h"] => {
            println!("{}", bench::USAGE);
            ExitCode::SUCCESS
        }
        ["bench", rest @ ..] => bench::main(rest, &root),
        [command @ ("bench-unit" | "bench-ready" | "bench-scale" | "bench-goodput"), rest @ ..] => {
            bench::child_main(command, rest, &root)
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
