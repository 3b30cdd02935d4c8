//! GPUs through the fake NVML library, serving machines rebuilt from real `nvidia-smi -q`
//! captures (`tests/fixtures/nvidia/nvidia-smi`): the inventory must agree with the capture
//! field by field, and the fault cases must be reported.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::util::{fake_nvml, fixtures, kiln, Run};

/// One GPU block of `nvidia-smi -q`: (path, value) pairs, the path joined from the indentation
/// ("PCI/GPU Link Info/PCIe Generation/Max").
#[derive(Debug, Default)]
struct SmiGpu {
    fields: Vec<(String, String)>,
}

impl SmiGpu {
    fn get(&self, path: &str) -> Option<&str> {
        self.fields.iter().find(|(p, _)| p == path).map(|(_, v)| v.as_str()).filter(|v| *v != "N/A")
    }
    fn num(&self, path: &str) -> Option<f64> {
        self.get(path)?.split_whitespace().next()?.trim_end_matches('x').parse().ok()
    }
}

pub struct Smi {
    driver: String,
    cuda: String,
    gpus: Vec<SmiGpu>,
}

/// Parses `nvidia-smi -q` text, alone (thamada's captures) or inside a capture bundle.
fn parse_smi_q(text: &str) -> Smi {
    let body = match text.find("# $ nvidia-smi -q\n") {
        Some(start) => {
            let rest = &text[start..];
            let rest = &rest[rest.find("\n##").map_or(0, |i| i + 1)..];
            let rest = &rest[rest.find('\n').map_or(0, |i| i + 1)..];
            &rest[..rest.find("\n####").unwrap_or(rest.len())]
        }
        None => text,
    };
    let mut smi = Smi { driver: String::new(), cuda: String::new(), gpus: Vec::new() };
    let mut stack: Vec<(usize, String)> = Vec::new();
    for line in body.lines() {
        if let Some(bus) = line
            .strip_prefix("GPU ")
            .filter(|_| !line.starts_with("GPU ") || !line.contains(':') || line.matches(':').count() == 2)
        {
            if bus.len() >= 12 && bus.contains('.') {
                smi.gpus.push(SmiGpu::default());
                stack.clear();
                continue;
            }
        }
        let indent = line.len() - line.trim_start().len();
        let (key, value) = match line.split_once(" : ") {
            Some((k, v)) => (k.trim().to_string(), Some(v.trim().to_string())),
            None => (line.trim().to_string(), None),
        };
        if key.is_empty() {
            continue;
        }
        if smi.gpus.is_empty() {
            match key.as_str() {
                "Driver Version" => smi.driver = value.unwrap_or_default(),
                "CUDA Version" => smi.cuda = value.unwrap_or_default(),
                _ => {}
            }
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let path: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).chain(std::iter::once(key.as_str())).collect();
        match value {
            Some(v) => smi.gpus.last_mut().unwrap().fields.push((path.join("/"), v)),
            None => stack.push((indent, key)),
        }
    }
    smi
}

/// How a machine's NVLinks are wired; the captures do not record the far ends.
#[derive(Clone, Copy)]
pub enum Wiring {
    None,
    /// HGX H100: 18 links per GPU to NVSwitches. The switches' bus ids are not in the captures;
    /// the four used here only need to be distinct.
    NvSwitch18,
    /// HGX A100 4-GPU: 12 links per GPU, 4 to each other GPU.
    A100Mesh4,
}

const SWITCHES: [&str; 4] = ["00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0"];

fn arch_code(name: &str) -> u32 {
    match name {
        "Hopper" => 9,
        "Ampere" => 7,
        "Ada Lovelace" => 8,
        "Blackwell" => 10,
        _ => 0xffff_ffff,
    }
}

fn compute_capability(arch: &str, name: &str) -> &'static str {
    match arch {
        "Hopper" => "9 0",
        "Ampere" if name.contains("A100") => "8 0",
        "Ampere" => "8 6",
        "Ada Lovelace" => "8 9",
        _ => "1 0",
    }
}

fn enabled(v: Option<&str>) -> u32 {
    u32::from(v == Some("Enabled") || v == Some("Yes"))
}

/// Writes the fake's fixture for a capture; `tweak(gpu index, lines)` injects faults.
pub fn fixture(smi: &Smi, wiring: Wiring, tweak: impl Fn(usize, &mut Vec<String>)) -> String {
    let (major, minor) = smi.cuda.split_once('.').unwrap();
    let mut out = vec![
        format!("driver {}", smi.driver),
        format!("nvml 12.{}", smi.driver),
        format!("cuda {}", major.parse::<u32>().unwrap() * 1000 + minor.parse::<u32>().unwrap() * 10),
    ];
    let bus_ids: Vec<&str> = smi.gpus.iter().map(|g| g.get("PCI/Bus Id").unwrap()).collect();
    for (i, g) in smi.gpus.iter().enumerate() {
        let mut lines = vec!["gpu".to_string()];
        let text = |key: &str, path: &str| g.get(path).map(|v| format!("{key} {v}"));
        lines.extend(text("name", "Product Name"));
        lines.extend(text("uuid", "GPU UUID"));
        lines.extend(text("serial", "Serial Number"));
        lines.extend(text("board_part", "Board Part Number"));
        lines.extend(text("vbios", "VBIOS Version"));
        lines.extend(text("bus_id", "PCI/Bus Id"));
        lines.extend(text("pci_device_id", "PCI/Device Id"));
        lines.extend(text("pci_subsystem_id", "PCI/Sub System Id"));
        if let Some(mib) = g.num("FB Memory Usage/Total") {
            lines.push(format!("memory_total {}", mib as u64 * 1024 * 1024));
        }
        let arch = g.get("Product Architecture").unwrap_or("");
        lines.push(format!("arch {}", arch_code(arch)));
        lines.push(format!("cc {}", compute_capability(arch, g.get("Product Name").unwrap_or(""))));
        if let (Some(cur), Some(pend)) = (g.get("ECC Mode/Current"), g.get("ECC Mode/Pending")) {
            lines.push(format!("ecc {} {}", enabled(Some(cur)), enabled(Some(pend))));
            let sum = |scope: &str, kinds: &[&str]| -> u64 {
                kinds.iter().filter_map(|k| g.num(&format!("ECC Errors/{scope}/{k}"))).map(|v| v as u64).sum()
            };
            // Hopper splits SRAM uncorrectables by kind; Ampere has one "SRAM Uncorrectable";
            // Volta and before count single- and double-bit errors ("Single Bit/Total").
            let corr = ["SRAM Correctable", "DRAM Correctable", "Single Bit/Total"];
            let unc = [
                "SRAM Uncorrectable Parity",
                "SRAM Uncorrectable SEC-DED",
                "SRAM Uncorrectable",
                "DRAM Uncorrectable",
                "Double Bit/Total",
            ];
            lines.push(format!(
                "ecc_errors {} {} {} {}",
                sum("Volatile", &corr),
                sum("Volatile", &unc),
                sum("Aggregate", &corr),
                sum("Aggregate", &unc)
            ));
        }
        if let Some(c) = g.num("Remapped Rows/Correctable Error") {
            lines.push(format!(
                "remapped {} {} {} {}",
                c,
                g.num("Remapped Rows/Uncorrectable Error").unwrap_or(0.0),
                enabled(g.get("Remapped Rows/Pending")),
                enabled(g.get("Remapped Rows/Remapping Failure Occurred"))
            ));
        }
        let mw = |k: &str| g.num(&format!("GPU Power Readings/{k}")).map(|w| (w * 1000.0) as u64);
        if let (Some(d), Some(e), Some(mn), Some(mx)) =
            (mw("Default Power Limit"), mw("Current Power Limit"), mw("Min Power Limit"), mw("Max Power Limit"))
        {
            lines.push(format!("power {d} {e} {mn} {mx}"));
        }
        if let (Some(sm), Some(mem)) = (g.num("Max Clocks/SM"), g.num("Max Clocks/Memory")) {
            lines.push(format!("clocks {sm} {mem}"));
        }
        let link = |k: &str| g.num(&format!("PCI/GPU Link Info/{k}"));
        if let (Some(cg), Some(mg), Some(cw), Some(mw)) = (
            link("PCIe Generation/Current"),
            link("PCIe Generation/Max"),
            link("Link Width/Current"),
            link("Link Width/Max"),
        ) {
            lines.push(format!("pcie {cg} {mg} {cw} {mw}"));
        }
        lines.push(format!("persistence {}", enabled(g.get("Persistence Mode"))));
        if let (Some(c), Some(p)) = (g.get("MIG Mode/Current"), g.get("MIG Mode/Pending")) {
            lines.push(format!("mig {} {}", enabled(Some(c)), enabled(Some(p))));
        }
        if let Some(t) = g.num("Temperature/GPU Current Temp") {
            lines.push(format!("temp {t}"));
        }
        if let Some(n) = g.num("PCI/Replays Since Reset") {
            lines.push(format!("pcie_replay {n}"));
        }
        // nvidia-smi renders the driver's recovery action as two answers (R550 and later).
        match (g.get("GPU Reset Status/Reset Required"), g.get("GPU Reset Status/Drain and Reset Recommended")) {
            (_, Some("Yes")) => lines.push("recovery 4".into()),
            (Some("Yes"), _) => lines.push("recovery 1".into()),
            (Some(_), Some(_)) => lines.push("recovery 0".into()),
            _ => {}
        }
        match wiring {
            Wiring::None => {}
            Wiring::NvSwitch18 => {
                for l in 0..18 {
                    lines.push(format!("nvlink {l} 1 4 {} 2", SWITCHES[l % 4]));
                    lines.push(format!("nvlink_errors {l} 0 0 0 0"));
                }
            }
            Wiring::A100Mesh4 => {
                let peers: Vec<usize> = (0..bus_ids.len()).filter(|&j| j != i).collect();
                for l in 0..12 {
                    lines.push(format!("nvlink {l} 1 3 {} 0", bus_ids[peers[l / 4]]));
                }
            }
        }
        tweak(i, &mut lines);
        out.extend(lines);
    }
    out.join("\n") + "\n"
}

pub fn capture(name: &str) -> Smi {
    parse_smi_q(&std::fs::read_to_string(fixtures().join("nvidia/nvidia-smi").join(name)).unwrap())
}

pub struct FakeMachine {
    _dir: tempfile::TempDir,
    fixture: PathBuf,
}

impl FakeMachine {
    pub fn new(text: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let fixture = dir.path().join("machine.txt");
        std::fs::write(&fixture, text).unwrap();
        FakeMachine { _dir: dir, fixture }
    }

    pub fn fixture(&self) -> &Path {
        &self.fixture
    }

    pub fn kiln(&self, args: &[&str]) -> Run {
        self.kiln_with(args, &[])
    }

    /// `kiln ARGS` on this machine, with more environment.
    pub fn kiln_with(&self, args: &[&str], env: &[(&str, &Path)]) -> Run {
        let lib = fake_nvml();
        let mut all = args.to_vec();
        all.extend(["--nvml-lib", lib.to_str().unwrap()]);
        let mut vars = vec![("KILN_FAKE_NVML_FIXTURE", self.fixture.as_path())];
        vars.extend_from_slice(env);
        kiln(&all, &vars)
    }

    fn inventory(&self, root: Option<&Path>) -> Value {
        let mut args = vec!["inventory", "--json"];
        if let Some(r) = root {
            args.extend(["--root", r.to_str().unwrap()]);
        }
        self.kiln(&args).success().json()
    }
}

/// Every GPU field kiln reports must equal the capture's.
#[track_caller]
fn assert_matches_capture(inv: &Value, smi: &Smi) {
    let gpus = inv["gpus"]["devices"].as_array().unwrap();
    assert_eq!(gpus.len(), smi.gpus.len());
    assert_eq!(inv["gpus"]["driver_version"], smi.driver.as_str());
    assert_eq!(inv["gpus"]["cuda_driver_version"], smi.cuda.as_str());
    for (gpu, g) in gpus.iter().zip(&smi.gpus) {
        let bus = g.get("PCI/Bus Id").unwrap();
        let expect_bus = format!("{}:{}", &bus[4..8], bus[9..].to_ascii_lowercase());
        assert_eq!(gpu["pci_address"], expect_bus.as_str());
        assert_eq!(gpu["name"], g.get("Product Name").unwrap());
        assert_eq!(gpu["uuid"], g.get("GPU UUID").unwrap());
        assert_eq!(gpu["serial"].as_str(), g.get("Serial Number"));
        assert_eq!(gpu["vbios"].as_str(), g.get("VBIOS Version"));
        assert_eq!(gpu["board_part_number"].as_str(), g.get("Board Part Number"));
        let mib = g.num("FB Memory Usage/Total").unwrap() as u64;
        assert_eq!(gpu["memory_total_bytes"].as_u64(), Some(mib << 20));
        assert_eq!(
            gpu["architecture"].as_str().unwrap(),
            g.get("Product Architecture").unwrap().split(' ').next().unwrap()
        );
        let link = |k: &str| g.num(&format!("PCI/GPU Link Info/{k}")).map(|v| v as u64);
        assert_eq!(gpu["pcie"]["current_gen"].as_u64(), link("PCIe Generation/Current"));
        assert_eq!(gpu["pcie"]["max_gen"].as_u64(), link("PCIe Generation/Max"));
        assert_eq!(gpu["pcie"]["current_width"].as_u64(), link("Link Width/Current"));
        assert_eq!(gpu["pcie"]["max_width"].as_u64(), link("Link Width/Max"));
        assert_eq!(gpu["power"]["default_watts"].as_f64(), g.num("GPU Power Readings/Default Power Limit"));
        assert_eq!(gpu["max_sm_clock_mhz"].as_f64(), g.num("Max Clocks/SM"));
        assert_eq!(gpu["persistence_mode"], g.get("Persistence Mode") == Some("Enabled"));
        match g.get("MIG Mode/Current") {
            Some(mode) => assert_eq!(gpu["mig"]["enabled"], mode == "Enabled"),
            None => assert!(gpu["mig"].is_null(), "no MIG on this GPU"),
        }
        assert_eq!(gpu["temperature_celsius"].as_f64(), g.num("Temperature/GPU Current Temp"));
        assert_eq!(gpu["pcie_replays"].as_f64(), g.num("PCI/Replays Since Reset"));
        let recovery =
            match (g.get("GPU Reset Status/Reset Required"), g.get("GPU Reset Status/Drain and Reset Recommended")) {
                (_, Some("Yes")) => Some("drain_and_reset"),
                (Some("Yes"), _) => Some("gpu_reset"),
                (Some(_), Some(_)) => Some("none"),
                _ => None,
            };
        assert_eq!(gpu["recovery_action"].as_str(), recovery);
    }
}

/// The converter reads every generation's ECC counter names: Ampere's single "SRAM
/// Uncorrectable" and Volta's single- and double-bit totals, not only Hopper's split names.
#[test]
fn the_converter_reads_ampere_and_volta_ecc_names() {
    let capture = |ecc: &str| {
        format!(
            "Driver Version : 470.103.01\nCUDA Version : 11.4\n\nGPU 00000000:D8:00.0\n    Product Name : Tesla V100\n    PCI\n        Bus Id : 00000000:D8:00.0\n    ECC Mode\n        Current : Enabled\n        Pending : Enabled\n    ECC Errors\n{ecc}"
        )
    };
    let ampere = "        Volatile\n            SRAM Correctable : 1\n            SRAM Uncorrectable : 2\n            DRAM Correctable : 3\n            DRAM Uncorrectable : 4\n        Aggregate\n            SRAM Correctable : 5\n            SRAM Uncorrectable : 6\n            DRAM Correctable : 7\n            DRAM Uncorrectable : 8\n";
    let volta = "        Volatile\n            Single Bit\n                Device Memory : 1\n                Total : 4\n            Double Bit\n                Device Memory : 2\n                Total : 6\n        Aggregate\n            Single Bit\n                Total : 40\n            Double Bit\n                Total : 60\n";
    for (ecc, want) in [(ampere, "ecc_errors 4 6 12 14"), (volta, "ecc_errors 4 6 40 60")] {
        let smi = parse_smi_q(&capture(ecc));
        let text = fixture(&smi, Wiring::None, |_, _| {});
        assert!(text.lines().any(|l| l == want), "want {want} in\n{text}");
    }
}

#[test]
fn hgx_h100_eight_gpus_and_nvswitch_fabric() {
    let smi = capture("H100SXMx8_smi_q.txt");
    assert_eq!(smi.gpus.len(), 8);
    let machine = FakeMachine::new(&fixture(&smi, Wiring::NvSwitch18, |_, _| {}));
    let inv = machine.inventory(None);
    assert_matches_capture(&inv, &smi);
    let gpus = inv["gpus"]["devices"].as_array().unwrap();
    for gpu in gpus {
        assert_eq!(gpu["pcie"]["current_gen"], 5);
        assert_eq!(gpu["pcie"]["current_width"], 16);
        let links = gpu["nvlinks"].as_array().unwrap();
        assert_eq!(links.len(), 18);
        assert!(links.iter().all(|l| l["active"] == true && l["remote_type"] == "nvswitch"));
        assert!(gpu["uuid"].as_str().unwrap().starts_with("GPU-"));
        assert_eq!(gpu["serial"].as_str().unwrap().len(), 13);
    }
    assert_eq!(inv["gpus"]["nvswitches"].as_array().unwrap().len(), 4);
    // Every GPU pair: NV18 through the switches, as `nvidia-smi topo -m` shows on HGX H100.
    let topo = &inv["topology"];
    assert_eq!(topo["nvswitch"], true);
    for i in 0..8 {
        for j in 0..8 {
            let want = if i == j { "X" } else { "NV18" };
            assert_eq!(topo["matrix"][i][j], want, "GPU{i} -> GPU{j}");
        }
    }
    assert!(inv["fingerprints"]["config_name"].as_str().unwrap().contains("8× H100 80GB HBM3"));
    let summary = machine.kiln(&["inventory"]).success().stdout();
    assert!(
        summary.contains(
            "GPU7 NVIDIA H100 80GB HBM3 0000:db:00.0 79.6 GiB, PCIe Gen5 x16, NVLink 18/18 up, 989 TFLOP/s bf16 dense"
        ),
        "{summary}"
    );
}

/// The benchmark serves `tests/fake-nvml/machines/hgx-h100x8.txt`; it must be what the generator
/// makes of the capture. `KILN_UPDATE_FIXTURES=1` rewrites it.
#[test]
fn committed_machine_matches_the_capture() {
    let generated = fixture(&capture("H100SXMx8_smi_q.txt"), Wiring::NvSwitch18, |_, _| {});
    let header =
        "# 8x H100 SXM HGX, generated from tests/fixtures/nvidia/nvidia-smi/H100SXMx8_smi_q.txt by tests/gpu.rs\n";
    let want = format!("{header}{generated}");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-nvml/machines/hgx-h100x8.txt");
    if std::env::var_os("KILN_UPDATE_FIXTURES").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    assert!(
        std::fs::read_to_string(&path).unwrap_or_default() == want,
        "{} is stale: run with KILN_UPDATE_FIXTURES=1",
        path.display()
    );
}

#[test]
fn hgx_a100_four_gpus_fully_meshed() {
    let smi = capture("A100SXMx4_smi_q.txt");
    assert_eq!(smi.gpus.len(), 4);
    let machine = FakeMachine::new(&fixture(&smi, Wiring::A100Mesh4, |_, _| {}));
    let inv = machine.inventory(None);
    assert_matches_capture(&inv, &smi);
    for i in 0..4 {
        for j in 0..4 {
            assert_eq!(inv["topology"]["matrix"][i][j], if i == j { "X" } else { "NV4" });
        }
    }
    assert_eq!(inv["topology"]["nvswitch"], false);
}

#[test]
fn pcie_cards_downtrain_at_idle() {
    let smi = capture("RTX4090_smi_q.txt");
    assert_eq!(smi.gpus.len(), 8);
    let machine = FakeMachine::new(&fixture(&smi, Wiring::None, |_, _| {}));
    let inv = machine.inventory(None);
    assert_matches_capture(&inv, &smi);
    let idle = inv["gpus"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["pcie"]["current_gen"].as_u64() < g["pcie"]["max_gen"].as_u64())
        .count();
    assert!(idle > 0, "the capture has GPUs at a lower generation than their maximum, at idle");
    assert!(inv["gpus"]["devices"][0]["nvlinks"].as_array().unwrap().is_empty());
}

#[test]
fn h100_in_mig_mode_with_topology_affinity() {
    let text =
        std::fs::read_to_string(fixtures().join("nvidia/nvidia-smi/linux-x86_64__nvidia-h100-mig__590.48.01.txt"))
            .unwrap();
    let smi = parse_smi_q(&text);
    assert_eq!(smi.gpus.len(), 1);
    // `nvidia-smi topo -m` in the same capture: GPU0, CPU affinity 0-19, NUMA affinity 0.
    let topo_line = text.lines().find(|l| l.starts_with("GPU0\t")).unwrap();
    let cols: Vec<&str> = topo_line.split('\t').map(str::trim).collect();
    let (affinity, numa) = (cols[2], cols[3]);
    let machine = FakeMachine::new(&fixture(&smi, Wiring::None, |_, lines| {
        lines.push(format!("affinity {affinity}"));
        lines.push(format!("numa {numa}"));
    }));
    let inv = machine.inventory(None);
    assert_matches_capture(&inv, &smi);
    assert_eq!(inv["gpus"]["devices"][0]["mig"]["enabled"], true);
    let d = &inv["topology"]["devices"][0];
    assert_eq!((d["label"].as_str(), d["cpu_affinity"].as_str()), (Some("GPU0"), Some(affinity)));
    assert_eq!(d["numa_node"].as_u64(), numa.parse().ok());
    let out = machine.kiln(&["topo"]).success().stdout();
    let row = out.lines().find(|l| l.starts_with("GPU0")).unwrap();
    assert!(row.contains(" X ") && row.contains(affinity), "{out}");
}

#[test]
fn driver_not_loaded_lists_gpus_from_pci() {
    let smi = capture("H100SXMx8_smi_q.txt");
    let tree = SyntheticPci::hgx(&smi);
    let machine = FakeMachine::new("init_error 9\n");
    let inv = machine.inventory(Some(tree.root()));
    assert!(inv["gpus"]["devices"].as_array().unwrap().is_empty());
    assert_eq!(inv["gpus"]["pci_gpus"].as_array().unwrap().len(), 8);
    assert_eq!(inv["gpus"]["nvml_error"], "the NVIDIA driver is not loaded");
    let lib = fake_nvml();
    let p = inv["problems"].as_array().unwrap().iter().find(|p| p["path"] == lib.to_str().unwrap()).unwrap();
    assert_eq!(p["message"], "NVML unavailable (8 NVIDIA GPU(s) on PCI): the NVIDIA driver is not loaded");
    assert!(inv["fingerprints"]["config_name"].as_str().unwrap().contains("8× GH100 [H100 SXM5 80GB]"));
}

#[test]
fn a_gpu_missing_from_nvml_is_reported_loudly() {
    let smi = capture("H100SXMx8_smi_q.txt");
    let tree = SyntheticPci::hgx(&smi);
    let mut text = fixture(&smi, Wiring::NvSwitch18, |_, _| {});
    // Drop GPU 3 from what NVML serves; PCI still has it.
    let blocks: Vec<&str> = text.split("\ngpu\n").collect();
    text = blocks.iter().enumerate().filter(|(i, _)| *i != 4).map(|(_, b)| *b).collect::<Vec<_>>().join("\ngpu\n");
    let machine = FakeMachine::new(&text);
    let inv = machine.inventory(Some(tree.root()));
    assert_eq!(inv["gpus"]["devices"].as_array().unwrap().len(), 7);
    assert_eq!(inv["gpus"]["missing_from_nvml"], serde_json::json!(["0000:5d:00.0"]));
    let p = inv["problems"].as_array().unwrap().iter().find(|p| p["path"] == "nvml").unwrap();
    assert_eq!(p["message"], "NVML sees 7 of 8 GPUs on PCI; missing: 0000:5d:00.0");
    let summary = machine.kiln(&["inventory", "--root", tree.root().to_str().unwrap()]).success().stdout();
    assert!(summary.contains("GPU at 0000:5d:00.0 is on PCI but NVML does not see it"), "{summary}");
}

#[test]
fn faults_nvlink_down_gen4_x8_ecc_and_pending_remap() {
    let smi = capture("H100SXMx8_smi_q.txt");
    let text = fixture(&smi, Wiring::NvSwitch18, |i, lines| match i {
        2 => {
            let at = lines.iter().position(|l| l.starts_with("nvlink 5 ")).unwrap();
            lines[at] = format!("nvlink 5 0 4 {} 2", SWITCHES[1]);
        }
        4 => {
            let at = lines.iter().position(|l| l.starts_with("pcie ")).unwrap();
            lines[at] = "pcie 4 5 8 16".to_string();
        }
        6 => {
            lines.retain(|l| !l.starts_with("ecc_errors") && !l.starts_with("remapped"));
            lines.push("ecc_errors 12 1 340 2".to_string());
            lines.push("remapped 3 1 1 0".to_string());
        }
        _ => {}
    });
    let machine = FakeMachine::new(&text);
    let inv = machine.inventory(None);
    let gpus = inv["gpus"]["devices"].as_array().unwrap();
    let active = |g: &Value| g["nvlinks"].as_array().unwrap().iter().filter(|l| l["active"] == true).count();
    assert_eq!(active(&gpus[2]), 17);
    assert_eq!(inv["topology"]["matrix"][2][3], "NV17");
    assert_eq!(inv["topology"]["matrix"][0][1], "NV18");
    assert_eq!(
        (gpus[4]["pcie"]["current_gen"].as_u64(), gpus[4]["pcie"]["current_width"].as_u64()),
        (Some(4), Some(8))
    );
    let ecc = &gpus[6]["ecc"];
    assert_eq!((ecc["volatile_corrected"].as_u64(), ecc["volatile_uncorrected"].as_u64()), (Some(12), Some(1)));
    assert_eq!((ecc["aggregate_corrected"].as_u64(), ecc["aggregate_uncorrected"].as_u64()), (Some(340), Some(2)));
    let rr = &gpus[6]["remapped_rows"];
    assert_eq!(
        (rr["correctable"].as_u64(), rr["uncorrectable"].as_u64(), rr["pending"].as_bool()),
        (Some(3), Some(1), Some(true))
    );
    let summary = machine.kiln(&["inventory"]).success().stdout();
    assert!(
        summary.contains("GPU2 NVIDIA H100 80GB HBM3 0000:3a:00.0 79.6 GiB, PCIe Gen5 x16, NVLink 17/18 up"),
        "{summary}"
    );
    assert!(
        summary.contains("GPU4 NVIDIA H100 80GB HBM3 0000:9a:00.0 79.6 GiB, PCIe Gen4 x8 (max Gen5 x16)"),
        "{summary}"
    );
    // The inventory names every health fault it read, not only a commission's verdict.
    assert!(summary.contains("; FAULTS: 2 uncorrectable ECC errors, row remap pending (reset the GPU)"), "{summary}");
}

/// What the GPUs say at rest, read with the inventory: clocks held back by a power brake and a
/// hardware slowdown, a power limit below the board's default, a reset the driver asks for and a
/// drain (the summary names them all), and each GPU's fabric registration.
#[test]
fn clocks_held_back_at_rest_and_a_lowered_power_limit_are_read_and_shown() {
    let smi = capture("H100SXMx8_smi_q.txt");
    let text = fixture(&smi, Wiring::NvSwitch18, |i, lines| {
        lines.push(format!("fabric {} 0", if i == 2 { 2 } else { 3 }));
        if i == 1 {
            lines.push("load 80000 345 2619 0 0 0x89".to_string());
            let at = lines.iter().position(|l| l.starts_with("power ")).unwrap();
            lines[at] = "power 700000 500000 200000 700000".to_string();
            lines.push("recovery 1".to_string());
            lines.push("drained 1".to_string());
        }
    });
    let machine = FakeMachine::new(&text);
    let inv = machine.inventory(None);
    let gpus = inv["gpus"]["devices"].as_array().unwrap();
    assert_eq!(gpus[1]["clock_event_reasons"], serde_json::json!(["gpu_idle", "hw_slowdown", "hw_power_brake"]));
    assert!(gpus[0]["clock_event_reasons"].is_null(), "the fake reads no reasons without a load line");
    // Each GPU's NVLink fabric registration (NVML's fabric info).
    assert_eq!(gpus[0]["fabric"], serde_json::json!({"state": "completed", "status": 0}));
    assert_eq!(gpus[2]["fabric"]["state"], "in_progress");
    // What the driver asks for before the GPU takes work again, and its drain state.
    assert_eq!((gpus[1]["recovery_action"].as_str(), gpus[1]["drained"].as_bool()), (Some("gpu_reset"), Some(true)));
    assert_eq!((gpus[0]["recovery_action"].as_str(), gpus[0]["drained"].as_bool()), (Some("none"), None));
    let summary = machine.kiln(&["inventory"]).success().stdout();
    assert!(
        summary.contains(
            "; FAULTS: clocks held back at rest (hw_slowdown, hw_power_brake), power limit 500 W of the default 700 W, \
             the driver asks for gpu reset, drained"
        ),
        "{summary}"
    );
}

#[test]
fn no_library_on_a_cpu_only_snapshot_is_not_a_problem() {
    let root = crate::util::unpack(&fixtures().join("hwloc/16em64t-4s2c2t.tar.bz2")).join("16em64t-4s2c2t");
    let inv = kiln(&["inventory", "--json", "--root", root.to_str().unwrap()], &[]).success().json();
    assert!(inv["gpus"]["nvml_library"].is_null(), "a snapshot does not consult this machine's NVML");
    let run = kiln(
        &["inventory", "--json", "--root", root.to_str().unwrap(), "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
        &[],
    )
    .success();
    let inv = run.json();
    assert!(inv["gpus"]["nvml_error"].as_str().unwrap().contains("cannot load /nonexistent/libnvidia-ml.so.1"));
}

pub use crate::synthetic::Tree as SyntheticPci;

impl SyntheticPci {
    /// Each GPU and one ConnectX-7 share a PCIe switch under their own root port, as on HGX
    /// H100 boards; GPUs 0-3 on NUMA node 0, 4-7 on node 1. `x8_port` trains one switch port at x8.
    pub fn hgx_with(smi: &Smi, x8_port: Option<usize>) -> SyntheticPci {
        Self::hgx_degraded(smi, x8_port.map(|i| (i, ("32.0 GT/s PCIe", 8, "32.0 GT/s PCIe", 16))))
    }

    /// [`SyntheticPci::hgx_with`], with the switch downstream port above GPU `i` at `link`
    /// (current speed, width, max speed, width).
    pub fn hgx_degraded(smi: &Smi, degraded: Option<(usize, (&str, u32, &str, u32))>) -> SyntheticPci {
        let tree = SyntheticPci { dir: tempfile::tempdir().unwrap() };
        std::fs::create_dir_all(tree.root().join("proc")).unwrap();
        let gen5 = ("32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16);
        for (i, g) in smi.gpus.iter().enumerate() {
            let bus = g.get("PCI/Bus Id").unwrap().to_ascii_lowercase();
            let gpu = format!("{}:{}", &bus[4..8], &bus[9..]);
            let b = u8::from_str_radix(&gpu[5..7], 16).unwrap();
            let root_port = format!("0000:{:02x}:01.0", b - 3);
            let up = format!("0000:{:02x}:00.0", b - 2);
            let down = format!("0000:{:02x}:00.0", b - 1);
            let down_nic = format!("0000:{:02x}:01.0", b - 1);
            let nic = format!("0000:{:02x}:00.0", b + 1);
            let numa = if i < 4 { 0 } else { 1 };
            let port_link = match degraded {
                Some((at, link)) if at == i => link,
                _ => gen5,
            };
            tree.device(&[&root_port], "8086", "352a", "060400", numa, gen5);
            tree.device(&[&root_port, &up], "1000", "c030", "060400", numa, gen5);
            tree.device(&[&root_port, &up, &down], "1000", "c030", "060400", numa, port_link);
            tree.device(&[&root_port, &up, &down, &gpu], "10de", "2330", "030200", numa, gen5);
            tree.device(&[&root_port, &up, &down_nic], "1000", "c030", "060400", numa, gen5);
            tree.device(&[&root_port, &up, &down_nic, &nic], "15b3", "1021", "020700", numa, gen5);
            tree.rdma(&[&root_port, &up, &down_nic, &nic], &format!("mlx5_{i}"));
        }
        tree
    }

    pub fn hgx(smi: &Smi) -> SyntheticPci {
        Self::hgx_with(smi, None)
    }
}

/// The PCIe side of the matrix on an HGX-like tree: each GPU shares a switch with its NIC (PIX),
/// reaches the other NICs of its socket through the host bridges (NODE) and the rest across the
/// sockets (SYS), as `nvidia-smi topo -m` shows on HGX H100 servers; NVLink pairs stay NV18.
#[test]
fn topology_over_a_pcie_tree() {
    let smi = capture("H100SXMx8_smi_q.txt");
    let tree = SyntheticPci::hgx_with(&smi, Some(4));
    let machine = FakeMachine::new(&fixture(&smi, Wiring::NvSwitch18, |_, _| {}));
    let inv = machine.inventory(Some(tree.root()));
    let topo = &inv["topology"];
    let labels: Vec<&str> = topo["devices"].as_array().unwrap().iter().map(|d| d["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "GPU0", "GPU1", "GPU2", "GPU3", "GPU4", "GPU5", "GPU6", "GPU7", "NIC0", "NIC1", "NIC2", "NIC3", "NIC4",
            "NIC5", "NIC6", "NIC7"
        ]
    );
    let nic_names: Vec<&str> =
        topo["devices"].as_array().unwrap()[8..].iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(nic_names, ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]);
    let m = |i: usize, j: usize| topo["matrix"][i][j].as_str().unwrap().to_string();
    for g in 0..8 {
        for n in 0..8 {
            let want = if g == n {
                "PIX"
            } else if (g < 4) == (n < 4) {
                "NODE"
            } else {
                "SYS"
            };
            assert_eq!(m(g, 8 + n), want, "GPU{g} -> NIC{n}");
            assert_eq!(m(8 + n, g), want, "symmetric");
        }
        assert_eq!(m(g, (g + 1) % 8), "NV18");
    }
    assert_eq!(topo["devices"][4]["numa_node"], 1);

    // The same tree without NVLink: GPU pairs go through PCIe.
    let pcie_only = FakeMachine::new(&fixture(&smi, Wiring::None, |_, _| {}));
    let inv2 = pcie_only.inventory(Some(tree.root()));
    assert_eq!(inv2["topology"]["matrix"][0][1], "NODE");
    assert_eq!(inv2["topology"]["matrix"][0][5], "SYS");

    // A switch port trained at x8 above GPU4 is visible even though the GPU's own link is fine.
    let port = inv["pci"].as_array().unwrap().iter().find(|d| d["address"] == "0000:99:00.0").unwrap();
    assert_eq!(port["link"]["degraded"], true);
    let gpu4 = inv["pci"].as_array().unwrap().iter().find(|d| d["address"] == "0000:9a:00.0").unwrap();
    assert_eq!(gpu4["link"]["degraded"], false);
    assert!(gpu4["upstream"].as_array().unwrap().contains(&serde_json::json!("0000:99:00.0")));
    let summary = machine.kiln(&["inventory", "--root", tree.root().to_str().unwrap()]).success().stdout();
    assert!(summary.contains("0000:99:00.0") && summary.contains("Gen5 x8 (max Gen5 x16)"), "{summary}");
}

/// Telemetry samples the GPUs through NVML during a benchmark and says when clocks were held back.
#[test]
fn benchmark_telemetry_reports_gpu_throttling() {
    let smi = capture("H100SXMx8_smi_q.txt");
    let text = fixture(&smi, Wiring::None, |i, lines| {
        // GPU 3 sits at its power cap (SW_POWER_CAP, 0x4); the others run free.
        let throttle = if i == 3 { "4" } else { "0" };
        lines.push(format!("load 650000 1755 2619 100 40 {throttle}"));
    });
    let machine = FakeMachine::new(&text);
    let lib = fake_nvml();
    let run = kiln(
        &["bench", "membw", "--array-mib", "128", "--repetitions", "6", "--no-save", "--json"],
        &[("KILN_FAKE_NVML_FIXTURE", &machine.fixture), ("KILN_NVML_LIB", &lib)],
    )
    .success();
    let out = run.json();
    let lines: Vec<&str> = out["report"]["telemetry"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert!(lines.iter().any(|l| l.starts_with("gpu3 throttled_power: 100 % of the run")), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("gpu0 throttled_power: 0 % of the run")), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("gpu0 power_watts: median 650.0")), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("gpu7 sm_clock_mhz: median 1755.0")), "{lines:?}");
}
