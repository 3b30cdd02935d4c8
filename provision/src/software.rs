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
