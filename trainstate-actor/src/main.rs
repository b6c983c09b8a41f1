//! `trainstate`: the head service and its command line.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
