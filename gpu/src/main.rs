//! `kiln-gpu devices`, `kiln-gpu gemm …`, `kiln-gpu sweep …`, `kiln-gpu burn …`, `kiln-gpu bandwidth …`,
//! `kiln-gpu p2p …`, `kiln-gpu collectives …`, `kiln-gpu nccl-id`, `kiln-gpu train …`: one JSON
//! document on stdout per command, and `{"error": …}` with exit status 2 when it cannot measure.
//! The command line is `kiln_gpu::request::Request` (clap); the library says what it measures.

use std::process::ExitCode;

use kiln_gpu::request::{first_line, Checked, Request};
use kiln_gpu::{backend, SCHEMA_VERSION};
use serde::Serialize;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(doc) => {
            println!("{doc}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Each cause's first line: candle appends a backtrace to its errors where RUST_BACKTRACE
            // is set, which is no message for a technician.
            let message: Vec<String> =
                e.chain().map(|cause| cause.to_string().lines().next().unwrap_or_default().to_string()).collect();
            let doc = serde_json::json!({ "schema_version": SCHEMA_VERSION, "error": message.join(": ") });
            println!("{doc}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> anyhow::Result<String> {
    if args.first().is_some_and(|a| a == "--version") {
        return Ok(serde_json::json!({ "version": env!("CARGO_PKG_VERSION") }).to_string());
    }
    let request = match Request::parse(args) {
        Ok(request) => request,
        Err(e) => {
            use clap::error::ErrorKind;
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    Ok(serde_json::json!({ "usage": e.render().to_string() }).to_string())
                }
                ErrorKind::InvalidSubcommand => {
                    anyhow::bail!("unknown command {:?}: {}", args[0], first_line(&e))
                }
                _ => Err(anyhow::anyhow!(first_line(&e))),
            };
        }
    };
    // Every option is checked before the driver is asked or a device touched.
    let checked = request.check()?;
    backend::check_driver()?;
    Ok(match checked {
        Checked::Devices => document(&backend::devices()?),
        Checked::Gemm(o) => document(&backend::gemm(&o)?),
        Checked::Sweep(o) => document(&backend::sweep(&o)?),
        Checked::Burn(o) => document(&backend::burn(&o)?),
        Checked::Bandwidth(o) => document(&backend::bandwidth(&o)?),
        Checked::P2p(o) => document(&backend::p2p(&o)?),
        Checked::Collectives(o) => document(&backend::collectives(&o)?),
        Checked::NcclId(root) => document(&backend::nccl_id(&root)?),
        Checked::Train(o) => document(&backend::train(&o)?),
    })
}

/// `{"schema_version": 1, …the value's fields}`.
fn document<T: Serialize>(value: &T) -> String {
    let mut doc = serde_json::to_value(value).expect("a document serialises");
    if let Some(map) = doc.as_object_mut() {
        map.insert("schema_version".into(), SCHEMA_VERSION.into());
    }
    doc.to_string()
}
