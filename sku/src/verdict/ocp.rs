//! A verdict as OCP Test & Validation output (version 2.0): JSON lines, each an output artifact
//! with a sequence number and a timestamp — the schema version, the test run start (with the DUT:
//! host, GPUs, NICs, drives as hardware infos), one test step per check family with a diagnosis per
//! check (PASS / FAIL / UNKNOWN for a skip) and, for measured numbers, nothing more than the
//! diagnosis message (kiln's measurements live in its database), then the run's end with its result.

use serde_json::{json, Value};

use kiln_inventory::Inventory;

use super::{Decision, Status, Verdict};

/// The artifacts, one JSON document per line.
pub fn lines(v: &Verdict, inv: &Inventory, command_line: &str, now: &str) -> String {
    let mut out = Vec::new();
    let mut emit = |artifact: Value| {
        let mut a = artifact;
        let obj = a.as_object_mut().expect("an object");
        obj.insert("sequenceNumber".into(), json!(out.len()));
        obj.insert("timestamp".into(), json!(now));
        out.push(serde_json::to_string(&a).expect("JSON"));
    };
    emit(json!({ "schemaVersion": { "major": 2, "minor": 0 } }));
    emit(json!({ "testRunArtifact": { "testRunStart": {
        "name": "kiln commission",
        "version": env!("CARGO_PKG_VERSION"),
        "commandLine": command_line,
        "parameters": { "spec": v.spec.name, "specHash": v.spec.hash, "allowSkip": v.allow_skip,
                        "performanceJudged": v.performance_judged },
        "dutInfo": dut_info(inv, v),
    } } }));
    let mut families: Vec<&str> = v.checks.iter().map(|c| c.id.split('.').next().unwrap_or("")).collect();
    families.sort_unstable();
    families.dedup();
    for (step, family) in families.iter().enumerate() {
        let id = step.to_string();
        emit(json!({ "testStepArtifact": { "testStepId": id, "testStepStart": { "name": family } } }));
        for c in v.checks.iter().filter(|c| c.id.split('.').next() == Some(family)) {
            let kind = match c.status {
                Status::Pass | Status::Warn => "PASS",
                Status::Fail => "FAIL",
                Status::Skip => "UNKNOWN",
            };
            let mut message = format!("{}: expected {}, measured {}", c.subject, c.expected, c.measured);
            if !c.reason.is_empty() {
                message.push_str(&format!(" ({})", c.reason));
            }
            message.push_str(&format!(" [evidence: {}]", c.evidence));
            if let Some(r) = &c.reference {
                message.push_str(&format!(
                    " [reference: {} {} ({}), ratio {:.2}, floor {:.2}; {}]",
                    kiln_text::num(r.value),
                    r.unit,
                    r.kind,
                    r.ratio,
                    r.floor,
                    r.source
                ));
            }
            if let Some(r) = &c.remedy {
                message.push_str(&format!(" Remedy: {} [source: {}]", r.action, r.source));
            }
            emit(json!({ "testStepArtifact": { "testStepId": id, "diagnosis": {
                "verdict": format!("{}-{}", c.id, c.status.as_str()),
                "type": kind,
                "message": message,
            } } }));
        }
        emit(json!({ "testStepArtifact": { "testStepId": id, "testStepEnd": { "status": "COMPLETE" } } }));
    }
    // A fault of kiln's own stack is an OCP error of the test, not a diagnosis of the DUT.
    for h in &v.harness {
        emit(json!({ "testRunArtifact": { "error": { "symptom": "harness", "message": h } } }));
    }
    let result = match v.verdict {
        Decision::Accept => "PASS",
        Decision::Reject => "FAIL",
        Decision::Inconclusive => "NOT_APPLICABLE",
    };
    emit(json!({ "testRunArtifact": { "testRunEnd": { "status": "COMPLETE", "result": result } } }));
    let mut text = out.join("\n");
    text.push('\n');
    text
}

fn dut_info(inv: &Inventory, v: &Verdict) -> Value {
    let mut hardware = Vec::new();
    for g in &inv.gpus.devices {
        let mut h = json!({
            "hardwareInfoId": format!("gpu{}", g.index),
            "name": g.name.clone().unwrap_or_else(|| "GPU".into()),
            "location": g.pci_address.clone().unwrap_or_default(),
            "partType": "GPU",
        });
        if let Some(s) = &g.serial {
            h["serialNumber"] = json!(s);
        }
        if let Some(p) = &g.board_part_number {
            h["partNumber"] = json!(p);
        }
        hardware.push(h);
    }
    for d in &inv.nvme {
        let mut h = json!({ "hardwareInfoId": d.name, "name": d.model.clone().unwrap_or_else(|| "NVMe".into()).trim(), "partType": "NVMe" });
        if let Some(s) = &d.serial {
            h["serialNumber"] = json!(s.trim());
        }
        hardware.push(h);
    }
    let mut dut = json!({
        "dutInfoId": v.inventory_id.clone().or_else(|| inv.fingerprints.host.clone()).unwrap_or_else(|| "unknown".into()),
        "platformInfos": [ { "info": format!("{} {}",
            inv.system.product.vendor.as_deref().unwrap_or(""), inv.system.product.name.as_deref().unwrap_or("")).trim().to_string() } ],
        "hardwareInfos": hardware,
    });
    // OCP TV 2.0's dutInfo has a `name`, no `hostname`.
    if let Some(h) = &inv.os.hostname {
        dut["name"] = json!(h);
    }
    let mut software = Vec::new();
    if let Some(k) = &inv.os.kernel_release {
        software.push(json!({ "softwareInfoId": "kernel", "name": "Linux", "version": k, "softwareType": "SYSTEM" }));
    }
    if let Some(d) = &inv.gpus.driver_version {
        software.push(json!({ "softwareInfoId": "nvidia-driver", "name": "NVIDIA driver", "version": d, "softwareType": "SYSTEM" }));
    }
    if let Some(b) = &inv.system.bios.version {
        software.push(json!({ "softwareInfoId": "bios", "name": "BIOS", "version": b, "softwareType": "FIRMWARE" }));
    }
    dut["softwareInfos"] = json!(software);
    dut
}
