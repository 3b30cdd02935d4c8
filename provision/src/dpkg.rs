//! The dpkg status database (`<root>/var/lib/dpkg/status`): which packages are installed, at
//! which versions. One read answers every "is X at version Y" question a plan needs.

use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Package {
    pub name: String,
    pub version: String,
    pub architecture: Option<String>,
    /// Selected `hold` (`dpkg --set-selections`, `apt-mark hold`): apt will not move it.
    pub hold: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DpkgError {
    #[error("{path}: {source}")]
    Read { path: String, source: std::io::Error },
}

/// Parses the status file; only packages whose status is `install ok installed` count.
pub fn parse_status(text: &str) -> BTreeMap<String, Package> {
    let mut out = BTreeMap::new();
    for stanza in text.split("\n\n") {
        let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
        for line in stanza.lines() {
            if line.starts_with(' ') || line.starts_with('\t') {
                continue; // continuation of a multi-line field (Description, Conffiles)
            }
            if let Some((key, value)) = line.split_once(':') {
                fields.insert(key.trim(), value.trim());
            }
        }
        let (Some(name), Some(version), Some(status)) =
            (fields.get("Package"), fields.get("Version"), fields.get("Status"))
        else {
            continue;
        };
        // "install ok installed", "hold ok installed": the third word is the package's state.
        if status.split_whitespace().nth(2) != Some("installed") {
            continue;
        }
        let arch = fields.get("Architecture").map(|a| a.to_string());
        // Multi-arch packages appear once per architecture; the key keeps them apart.
        let key = match &arch {
            Some(a) if out.contains_key(*name) && a != "all" => format!("{name}:{a}"),
            _ => name.to_string(),
        };
        let hold = status.split_whitespace().next() == Some("hold");
        out.insert(key, Package { name: name.to_string(), version: version.to_string(), architecture: arch, hold });
    }
    out
}

/// Reads the installed packages below `root`; an absent database (not a Debian system) is empty.
pub fn installed(root: &Path) -> Result<BTreeMap<String, Package>, DpkgError> {
    let path = root.join("var/lib/dpkg/status");
    match std::fs::read(&path) {
        Ok(bytes) => Ok(parse_status(&String::from_utf8_lossy(&bytes))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(source) => Err(DpkgError::Read { path: path.display().to_string(), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_file() {
        let text = "Package: nvidia-driver-550\nStatus: install ok installed\nArchitecture: amd64\nVersion: 550.127.05-0ubuntu1\nDescription: x\n more\n\n\
                    Package: removed\nStatus: deinstall ok config-files\nVersion: 1\n\n\
                    Package: libnccl2\nStatus: hold ok installed\nVersion: 2.21.5-1+cuda12.4\n";
        let pkgs = parse_status(text);
        assert_eq!(pkgs.len(), 2);
        assert_eq!(pkgs["nvidia-driver-550"].version, "550.127.05-0ubuntu1");
        assert_eq!(pkgs["libnccl2"].version, "2.21.5-1+cuda12.4");
        assert!(!pkgs.contains_key("removed"));
        assert!(pkgs["libnccl2"].hold && !pkgs["nvidia-driver-550"].hold);
    }
}
