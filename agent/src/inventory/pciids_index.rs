// Indexing a pci.ids text, shared by `build.rs` (the shipped file, at build time) and
// `pciids.rs` (a newer system file, at run time) through `include!`.

/// The offset of every vendor line, sorted by vendor id, and where the class section starts.
pub fn index_pci_ids(text: &str) -> (Vec<(u16, usize)>, usize) {
    let mut vendors = Vec::new();
    let mut classes = text.len();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let b = line.as_bytes();
        if line.starts_with("C ") {
            classes = classes.min(offset);
        } else if b.len() > 6 && b[4] == b' ' && b[5] == b' ' {
            if let Ok(id) = u16::from_str_radix(&line[..4], 16) {
                vendors.push((id, offset));
            }
        }
        offset += line.len();
    }
    vendors.sort_by_key(|v| v.0);
    vendors.dedup_by_key(|v| v.0);
    (vendors, classes)
}
