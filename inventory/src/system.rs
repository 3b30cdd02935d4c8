//! The system, board, chassis and BIOS as DMI describes them (`/sys/class/dmi/id`).

use std::io;

use serde::{Deserialize, Serialize};

use super::source::{ProblemKind, Source};

const DMI_ID: &str = "sys/class/dmi/id";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Product {
    pub vendor: Option<String>,
    pub name: Option<String>,
    pub version: Option<String>,
    pub serial: Option<String>,
    pub uuid: Option<String>,
    pub sku: Option<String>,
    pub family: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Board {
    pub vendor: Option<String>,
    pub name: Option<String>,
    pub version: Option<String>,
    pub serial: Option<String>,
    pub asset_tag: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chassis {
    pub vendor: Option<String>,
    /// The SMBIOS chassis type code and its name ("Rack Mount Chassis").
    pub type_code: Option<u8>,
    pub type_name: Option<String>,
    pub version: Option<String>,
    pub serial: Option<String>,
    pub asset_tag: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bios {
    pub vendor: Option<String>,
    pub version: Option<String>,
    pub date: Option<String>,
    pub release: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct System {
    pub product: Product,
    pub board: Board,
    pub chassis: Chassis,
    pub bios: Bios,
    /// DMI fields present but readable only by root (serials and UUID, typically).
    pub root_only: Vec<String>,
}

pub fn chassis_type_name(code: u8) -> Option<&'static str> {
    const NAMES: [&str; 36] = [
        "Other",
        "Unknown",
        "Desktop",
        "Low Profile Desktop",
        "Pizza Box",
        "Mini Tower",
        "Tower",
        "Portable",
        "Laptop",
        "Notebook",
        "Hand Held",
        "Docking Station",
        "All in One",
        "Sub Notebook",
        "Space-saving",
        "Lunch Box",
        "Main Server Chassis",
        "Expansion Chassis",
        "SubChassis",
        "Bus Expansion Chassis",
        "Peripheral Chassis",
        "RAID Chassis",
        "Rack Mount Chassis",
        "Sealed-case PC",
        "Multi-system chassis",
        "Compact PCI",
        "Advanced TCA",
        "Blade",
        "Blade Enclosure",
        "Tablet",
        "Convertible",
        "Detachable",
        "IoT Gateway",
        "Embedded PC",
        "Mini PC",
        "Stick PC",
    ];
    NAMES.get(usize::from(code).checked_sub(1)?).copied()
}

pub fn collect(src: &Source) -> System {
    let mut system = System::default();
    if !src.exists(DMI_ID) {
        // Arm and s390 machines often have no DMI at all; that is a fact, and a problem entry says so.
        src.problem(DMI_ID, ProblemKind::NotPresent, "no DMI: system, board and BIOS identity unknown");
        return system;
    }
    let mut root_only = Vec::new();
    let mut field = |name: &str| -> Option<String> {
        let rel = format!("{DMI_ID}/{name}");
        match src.open(&rel).and_then(|mut f| std::io::Read::read(&mut f, &mut [0u8; 1])) {
            // Attributes are one line; a snapshot may carry stale bytes after it.
            Ok(_) => {
                src.attr(&rel).and_then(|v| v.lines().next().map(|l| l.trim().to_string())).filter(|v| !v.is_empty())
            }
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                root_only.push(name.to_string());
                src.problem(&rel, ProblemKind::PermissionDenied, "readable by root only");
                None
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                src.problem(&rel, ProblemKind::Unreadable, e.to_string());
                None
            }
        }
    };
    system.product = Product {
        vendor: field("sys_vendor"),
        name: field("product_name"),
        version: field("product_version"),
        serial: field("product_serial"),
        uuid: field("product_uuid"),
        sku: field("product_sku"),
        family: field("product_family"),
    };
    system.board = Board {
        vendor: field("board_vendor"),
        name: field("board_name"),
        version: field("board_version"),
        serial: field("board_serial"),
        asset_tag: field("board_asset_tag"),
    };
    let type_code = field("chassis_type").and_then(|t| t.parse::<u8>().ok());
    system.chassis = Chassis {
        vendor: field("chassis_vendor"),
        type_code,
        type_name: type_code.and_then(chassis_type_name).map(str::to_string),
        version: field("chassis_version"),
        serial: field("chassis_serial"),
        asset_tag: field("chassis_asset_tag"),
    };
    system.bios = Bios {
        vendor: field("bios_vendor"),
        version: field("bios_version"),
        date: field("bios_date"),
        release: field("bios_release"),
    };
    system.root_only = root_only;
    system
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chassis_types() {
        assert_eq!(chassis_type_name(23), Some("Rack Mount Chassis"));
        assert_eq!(chassis_type_name(17), Some("Main Server Chassis"));
        assert_eq!(chassis_type_name(0), None);
        assert_eq!(chassis_type_name(200), None);
    }
}
