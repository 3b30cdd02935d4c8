//! GPU XID events from the kernel log since boot (`NVRM: Xid (PCI:0000:1b:00): 79, pid=…, …`),
//! classified from NVIDIA's XID catalogue. On the live system the log is the kernel's ring buffer,
//! read as `dmesg` reads it (root, or `kernel.dmesg_restrict=0`); a snapshot may carry it as `dmesg.txt` at its top (`dmesg >
//! dmesg.txt`). Where neither can be read, `error` says why and verdicts skip the XID check.

use serde::{Deserialize, Serialize};

use super::source::Source;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelLog {
    /// Where the log was read from; `None` when it could not be.
    pub source: Option<String>,
    pub error: Option<String>,
    pub xids: Vec<XidEvent>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidEvent {
    /// The GPU's PCI address as the driver prints it ("0000:1b:00").
    pub pci: String,
    pub xid: u32,
    /// The rest of the line, for a person.
    pub text: String,
}

/// NVIDIA's XID catalogue (the XID Errors document of the driver): the events a commissioning
/// technician acts on, with their names. Unknown XIDs are reported by number.
pub const XID_CATALOGUE: &[(u32, &str)] = &[
    (13, "graphics engine exception"),
    (31, "GPU memory page fault"),
    (32, "invalid or corrupted push buffer stream"),
    (38, "driver firmware error"),
    (43, "GPU stopped processing"),
    (45, "preemptive cleanup, due to previous errors"),
    (48, "double-bit ECC error"),
    (61, "internal micro-controller breakpoint/warning"),
    (62, "internal micro-controller halt"),
    (63, "ECC page retirement or row remapping recording event"),
    (64, "ECC page retirement or row remapper recording failure"),
    (68, "NVDEC0 exception"),
    (69, "graphics engine class error"),
    (74, "NVLink error"),
    (79, "GPU has fallen off the bus"),
    (92, "high single-bit ECC error rate"),
    (94, "contained ECC error"),
    (95, "uncontained ECC error"),
    (109, "context switch timeout"),
    (119, "GSP RPC timeout"),
    (120, "GSP error"),
    (121, "C2C link corrected error"),
    (122, "SPI PMU RPC read failure"),
    (123, "SPI PMU RPC write failure"),
    (140, "unrecovered ECC error"),
    (143, "GPU initialisation failure"),
    (149, "NVLink fatal error (NETIR)"),
    (154, "GPU recovery action changed"),
];

pub fn xid_name(xid: u32) -> &'static str {
    XID_CATALOGUE.iter().find(|(x, _)| *x == xid).map_or("not in kiln's catalogue", |(_, n)| n)
}

/// The XID events in kernel log text (dmesg or /dev/kmsg records).
pub fn parse_xids(text: &str) -> Vec<XidEvent> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(at) = line.find("NVRM: Xid (") else { continue };
        let rest = &line[at + "NVRM: Xid (".len()..];
        let Some((pci, rest)) = rest.split_once("):") else { continue };
        let pci = pci.trim_start_matches("PCI:").trim().to_string();
        let rest = rest.trim_start();
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(xid) = digits.parse() else { continue };
        let text: String = rest[digits.len()..].trim_start_matches(',').trim().chars().take(240).collect();
        out.push(XidEvent { pci, xid, text });
    }
    out
}

/// Reads the kernel log of the system below `src`, where it can hold XIDs: only the NVIDIA driver
/// writes them, so without an NVIDIA GPU on the PCI bus the log is not read (formatting a long
/// log costs the kernel more than the rest of the inventory).
pub fn collect(src: &Source, pci_gpus: &[String]) -> KernelLog {
    if pci_gpus.is_empty() {
        return KernelLog {
            source: None,
            error: Some("not read: no NVIDIA GPU on the PCI bus, so no XID to look for".into()),
            xids: Vec::new(),
        };
    }
    if src.is_live() {
        return match read_log() {
            Ok(text) => KernelLog { source: Some("syslog(2)".into()), error: None, xids: parse_xids(&text) },
            Err(e) => KernelLog {
                source: None,
                error: Some(format!(
                    "the kernel log (syslog(2)): {e}{}",
                    if e.kind() == std::io::ErrorKind::PermissionDenied { " (needs root)" } else { "" }
                )),
                xids: Vec::new(),
            },
        };
    }
    match src.read_optional("dmesg.txt") {
        Some(text) => KernelLog { source: Some("dmesg.txt".into()), error: None, xids: parse_xids(&text) },
        None => KernelLog {
            source: None,
            error: Some("the snapshot holds no dmesg.txt (the kernel log)".into()),
            xids: Vec::new(),
        },
    }
}

/// The kernel log of the live system, one message per line: the whole ring buffer in one
/// `syslog(2)` call (`SYSLOG_ACTION_READ_ALL`, what `dmesg` does), not a `read` per record from
/// `/dev/kmsg` (a long-running server holds thousands of records).
///
/// # Errors
/// The log cannot be read: it needs root (`CAP_SYSLOG`) unless `kernel.dmesg_restrict=0`.
pub fn read_log() -> std::io::Result<String> {
    const SYSLOG_ACTION_READ_ALL: libc::c_int = 3;
    const SYSLOG_ACTION_SIZE_BUFFER: libc::c_int = 10;
    // SAFETY: SIZE_BUFFER takes no buffer (null, length 0) and only returns a number.
    let size = unsafe { libc::klogctl(SYSLOG_ACTION_SIZE_BUFFER, std::ptr::null_mut(), 0) };
    if size < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut buf = vec![0u8; (size as usize).clamp(4096, 64 << 20)];
    let len = libc::c_int::try_from(buf.len()).unwrap_or(libc::c_int::MAX);
    // SAFETY: the kernel writes at most `len` bytes into `buf`, which is `len` bytes long.
    let n = unsafe { libc::klogctl(SYSLOG_ACTION_READ_ALL, buf.as_mut_ptr().cast(), len) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    // "<6>[  12.345678] message": the priority prefix is the kernel's, not the message's.
    let text = String::from_utf8_lossy(&buf);
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let line = if line.starts_with('<') { line.split_once('>').map_or(line, |(_, rest)| rest) } else { line };
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xid_lines_parse() {
        let log = "[  12.3] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15\n\
                   [ 812.1] NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n\
                   [ 900.0] NVRM: Xid (PCI:0000:43:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1).\n\
                   [ 901.0] NVRM: Xid (PCI:0000:43:00): garbage\n";
        let x = parse_xids(log);
        assert_eq!(x.len(), 2);
        assert_eq!((x[0].pci.as_str(), x[0].xid), ("0000:1b:00", 79));
        assert!(x[0].text.starts_with("pid=1234"));
        assert_eq!((x[1].pci.as_str(), x[1].xid), ("0000:43:00", 94));
        assert_eq!(xid_name(79), "GPU has fallen off the bus");
    }
}

/// Property: every XID line the driver writes is found with its GPU and number, whatever the text
/// around it.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn xid_lines_are_found(domain in 0u32..0x10000, bus in 0u32..256, dev in 0u32..32, xid in 0u32..1000,
                               prefix in "[ -~]{0,40}", tail in "[ -~]{0,80}", noise in "[ -~]{0,80}") {
            prop_assume!(!prefix.contains("NVRM: Xid (") && !noise.contains("NVRM: Xid ("));
            let pci = format!("{domain:04x}:{bus:02x}:{dev:02x}");
            let log = format!("{noise}\n{prefix}NVRM: Xid (PCI:{pci}): {xid}, {tail}\n{noise}\n");
            let found = super::parse_xids(&log);
            prop_assert_eq!(found.len(), 1);
            prop_assert_eq!(&found[0].pci, &pci);
            prop_assert_eq!(found[0].xid, xid);
        }
    }
}
