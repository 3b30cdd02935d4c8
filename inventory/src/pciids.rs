//! Names for PCI vendor, device, subsystem and class codes from a pci.ids database.
//!
//! kiln ships a snapshot (`inventory/data/pci.ids`, 2025-07, which knows H100, H200, B200 and
//! ConnectX-7) and uses the system's file instead where that one is newer. Lookups scan only the
//! vendor's block, found through an index of vendor lines built once per process.

use std::borrow::Cow;
use std::io::Read;
use std::sync::OnceLock;

static SHIPPED: &str = include_str!("../data/pci.ids");
const SYSTEM_PATHS: [&str; 3] = ["/usr/share/hwdata/pci.ids", "/usr/share/misc/pci.ids", "/usr/share/pci.ids"];

include!("pciids_index.rs");

mod shipped_index {
    include!(concat!(env!("OUT_DIR"), "/pci_ids_index.rs"));
}

pub struct PciIds {
    text: Cow<'static, str>,
    /// Database version ("2025.07.11"), from its header.
    pub version: String,
    pub source: String,
    /// Each vendor's id and the offset of its line, sorted by id.
    vendors: Cow<'static, [(u16, usize)]>,
    /// Every device line: little-endian `(vendor << 16 | device, offset)` u32 pairs, sorted.
    devices: Cow<'static, [u8]>,
    /// Where the class list ("C 00  ...") begins.
    classes: usize,
}

/// The `#<TAB>Version: 2025.07.11` line of a pci.ids file.
pub fn version_of(text: &str) -> Option<String> {
    text.lines().take(40).find_map(|l| l.strip_prefix("#\tVersion:").map(|v| v.trim().to_string()))
}

impl PciIds {
    /// Indexes a pci.ids file read at run time (a system file newer than the shipped one).
    pub fn parse(text: Cow<'static, str>, source: String) -> PciIds {
        let index = index_pci_ids(&text);
        let version = version_of(&text).unwrap_or_else(|| "unknown".to_string());
        let devices = index.devices.iter().flat_map(|(k, o)| [k.to_le_bytes(), o.to_le_bytes()]).flatten().collect();
        PciIds {
            text,
            version,
            source,
            vendors: Cow::Owned(index.vendors),
            devices: Cow::Owned(devices),
            classes: index.classes,
        }
    }

    /// The shipped database, indexed at build time.
    pub fn shipped() -> PciIds {
        PciIds {
            text: Cow::Borrowed(SHIPPED),
            version: version_of(SHIPPED).unwrap_or_default(),
            source: "shipped".to_string(),
            vendors: Cow::Borrowed(shipped_index::SHIPPED_VENDORS),
            devices: Cow::Borrowed(shipped_index::SHIPPED_DEVICES),
            classes: shipped_index::SHIPPED_CLASSES,
        }
    }

    /// The shipped database, or the system's when it is newer. Built once per process.
    pub fn get() -> &'static PciIds {
        static IDS: OnceLock<PciIds> = OnceLock::new();
        IDS.get_or_init(|| {
            let shipped_version = version_of(SHIPPED).unwrap_or_default();
            for path in SYSTEM_PATHS {
                // The version is in the header: read 4 KiB, and the whole file only if it is newer.
                let Ok(mut file) = std::fs::File::open(path) else { continue };
                let mut head = vec![0u8; 4096];
                let n = file.read(&mut head).unwrap_or(0);
                let newer = version_of(&String::from_utf8_lossy(&head[..n])).is_some_and(|v| v > shipped_version);
                if newer {
                    if let Ok(text) = std::fs::read_to_string(path) {
                        return PciIds::parse(Cow::Owned(text), path.to_string());
                    }
                }
                break;
            }
            PciIds::shipped()
        })
    }

    /// A vendor's lines: from its own line to the next vendor's (the index knows both).
    fn vendor_block(&self, vendor: u16) -> Option<&str> {
        let at = self.vendors.binary_search_by_key(&vendor, |v| v.0).ok()?;
        let start = self.vendors[at].1;
        let end = self.vendors.get(at + 1).map_or(self.classes, |v| v.1).min(self.text.len());
        self.text.get(start..end)
    }

    /// The offset of a device's line, by binary search of the device index.
    fn device_line(&self, vendor: u16, device: u16) -> Option<usize> {
        let key = (vendor as u32) << 16 | device as u32;
        let entry = |i: usize| {
            let b = &self.devices[i * 8..i * 8 + 8];
            (u32::from_le_bytes([b[0], b[1], b[2], b[3]]), u32::from_le_bytes([b[4], b[5], b[6], b[7]]))
        };
        let (mut lo, mut hi) = (0, self.devices.len() / 8);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let (k, offset) = entry(mid);
            match k.cmp(&key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(offset as usize),
            }
        }
        None
    }

    /// The line starting at `offset`, without its newline.
    fn line_at(&self, offset: usize) -> Option<&str> {
        let rest = self.text.get(offset..)?;
        Some(rest.split('\n').next().unwrap_or(rest))
    }

    pub fn vendor(&self, vendor: u16) -> Option<&str> {
        let block = self.vendor_block(vendor)?;
        let line = block.lines().next()?;
        line.get(6..).map(str::trim)
    }

    pub fn device(&self, vendor: u16, device: u16) -> Option<&str> {
        self.line_at(self.device_line(vendor, device)?)?.get(7..).map(str::trim)
    }

    pub fn subsystem(&self, vendor: u16, device: u16, sub_vendor: u16, sub_device: u16) -> Option<&str> {
        let start = self.device_line(vendor, device)?;
        let key = format!("{sub_vendor:04x} {sub_device:04x}  ");
        // The device's subsystem lines follow it, each starting with two tabs (comments between).
        self.text[start..]
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with("\t\t") || l.starts_with('#'))
            .find_map(|l| l.strip_prefix("\t\t")?.strip_prefix(key.as_str()))
            .map(str::trim)
    }

    /// The names of a class code: the subclass's (else the class's), and the programming
    /// interface's where pci.ids names it ("Normal decode", "NVM Express").
    pub fn class(&self, class: u8, subclass: u8, prog_if: u8) -> (Option<&str>, Option<&str>) {
        let mut lines = self.text.get(self.classes..).unwrap_or("").lines();
        let class_key = format!("C {class:02x}  ");
        let Some(class_name) = lines.by_ref().find_map(|l| l.strip_prefix(class_key.as_str())) else {
            return (None, None);
        };
        let sub_key = format!("\t{subclass:02x}  ");
        let prog_key = format!("\t\t{prog_if:02x}  ");
        let mut sub_name = None;
        for line in lines {
            if line.starts_with("C ") {
                break;
            }
            if line.starts_with("\t\t") {
                if sub_name.is_some() {
                    if let Some(n) = line.strip_prefix(prog_key.as_str()) {
                        return (sub_name, Some(n.trim()));
                    }
                }
            } else if sub_name.is_some() {
                break;
            } else if let Some(n) = line.strip_prefix(sub_key.as_str()) {
                sub_name = Some(n.trim());
            }
        }
        (sub_name.or(Some(class_name.trim())), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_time_index_matches_a_run_time_parse() {
        let built = PciIds::shipped();
        let parsed = PciIds::parse(Cow::Borrowed(SHIPPED), "parsed".into());
        assert_eq!(built.vendors, parsed.vendors);
        assert_eq!(built.devices, parsed.devices);
        assert!(built.devices.len() / 8 > 19_000);
        assert_eq!(built.classes, parsed.classes);
        assert!(built.vendors.len() > 2000);
    }

    fn shipped() -> PciIds {
        PciIds::shipped()
    }

    #[test]
    fn knows_current_datacenter_parts() {
        let ids = shipped();
        assert_eq!(ids.vendor(0x10de), Some("NVIDIA Corporation"));
        assert_eq!(ids.device(0x10de, 0x2330), Some("GH100 [H100 SXM5 80GB]"));
        assert_eq!(ids.device(0x10de, 0x2335), Some("GH100 [H200 SXM 141GB]"));
        assert_eq!(ids.device(0x10de, 0x2901), Some("GB100 [B200]"));
        assert_eq!(ids.device(0x10de, 0x22a3), Some("GH100 [H100 NVSwitch]"));
        assert!(ids.device(0x15b3, 0x1021).unwrap().contains("ConnectX-7"));
        assert_eq!(ids.subsystem(0x10de, 0x2484, 0x10de, 0x14ae), Some("GA104 [GeForce RTX 3070 16GB]"));
        assert_eq!(ids.subsystem(0x10de, 0x2484, 0x10de, 0x0001), None);
        assert_eq!(ids.device(0x10de, 0xffff), None);
        assert_eq!(ids.vendor(0x0002), None);
        assert!(ids.version.as_str() >= "2025.07.11");
    }

    #[test]
    fn class_names() {
        let ids = shipped();
        assert_eq!(ids.class(0x03, 0x02, 0x00), (Some("3D controller"), None));
        assert_eq!(ids.class(0x01, 0x08, 0x02), (Some("Non-Volatile memory controller"), Some("NVM Express")));
        // A bridge's subclass is what it is; "Normal decode" is only how it decodes.
        assert_eq!(ids.class(0x06, 0x04, 0x00), (Some("PCI bridge"), Some("Normal decode")));
        assert_eq!(ids.class(0x0c, 0x03, 0x00), (Some("USB controller"), Some("UHCI")));
        assert_eq!(ids.class(0x02, 0x07, 0x00), (Some("Infiniband controller"), None));
        // An unknown subclass falls back to its class's name.
        assert_eq!(ids.class(0x02, 0x7f, 0x00), (Some("Network controller"), None));
        assert_eq!(ids.class(0xfe, 0x00, 0x00), (None, None));
    }
}
