//! SMBIOS memory devices (type 17), parsed from the raw DMI table (`/sys/firmware/dmi/tables/DMI`)
//! or the per-structure `entries/17-*/raw` files. Both are root-only on a live machine.

use serde::{Deserialize, Serialize};

/// One memory slot. An empty slot is a slot, not a DIMM: `populated` is false and `size_bytes` is `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dimm {
    pub locator: Option<String>,
    pub bank_locator: Option<String>,
    pub populated: bool,
    pub size_bytes: Option<u64>,
    pub memory_type: Option<String>,
    pub form_factor: Option<String>,
    pub speed_mts: Option<u32>,
    pub configured_speed_mts: Option<u32>,
    pub manufacturer: Option<String>,
    pub part_number: Option<String>,
    pub serial: Option<String>,
    pub rank: Option<u8>,
    pub data_width_bits: Option<u16>,
}

/// A structure's formatted area and its strings.
struct Structure<'a> {
    kind: u8,
    data: &'a [u8],
    strings: Vec<&'a [u8]>,
}

/// Splits a DMI table (or a single entry) into structures; stops quietly at a truncated one.
fn structures(mut table: &[u8]) -> Vec<Structure<'_>> {
    let mut out = Vec::new();
    while table.len() >= 4 {
        let kind = table[0];
        let len = table[1] as usize;
        if len < 4 || len > table.len() {
            break;
        }
        let data = &table[..len];
        // Strings follow the formatted area, each NUL-terminated, the set ended by a second NUL.
        let mut rest = &table[len..];
        let mut strings = Vec::new();
        let mut consumed = len;
        if rest.len() >= 2 && rest[0] == 0 && rest[1] == 0 {
            consumed += 2;
        } else {
            loop {
                let Some(end) = rest.iter().position(|&b| b == 0) else {
                    consumed = table.len();
                    break;
                };
                strings.push(&rest[..end]);
                consumed += end + 1;
                rest = &rest[end + 1..];
                if rest.first() == Some(&0) {
                    consumed += 1;
                    break;
                }
                if rest.is_empty() {
                    break;
                }
            }
        }
        out.push(Structure { kind, data, strings });
        if kind == 127 {
            break; // end-of-table
        }
        table = &table[consumed.min(table.len())..];
    }
    out
}

impl Structure<'_> {
    fn byte(&self, off: usize) -> Option<u8> {
        self.data.get(off).copied()
    }
    fn word(&self, off: usize) -> Option<u16> {
        Some(u16::from_le_bytes([*self.data.get(off)?, *self.data.get(off + 1)?]))
    }
    fn dword(&self, off: usize) -> Option<u32> {
        let b = self.data.get(off..off + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A string by its 1-based index; blank and placeholder-free trimming, lossy UTF-8.
    fn string(&self, off: usize) -> Option<String> {
        let idx = self.byte(off)? as usize;
        let raw = self.strings.get(idx.checked_sub(1)?)?;
        let text = String::from_utf8_lossy(raw).trim().to_string();
        (!text.is_empty()).then_some(text)
    }
}

fn memory_type_name(code: u8) -> Option<&'static str> {
    Some(match code {
        0x01 => "Other",
        0x03 => "DRAM",
        0x07 => "RAM",
        0x0f => "SDRAM",
        0x12 => "DDR",
        0x13 => "DDR2",
        0x14 => "DDR2 FB-DIMM",
        0x18 => "DDR3",
        0x1a => "DDR4",
        0x1b => "LPDDR",
        0x1c => "LPDDR2",
        0x1d => "LPDDR3",
        0x1e => "LPDDR4",
        0x1f => "Logical non-volatile device",
        0x20 => "HBM",
        0x21 => "HBM2",
        0x22 => "DDR5",
        0x23 => "LPDDR5",
        0x24 => "HBM3",
        _ => return None,
    })
}

fn form_factor_name(code: u8) -> Option<&'static str> {
    Some(match code {
        0x01 => "Other",
        0x03 => "SIMM",
        0x04 => "SIP",
        0x05 => "Chip",
        0x06 => "DIP",
        0x07 => "ZIP",
        0x08 => "Proprietary Card",
        0x09 => "DIMM",
        0x0a => "TSOP",
        0x0b => "Row of chips",
        0x0c => "RIMM",
        0x0d => "SODIMM",
        0x0e => "SRIMM",
        0x0f => "FB-DIMM",
        0x10 => "Die",
        0x11 => "CAMM",
        _ => return None,
    })
}

/// Placeholder strings vendors leave in unset fields.
pub fn is_placeholder(value: &str) -> bool {
    let v = value.trim().trim_matches('"').to_ascii_lowercase();
    v.is_empty()
        || v.starts_with("to be filled")
        || v == "not specified"
        || v == "unknown"
        || v == "default string"
        || v == "none"
        || v == "n/a"
        || v == "0"
        || v.starts_with("no dimm")
        || v.chars().all(|c| c == '0' || c == 'x' || c == 'f')
}

fn memory_device(s: &Structure<'_>) -> Dimm {
    let size_bytes = match s.word(0x0c) {
        None | Some(0) | Some(0xffff) => None,
        Some(0x7fff) => s.dword(0x1c).map(|mb| u64::from(mb & 0x7fff_ffff) << 20),
        Some(v) if v & 0x8000 != 0 => Some(u64::from(v & 0x7fff) << 10),
        Some(v) => Some(u64::from(v) << 20),
    };
    let speed = |short: usize, ext: usize| match s.word(short) {
        Some(0) | None => None,
        Some(0xffff) => s.dword(ext).filter(|&v| v != 0),
        Some(v) => Some(u32::from(v)),
    };
    let populated = size_bytes.is_some();
    let keep = |v: Option<String>| v.filter(|v| populated && !is_placeholder(v));
    Dimm {
        locator: s.string(0x10),
        bank_locator: s.string(0x11),
        populated,
        size_bytes,
        memory_type: s.byte(0x12).and_then(memory_type_name).map(str::to_string),
        form_factor: s.byte(0x0e).and_then(form_factor_name).map(str::to_string),
        speed_mts: if populated { speed(0x15, 0x54) } else { None },
        configured_speed_mts: if populated { speed(0x20, 0x58) } else { None },
        manufacturer: keep(s.string(0x17)),
        serial: keep(s.string(0x18)),
        part_number: keep(s.string(0x1a)),
        rank: s.byte(0x1b).map(|a| a & 0x0f).filter(|&r| r != 0 && populated),
        data_width_bits: s.word(0x0a).filter(|&w| w != 0 && w != 0xffff && populated),
    }
}

/// Parses every memory device (type 17) in a DMI table or a concatenation of entries.
pub fn parse_memory_devices(table: &[u8]) -> Vec<Dimm> {
    structures(table).iter().filter(|s| s.kind == 17 && s.data.len() >= 0x15).map(memory_device).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real entry (`17-0/raw`) from the hwloc snapshot `32em64t-2n8c+dax+nvme+mic+dimms`.
    const DIMM_A1: &[u8] = b"\x11\x22\x00\x11\x00\x10\xfe\xff\x48\x00\x40\x00\x00\x10\x09\x01\
\x01\x00\x18\x80\x20\x40\x06\x02\x03\x04\x05\x02\x00\x00\x00\x00\
\x40\x06DIMM_A1 \x0000AD04B300AD\x0048AAE639\x0001115021\x00HMT351R7CFR8C-PB  \x00\x00";

    #[test]
    fn real_dimm() {
        let dimms = parse_memory_devices(DIMM_A1);
        assert_eq!(dimms.len(), 1);
        let d = &dimms[0];
        assert_eq!(d.locator.as_deref(), Some("DIMM_A1"));
        assert_eq!(d.size_bytes, Some(4 << 30));
        assert_eq!(d.memory_type.as_deref(), Some("DDR3"));
        assert_eq!(d.form_factor.as_deref(), Some("DIMM"));
        assert_eq!(d.speed_mts, Some(1600));
        assert_eq!(d.configured_speed_mts, Some(1600));
        assert_eq!(d.serial.as_deref(), Some("48AAE639"));
        assert_eq!(d.part_number.as_deref(), Some("HMT351R7CFR8C-PB"));
        assert_eq!(d.rank, Some(2));
    }

    #[test]
    fn truncated_and_garbage_tables_do_not_panic() {
        for cut in 0..DIMM_A1.len() {
            let _ = parse_memory_devices(&DIMM_A1[..cut]);
        }
        let _ = parse_memory_devices(&[17, 0xff, 0, 0, 1, 2, 3]);
        let _ = parse_memory_devices(&[17, 2, 0, 0]);
    }

    #[test]
    fn placeholders() {
        assert!(is_placeholder("To be filled by O.E.M."));
        assert!(is_placeholder("\"To Be Filled By O.E.M.\""));
        assert!(is_placeholder("00000000"));
        assert!(!is_placeholder("48AAE639"));
    }
}
