// Indexing a pci.ids text, shared by `build.rs` (the shipped file, at build time) and
// `pciids.rs` (a newer system file, at run time) through `include!`.

/// Where things are in a pci.ids text.
pub struct PciIdsIndex {
    /// The offset of every vendor line, sorted by vendor id.
    pub vendors: Vec<(u16, usize)>,
    /// The offset of every device line, keyed `vendor << 16 | device`, sorted by key: a device
    /// name is one binary search away (Intel's block alone is 250 KB of text).
    pub devices: Vec<(u32, u32)>,
    /// Where the class list ("C 00  ...") begins.
    pub classes: usize,
}

pub fn index_pci_ids(text: &str) -> PciIdsIndex {
    let mut vendors = Vec::new();
    let mut devices = Vec::new();
    let mut classes = text.len();
    let mut vendor: Option<u16> = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let b = line.as_bytes();
        if line.starts_with("C ") {
            classes = classes.min(offset);
            vendor = None;
        } else if b.len() > 6 && b[4] == b' ' && b[5] == b' ' {
            vendor = u16::from_str_radix(&line[..4], 16).ok();
            if let Some(id) = vendor {
                vendors.push((id, offset));
            }
        } else if b.len() > 7 && b[0] == b'\t' && b[5] == b' ' && b[6] == b' ' && offset < classes {
            if let (Some(v), Ok(d)) = (vendor, u16::from_str_radix(&line[1..5], 16)) {
                devices.push(((v as u32) << 16 | d as u32, offset as u32));
            }
        }
        offset += line.len();
    }
    vendors.sort_by_key(|v| v.0);
    vendors.dedup_by_key(|v| v.0);
    devices.sort_by_key(|d| d.0);
    devices.dedup_by_key(|d| d.0);
    PciIdsIndex { vendors, devices, classes }
}
