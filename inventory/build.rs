//! Indexes the shipped pci.ids at build time: the offset of every vendor line, of every device
//! line and of the class section, so that a name lookup at run time is a binary search.

use std::fmt::Write;

include!("src/pciids_index.rs");

fn main() {
    let path = "data/pci.ids";
    println!("cargo:rerun-if-changed={path}");
    println!("cargo:rerun-if-changed=src/pciids_index.rs");
    let text = std::fs::read_to_string(path).expect("data/pci.ids");
    let index = index_pci_ids(&text);
    let mut vendors = String::new();
    for (id, offset) in &index.vendors {
        let _ = write!(vendors, "(0x{id:04x}, {offset}),");
    }
    // The device index as little-endian (key, offset) u32 pairs, included as bytes: 20,000
    // entries as Rust source would slow every build of the crate.
    let devices: Vec<u8> =
        index.devices.iter().flat_map(|(k, o)| [k.to_le_bytes(), o.to_le_bytes()]).flatten().collect();
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).to_path_buf();
    std::fs::write(out.join("pci_ids_devices.bin"), devices).unwrap();
    std::fs::write(
        out.join("pci_ids_index.rs"),
        format!(
            "pub static SHIPPED_VENDORS: &[(u16, usize)] = &[{vendors}];\npub const SHIPPED_CLASSES: usize = {};\n\
             pub static SHIPPED_DEVICES: &[u8] = include_bytes!(concat!(env!(\"OUT_DIR\"), \"/pci_ids_devices.bin\"));\n",
            index.classes
        ),
    )
    .unwrap();
}
