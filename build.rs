//! Indexes the shipped pci.ids at build time: the offset of every vendor line and of the class
//! section, so that a name lookup at run time touches only the vendor's own block.

use std::fmt::Write;

fn main() {
    let path = "agent/data/pci.ids";
    println!("cargo:rerun-if-changed={path}");
    let text = std::fs::read_to_string(path).expect("agent/data/pci.ids");
    let mut vendors = String::new();
    let mut classes = text.len();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let b = line.as_bytes();
        if line.starts_with("C ") {
            classes = classes.min(offset);
        } else if b.len() > 6 && b[4] == b' ' && b[5] == b' ' && b[..4].iter().all(u8::is_ascii_hexdigit) {
            let _ = write!(vendors, "(0x{}, {offset}),", &line[..4]);
        }
        offset += line.len();
    }
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("pci_ids_index.rs");
    std::fs::write(
        out,
        format!("pub static SHIPPED_VENDORS: &[(u16, usize)] = &[{vendors}];\npub const SHIPPED_CLASSES: usize = {classes};\n"),
    )
    .unwrap();
}
