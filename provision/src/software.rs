//! The software fingerprint of a machine (or root): what every benchmark run records, so that two
//! runs on different stacks are never compared as like with like.
//!
//! Read from the dpkg database (one read), the running kernel and driver (live only), the images
//! kiln applied (their markers) and the Python frameworks in those images' venvs.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::dpkg;
use crate::plan::{venv_distributions, Target, MARKER_DIR};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Software {
    pub kernel: Option<String>,
    /// The loaded module's version on a live machine, else the installed driver package's.
    pub nvidia_driver: Option<String>,
    pub fabric_manager: Option<String>,
    pub cuda: Option<String>,
    pub nccl: Option<String>,
    pub cudnn: Option<String>,
    /// venv path → framework → version (torch, jax, tensorflow, numpy…).
    pub python: BTreeMap<String, BTreeMap<String, String>>,
    /// The images kiln applied here.
    pub images: Vec<AppliedImage>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedImage {
    pub image: String,
    pub version: String,
    pub hash: String,
    pub applied_at: String,
    #[serde(default)]
    pub venvs: Vec<String>,
}

const FRAMEWORKS: &[&str] =
    &["torch", "jax", "jaxlib", "tensorflow", "numpy", "triton", "transformers", "deepspeed", "flash-attn", "vllm"];

pub fn read(target: &Target) -> Result<Software, dpkg::DpkgError> {
    let pkgs = dpkg::installed(&target.root)?;
    let version_of = |pred: &dyn Fn(&str) -> bool| {
        pkgs.values()
            .filter(|p| pred(&p.name))
            .map(|p| p.version.clone())
            .max_by(|a, b| crate::lint::compare_dotted(crate::lint::upstream(a), crate::lint::upstream(b)))
    };
    let kernel = if target.live() {
        std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string())
    } else {
        None
    };
    let loaded_driver = if target.live() {
        std::fs::read_to_string("/sys/module/nvidia/version").ok().map(|s| s.trim().to_string())
    } else {
        None
    };
    let nvidia_driver = loaded_driver.or_else(|| {
        version_of(&|n| {
            n.starts_with("nvidia-driver")
                || n.starts_with("nvidia-open")
                || n == "cuda-drivers"
                || n.starts_with("nvidia-kernel-open")
        })
        .map(|v| crate::lint::upstream(&v).to_string())
    });
    let cuda = pkgs
        .values()
        .filter_map(|p| p.name.strip_prefix("cuda-toolkit-").map(|v| (v.replace('-', "."), p.version.clone())))
        .filter(|(v, _)| v.contains('.'))
        .max_by(|a, b| crate::lint::compare_dotted(&a.1, &b.1))
        .map(|(_, version)| crate::lint::upstream(&version).to_string())
        .or_else(|| cuda_json(&target.path("/usr/local/cuda/version.json")));
    let images = read_markers(target);
    let mut python = BTreeMap::new();
    for venv in images.iter().flat_map(|i| i.venvs.iter()) {
        if let Some(dists) = venv_distributions(&target.path(venv)) {
            let found: BTreeMap<String, String> =
                dists.into_iter().filter(|(n, _)| FRAMEWORKS.contains(&n.as_str())).collect();
            python.insert(venv.clone(), found);
        }
    }
    Ok(Software {
        kernel,
        nvidia_driver,
        fabric_manager: version_of(&|n| {
            n.starts_with("nvidia-fabricmanager") || n.starts_with("cuda-drivers-fabricmanager")
        })
        .map(|v| crate::lint::upstream(&v).to_string()),
        cuda,
        nccl: pkgs.get("libnccl2").map(|p| p.version.clone()),
        cudnn: version_of(&|n| (n.starts_with("libcudnn") || n.starts_with("cudnn")) && n.contains("-cuda-")),
        python,
        images,
    })
}

/// Where the stack differs from what the images kiln applied pin — the harness check before a
/// commission's benchmarks: each package an applied image pins (its apt preferences, written by
/// `kiln provision apply`) at a version the pin does not allow, or missing; and a loaded NVIDIA
/// kernel module other than the pinned driver (installed, not yet rebooted into). In words, one
/// line each.
pub fn pin_faults(target: &Target) -> Vec<String> {
    let pkgs = dpkg::installed(&target.root).unwrap_or_default();
    let loaded = std::fs::read_to_string(target.path("/sys/module/nvidia/version")).ok().map(|s| s.trim().to_string());
    let mut faults = Vec::new();
    for image in read_markers(target) {
        let Ok(text) = std::fs::read_to_string(target.path(&crate::plan::preferences_path(&image.image))) else {
            continue;
        };
        for (package, pin) in pins_of(&text) {
            match pkgs.get(&package) {
                None => faults.push(format!("{package} is not installed where image {} pins {pin}", image.image)),
                Some(p) if !crate::plan::glob_match(&pin, &p.version) => {
                    faults.push(format!("{package} {} is installed where image {} pins {pin}", p.version, image.image));
                }
                Some(_) => {}
            }
            let driver = package.starts_with("nvidia-open") || package.starts_with("nvidia-driver");
            if let (true, Some(loaded)) = (driver, &loaded) {
                let wanted = crate::lint::upstream(pin.trim_end_matches('*').trim_end_matches('-'));
                if !loaded.starts_with(wanted) {
                    faults.push(format!(
                        "the loaded NVIDIA driver is {loaded} where image {} pins {wanted}: reboot into the installed driver",
                        image.image
                    ));
                }
            }
        }
    }
    faults
}

/// (package, version pattern) of each stanza of an apt preferences file.
fn pins_of(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for stanza in text.split("\n\n") {
        let field = |key: &str| stanza.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_string());
        if let (Some(package), Some(pin)) = (field("Package:"), field("Pin:")) {
            if let Some(version) = pin.strip_prefix("version ") {
                out.push((package, version.trim().to_string()));
            }
        }
    }
    out
}

/// `/usr/local/cuda/version.json`: `{"cuda": {"version": "12.8.1"}}`.
fn cuda_json(path: &Path) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    v.get("cuda")?.get("version")?.as_str().map(str::to_string)
}

pub fn read_markers(target: &Target) -> Vec<AppliedImage> {
    let mut out: Vec<AppliedImage> = std::fs::read_dir(target.path(MARKER_DIR))
        .map(|d| d.flatten().filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()).collect())
        .unwrap_or_default();
    out.sort_by(|a, b| a.image.cmp(&b.image));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root where image "gpu" was applied: its marker, its apt pins, dpkg's status and the
    /// loaded driver module.
    fn root(nccl: &str, loaded: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let write = |path: &str, text: &str| {
            let p = dir.path().join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write(
            &format!("{MARKER_DIR}/gpu.json"),
            r#"{"image":"gpu","version":"1","hash":"h","applied_at":"2026-12-01T00:00:00Z"}"#,
        );
        write(
            &crate::plan::preferences_path("gpu"),
            "Package: nvidia-open-580\nPin: version 580.95.05-*\nPin-Priority: 1001\n\nPackage: libnccl2\nPin: version 2.27.7-1+cuda13.0\nPin-Priority: 1001\n\nPackage: cuda-toolkit-13-0\nPin: version 13.0.2-*\nPin-Priority: 1001\n",
        );
        let status = |name: &str, version: &str| {
            format!("Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\n")
        };
        let mut text = vec![status("nvidia-open-580", "580.95.05-1"), status("libnccl2", nccl)];
        text.push(status("cuda-toolkit-13-0", "13.0.2-1"));
        write("/var/lib/dpkg/status", &text.join("\n"));
        write("/sys/module/nvidia/version", &format!("{loaded}\n"));
        dir
    }

    #[test]
    fn the_stack_the_images_pin_is_a_harness_check() {
        let ok = root("2.27.7-1+cuda13.0", "580.95.05");
        assert_eq!(pin_faults(&Target::new(ok.path())), Vec::<String>::new());
        let wrong = root("2.26.2-1+cuda12.8", "570.86.15");
        assert_eq!(
            pin_faults(&Target::new(wrong.path())),
            [
                "the loaded NVIDIA driver is 570.86.15 where image gpu pins 580.95.05: reboot into the installed driver",
                "libnccl2 2.26.2-1+cuda12.8 is installed where image gpu pins 2.27.7-1+cuda13.0",
            ]
        );
        // No image applied: nothing to compare with.
        let bare = tempfile::tempdir().unwrap();
        assert!(pin_faults(&Target::new(bare.path())).is_empty());
    }
}
