//! `kiln-gpu devices`, `kiln-gpu gemm …`, `kiln-gpu sweep …`, `kiln-gpu burn …`, `kiln-gpu bandwidth …`, `kiln-gpu p2p …`, `kiln-gpu collectives …`, `kiln-gpu train …`: one JSON document on stdout per command, and
//! `{"error": …}` with exit status 2 when it cannot measure. The library says what it measures.

use std::process::ExitCode;

use kiln_gpu::{backend, bandwidth, collectives, gemm, p2p, train, SCHEMA_VERSION};
use serde::Serialize;

const USAGE: &str = "usage: kiln-gpu devices
       kiln-gpu gemm [--device N] [--dtype bf16|f16|f32|tf32|fp8] [--n N | --shape MxNxK] [--reps N] [--samples N]
       kiln-gpu sweep [--device N] [--dtype bf16|f16|f32|tf32|fp8] [--shapes N|MxNxK,...] [--reps N] [--samples N]
       kiln-gpu burn [--device N] [--dtype bf16|f16|f32|tf32|fp8] [--n N | --shape MxNxK] [--seconds S] [--samples N]
       kiln-gpu bandwidth [--device N] [--mib N] [--reps N] [--cpus LIST]
       kiln-gpu p2p [--devices all|0,1,...] [--mib N] [--reps N]
       kiln-gpu collectives [--devices all|0,1,...] [--ops all_reduce,all_gather,reduce_scatter]
                            [--min-bytes 8] [--max-bytes 1G] [--iterations N] [--warmup N] [--seconds-per-size S]
                            [--nccl-id HEX --rank R --ranks N --device D]  (one rank of a job)
       kiln-gpu nccl-id
       kiln-gpu train [--device N] [--size gpt2|350m|1b] [--steps N] [--batch N] [--dtype bf16|tf32|f32]";

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

/// A command with its options parsed: every option is checked before the driver is asked or a
/// device touched.
enum Command {
    Devices,
    Gemm(gemm::Options),
    Sweep(gemm::SweepOptions),
    Burn(gemm::BurnOptions),
    Bandwidth(bandwidth::Options),
    P2p(p2p::Options),
    Collectives(collectives::Options),
    NcclId,
    Train(train::Options),
}

fn run(args: &[String]) -> anyhow::Result<String> {
    let Some((command, rest)) = args.split_first() else { anyhow::bail!("{USAGE}") };
    let command = match command.as_str() {
        "devices" => Command::Devices,
        "gemm" => Command::Gemm(gemm::Options::parse(rest)?),
        "sweep" => Command::Sweep(gemm::SweepOptions::parse(rest)?),
        "burn" => Command::Burn(gemm::BurnOptions::parse(rest)?),
        "bandwidth" => Command::Bandwidth(bandwidth::Options::parse(rest)?),
        "p2p" => Command::P2p(p2p::Options::parse(rest)?),
        "collectives" => Command::Collectives(collectives::Options::parse(rest)?),
        "nccl-id" => Command::NcclId,
        "train" => Command::Train(train::Options::parse(rest)?),
        "--help" | "-h" | "help" => return Ok(serde_json::json!({ "usage": USAGE }).to_string()),
        "--version" => return Ok(serde_json::json!({ "version": env!("CARGO_PKG_VERSION") }).to_string()),
        other => anyhow::bail!("unknown command {other:?}\n{USAGE}"),
    };
    backend::check_driver()?;
    Ok(match command {
        Command::Devices => document(&backend::devices()?),
        Command::Gemm(o) => document(&backend::gemm(&o)?),
        Command::Sweep(o) => document(&backend::sweep(&o)?),
        Command::Burn(o) => document(&backend::burn(&o)?),
        Command::Bandwidth(o) => document(&backend::bandwidth(&o)?),
        Command::P2p(o) => document(&backend::p2p(&o)?),
        Command::Collectives(o) => document(&backend::collectives(&o)?),
        Command::NcclId => document(&backend::nccl_id()?),
        Command::Train(o) => document(&backend::train(&o)?),
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
