//! Indexes the shipped pci.ids at build time: the offset of every vendor line and of the class
//! section, so that a name lookup at run time touches only the vendor's own block.

use std::fmt::Write;

include!("agent/src/inventory/pciids_index.rs");

fn main() {
    let path = "agent/data/pci.ids";
    println!("cargo:rerun-if-changed={path}");
    println!("cargo:rerun-if-changed=agent/src/inventory/pciids_index.rs");
    let text = std::fs::read_to_string(path).expect("agent/data/pci.ids");
    let (index, classes) = index_pci_ids(&text);
    let mut vendors = String::new();
    for (id, offset) in index {
        let _ = write!(vendors, "(0x{id:04x}, {offset}),");
    }
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("pci_ids_index.rs");
    std::fs::write(
        out,
        format!("pub static SHIPPED_VENDORS: &[(u16, usize)] = &[{vendors}];\npub const SHIPPED_CLASSES: usize = {classes};\n"),
    )
    .unwrap();
}
