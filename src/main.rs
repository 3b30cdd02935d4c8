//! The `kiln` binary: parse the command line, run the command (`cli`, over the crates below it), print its output and
//! map the outcome to an exit code (0 ok, 1 a check failed, 2 an error). A closed stdout
//! (`kiln … | head`) is not an error.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

mod cli;

use cli::Cli;

fn main() -> ExitCode {
    // candle's CPU worker threads spin 25,000 times after every elementwise op before they sleep;
    // meanwhile the matmuls run on rayon's threads, and on a small machine the spinning worker
    // takes a core from them: a CPU training step is 7-13 % faster when the workers sleep at once
    // (measured on 2 cores). Set before any thread exists; a user's own setting wins.
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", "0");
    }
    let args = Cli::parse();
    init_logging();
    match cli::run_cli(args) {
        Ok(exit) => ExitCode::from(exit.code()),
        Err(e) if cli::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kiln: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Diagnostics on stderr through `tracing`, filtered by `KILN_LOG` (warnings only by default).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KILN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
