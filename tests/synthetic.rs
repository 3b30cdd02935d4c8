//! Synthetic machines for tests and benchmarks: a `--root` tree of PCI functions, bridges, links,
//! NUMA nodes and RDMA ports — generated from an NCCL topology dump such as Azure ND H100 v5's —
//! and the rest a spec reads (kernel command line, CPU governor, kernel log, AER counters).
//! Also the fake NVML library's build. Shared by the integration tests and the benches (which
//! include this file by path), so it uses nothing but std and tempfile.

use std::path::Path;

/// Compiles `tests/fake-nvml/fake_nvml.c` into `out` with `$CC` (default `cc`).
///
/// # Errors
/// The compiler is missing or fails, said for people.
pub fn compile_fake_nvml(out: &Path) -> Result<(), String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-nvml/fake_nvml.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
        .arg(out)
        .arg(&src)
        .status()
        .map_err(|e| format!("running {cc} to build the fake NVML: {e} (install gcc)"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("building the fake NVML from {} failed", src.display()))
    }
}

/// A synthetic `--root`: PCI functions (with their bridges, links and NUMA nodes) and RDMA ports,
/// only what kiln's readers need.
pub struct Tree {
    pub dir: tempfile::TempDir,
}

impl Tree {
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn device(
        &self,
        chain: &[&str],
        vendor: &str,
        device: &str,
        class: &str,
        numa: i32,
        link: (&str, u32, &str, u32),
    ) {
        let host = format!("pci{}", &chain[0][..7]);
        let mut path = self.root().join("sys/devices").join(&host);
        for part in chain {
            path = path.join(part);
        }
        std::fs::create_dir_all(&path).unwrap();
        for (name, value) in [
            ("vendor", format!("0x{vendor}")),
            ("device", format!("0x{device}")),
            ("class", format!("0x{class}")),
            ("numa_node", numa.to_string()),
            ("current_link_speed", link.0.to_string()),
            ("current_link_width", link.1.to_string()),
            ("max_link_speed", link.2.to_string()),
            ("max_link_width", link.3.to_string()),
        ] {
            std::fs::write(path.join(name), format!("{value}\n")).unwrap();
        }
        let bus = self.root().join("sys/bus/pci/devices");
        std::fs::create_dir_all(&bus).unwrap();
        let target = format!("../../../devices/{host}/{}", chain.join("/"));
        std::os::unix::fs::symlink(target, bus.join(chain.last().unwrap())).unwrap();
    }

    /// An RDMA device (ConnectX-7 port) on a PCI function, as /sys/class/infiniband shows it.
    pub fn rdma(&self, chain: &[&str], name: &str) {
        let host = format!("pci{}", &chain[0][..7]);
        let dev = format!("devices/{host}/{}/infiniband/{name}", chain.join("/"));
        let port = self.root().join("sys").join(&dev).join("ports/1");
        std::fs::create_dir_all(&port).unwrap();
        std::fs::write(port.join("state"), "4: ACTIVE\n").unwrap();
        std::fs::write(port.join("rate"), "400 Gb/sec (4X NDR)\n").unwrap();
        std::fs::write(port.join("link_layer"), "InfiniBand\n").unwrap();
        std::fs::write(port.join("phys_state"), "5: LinkUp\n").unwrap();
        std::fs::create_dir_all(port.join("counters")).unwrap();
        for counter in RDMA_COUNTERS {
            std::fs::write(port.join("counters").join(counter), "0\n").unwrap();
        }
        // The P_Key table: the default partition, then empty entries.
        std::fs::create_dir_all(port.join("pkeys")).unwrap();
        for i in 0..4 {
            std::fs::write(port.join(format!("pkeys/{i}")), if i == 0 { "0xffff\n" } else { "0x0000\n" }).unwrap();
        }
        let class = self.root().join("sys/class/infiniband");
        std::fs::create_dir_all(&class).unwrap();
        std::os::unix::fs::symlink(format!("../../{dev}"), class.join(name)).unwrap();
    }
}

/// The kernel's port error counters (`/sys/class/infiniband/*/ports/*/counters`).
pub const RDMA_COUNTERS: [&str; 12] = [
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
];

/// A board sensor chip (a Super I/O): an inlet sensor at 24 °C, a hotter one with its critical
/// limit, and two fans at speed above their minimum.
pub const CLEAN_HWMON: &[(&str, &str)] = &[
    ("name", "nct6779"),
    ("temp1_input", "24000"),
    ("temp1_label", "Inlet Temp"),
    ("temp2_input", "48000"),
    ("temp2_label", "SYSTIN"),
    ("temp2_crit", "95000"),
    ("temp2_alarm", "0"),
    ("fan1_input", "6120"),
    ("fan1_min", "1000"),
    ("fan1_alarm", "0"),
    ("fan2_input", "6240"),
    ("fan2_min", "1000"),
];

/// What the shipped H100 spec needs of a box beyond its PCI tree: the kernel command line, the CPU
/// governor, the kernel log and AER counters on every PCI function.
/// `/proc/modules` of a GPU box with GPUDirect RDMA: the driver and the peer memory module.
pub const CLEAN_MODULES: &str = "nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)\n\
nvidia_uvm 1794048 0 - Live 0x0000000000000000 (POE)\nnvidia 60932096 2 nvidia_peermem,nvidia_uvm, Live 0x0000000000000000 (POE)\n\
mlx5_ib 495616 0 - Live 0x0000000000000000\n";

pub fn finish_root(tree: &Tree, dmesg: &str) {
    let root = tree.root();
    std::fs::write(root.join("proc/cmdline"), "BOOT_IMAGE=/vmlinuz root=/dev/sda1 iommu=pt\n").unwrap();
    let cpu = root.join("sys/devices/system/cpu");
    // Two sockets, one CPU shown of each.
    for (n, package) in [(0, 0), (1, 1)] {
        std::fs::create_dir_all(cpu.join(format!("cpu{n}/cpufreq"))).unwrap();
        std::fs::create_dir_all(cpu.join(format!("cpu{n}/topology"))).unwrap();
        std::fs::write(cpu.join(format!("cpu{n}/cpufreq/scaling_governor")), "performance\n").unwrap();
        std::fs::write(cpu.join(format!("cpu{n}/topology/physical_package_id")), format!("{package}\n")).unwrap();
        std::fs::write(cpu.join(format!("cpu{n}/topology/core_id")), "0\n").unwrap();
    }
    std::fs::write(cpu.join("online"), "0-1\n").unwrap();
    std::fs::write(root.join("proc/modules"), CLEAN_MODULES).unwrap();
    std::fs::write(root.join("dmesg.txt"), dmesg).unwrap();
    let chip = root.join("sys/devices/platform/nct6775.656/hwmon/hwmon2");
    std::fs::create_dir_all(&chip).unwrap();
    for (file, value) in CLEAN_HWMON {
        std::fs::write(chip.join(file), format!("{value}\n")).unwrap();
    }
    std::fs::create_dir_all(root.join("sys/class/hwmon")).unwrap();
    std::os::unix::fs::symlink("../../devices/platform/nct6775.656/hwmon/hwmon2", root.join("sys/class/hwmon/hwmon2"))
        .unwrap();
    for entry in std::fs::read_dir(root.join("sys/bus/pci/devices")).unwrap() {
        let dev = std::fs::canonicalize(entry.unwrap().path()).unwrap();
        for kind in ["correctable", "nonfatal", "fatal"] {
            std::fs::write(
                dev.join(format!("aer_dev_{kind}")),
                "RxErr 0\nTOTAL_ERR_COR 0\nTOTAL_ERR_FATAL 0\nTOTAL_ERR_NONFATAL 0\n",
            )
            .unwrap();
        }
    }
}

/// One PCI function of an NCCL topology file, with the bridges above it.
pub struct TopoDevice {
    chain: Vec<String>,
    class: String,
    speed: String,
    width: u32,
    numa: i32,
}

/// The PCI functions of an NCCL topology dump (`NCCL_TOPO_DUMP_FILE`): `<cpu numaid=…>` holds
/// nested `<pci busid=… class=… link_speed=… link_width=…>` elements, bridges around endpoints.
pub fn parse_nccl_topology(xml: &str) -> Vec<TopoDevice> {
    let attr = |tag: &str, name: &str| -> Option<String> {
        let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        Some(tag[at..at + tag[at..].find('"')?].to_string())
    };
    let (mut out, mut stack, mut numa) = (Vec::new(), Vec::<String>::new(), 0);
    let mut rest = xml;
    while let Some(open) = rest.find('<') {
        let close = rest[open..].find('>').unwrap() + open;
        let tag = &rest[open + 1..close];
        rest = &rest[close + 1..];
        if tag.starts_with("cpu ") {
            numa = attr(tag, "numaid").unwrap().parse().unwrap();
        } else if tag == "/pci" {
            stack.pop();
        } else if tag.starts_with("pci ") {
            let busid = attr(tag, "busid").unwrap();
            let mut chain = stack.clone();
            chain.push(busid.clone());
            out.push(TopoDevice {
                chain,
                class: attr(tag, "class").unwrap().trim_start_matches("0x").to_string(),
                speed: attr(tag, "link_speed").unwrap(),
                width: attr(tag, "link_width").unwrap().parse().unwrap(),
                numa,
            });
            if !tag.ends_with('/') {
                stack.push(busid);
            }
        }
    }
    out
}

/// A `--root` tree generated from Azure ND H100 v5's NCCL topology (8 GPUs and 8 ConnectX-7 NICs
/// in pairs under PCIe switch ports, two NUMA nodes), with the link of `degraded` (a bus id) set
/// to `link`; and the GPUs' bus ids, in order.
pub fn ndv5_tree(xml: &str, degraded: Option<(&str, (&'static str, u32, &'static str, u32))>) -> (Tree, Vec<String>) {
    let tree = Tree { dir: tempfile::tempdir().unwrap() };
    std::fs::create_dir_all(tree.root().join("proc")).unwrap();
    let (mut gpus, mut nics) = (Vec::new(), 0);
    for d in parse_nccl_topology(xml) {
        let chain: Vec<&str> = d.chain.iter().map(String::as_str).collect();
        let own = (d.speed.as_str(), d.width, d.speed.as_str(), d.width);
        let link = match degraded {
            Some((bus, link)) if bus == d.chain.last().unwrap() => link,
            _ => own,
        };
        let (vendor, device) = match &d.class[..4] {
            "0604" => ("1000", "c030"),
            "0302" => ("10de", "2330"),
            _ => ("15b3", "1021"),
        };
        tree.device(&chain, vendor, device, &d.class, d.numa, link);
        match &d.class[..4] {
            "0302" => gpus.push(d.chain.last().unwrap().clone()),
            "0207" => {
                tree.rdma(&chain, &format!("mlx5_{nics}"));
                nics += 1;
            }
            _ => {}
        }
    }
    (tree, gpus)
}

/// The fake NVML machine of the H100 capture, on the bus ids of `gpus`.
pub fn on_bus_ids(text: &str, gpus: &[String]) -> String {
    let mut n = 0;
    text.lines()
        .map(|l| {
            if l.starts_with("bus_id ") {
                n += 1;
                format!("bus_id 0000{}", gpus[n - 1].to_ascii_uppercase())
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}
