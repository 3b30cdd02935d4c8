//! The consistency of an NVIDIA stack's pins, checked from the spec alone (no machine needed):
//!
//! - the driver uses the open kernel modules, and is pinned;
//! - the driver branch is at least what the CUDA toolkit needs, and at least what a CUDA build of
//!   PyTorch in a venv needs;
//! - fabric manager is pinned to exactly the driver's version;
//! - kernel headers follow the running kernel (`linux-headers-${kernel_release}`);
//! - NCCL is built for the toolkit's CUDA version, cuDNN for its major version, and every NVIDIA
//!   package is pinned to an exact version.
//!
//! Package names are those of NVIDIA's CUDA apt repository and of Ubuntu.

use std::sync::LazyLock;

use regex::Regex;

use crate::image::{split_requirement, Image, SourceText, SpecError};
use toml::Spanned;

/// Minimum Linux driver for each CUDA toolkit release (the "Toolkit Driver Version" table of the
/// CUDA release notes).
pub const CUDA_MIN_DRIVER: &[(u32, u32, &str)] = &[
    (11, 8, "520.61.05"),
    (12, 0, "525.60.13"),
    (12, 1, "530.30.02"),
    (12, 2, "535.54.03"),
    (12, 3, "545.23.06"),
    (12, 4, "550.54.14"),
    (12, 5, "555.42.02"),
    (12, 6, "560.28.03"),
    (12, 8, "570.26"),
    (12, 9, "575.51.03"),
    (13, 0, "580.65.06"),
];

pub fn cuda_min_driver(major: u32, minor: u32) -> Option<&'static str> {
    CUDA_MIN_DRIVER.iter().find(|(a, b, _)| (*a, *b) == (major, minor)).map(|(_, _, v)| *v)
}

/// The upstream part of a Debian version: no epoch, no revision (`1:570.133.20-1ubuntu1` → `570.133.20`).
pub fn upstream(version: &str) -> &str {
    let v = version.split_once(':').map_or(version, |(_, v)| v);
    v.rsplit_once('-').map_or(v, |(u, _)| u)
}

/// Compares dotted numeric versions (`570.133.20` vs `570.26`); non-numeric parts compare as 0.
pub fn compare_dotted(a: &str, b: &str) -> std::cmp::Ordering {
    let parse = |s: &str| s.split('.').map(|p| p.parse::<u64>().unwrap_or(0)).collect::<Vec<_>>();
    let (a, b) = (parse(a), parse(b));
    for i in 0..a.len().max(b.len()) {
        let o = a.get(i).unwrap_or(&0).cmp(b.get(i).unwrap_or(&0));
        if o.is_ne() {
            return o;
        }
    }
    std::cmp::Ordering::Equal
}

fn exact(v: &str) -> bool {
    !v.contains('*') && !v.contains('?')
}

/// The upstream version a pin fixes: `570.133.20-1` and `570.133.20-*` (any packaging revision)
/// both fix `570.133.20`; `570.*` fixes none.
pub fn pinned_upstream(v: &str) -> Option<&str> {
    let v = v.split_once(':').map_or(v, |(_, v)| v);
    let up = v.rsplit_once('-').map_or(v, |(u, _)| u);
    exact(up).then_some(up)
}

struct Driver<'a> {
    name: &'a Spanned<String>,
    version: &'a Spanned<String>,
    branch: Option<u32>,
}

type Packages = std::collections::BTreeMap<Spanned<String>, Spanned<String>>;

fn pattern(re: &str) -> Regex {
    Regex::new(re).expect("static regex")
}

static DRIVER_NAMED: LazyLock<Regex> =
    LazyLock::new(|| pattern(r"^(?:nvidia-driver|nvidia-open|cuda-drivers)-(\d+)(?:-open|-server-open|-server)?$"));
static DRIVER_BARE: LazyLock<Regex> = LazyLock::new(|| pattern(r"^(?:nvidia-driver|nvidia-open|cuda-drivers)$"));
static FABRIC: LazyLock<Regex> =
    LazyLock::new(|| pattern(r"^(?:nvidia-fabricmanager|cuda-drivers-fabricmanager)(?:-(\d+))?$"));
static TOOLKIT: LazyLock<Regex> = LazyLock::new(|| pattern(r"^cuda-(?:toolkit-)?(\d+)-(\d+)$"));
static CUDNN: LazyLock<Regex> = LazyLock::new(|| pattern(r"^(?:lib)?cudnn(\d+)-cuda-(\d+)$"));
static NCCL: LazyLock<Regex> = LazyLock::new(|| pattern(r"^libnccl(?:2|-dev)$"));
static NCCL_CUDA: LazyLock<Regex> = LazyLock::new(|| pattern(r"\+cuda(\d+)\.(\d+)$"));
static TORCH_CU: LazyLock<Regex> = LazyLock::new(|| pattern(r"\+cu(\d+)(\d)$"));

/// Lints one image; an empty result means consistent.
pub fn lint(image: &Image) -> Vec<SpecError> {
    let src = image.source();
    let pkgs = &image.spec.apt.packages;
    let mut out = Vec::new();

    let mut drivers = Vec::new();
    for (name, version) in pkgs {
        let n = name.get_ref();
        if let Some(c) = DRIVER_NAMED.captures(n) {
            drivers.push(Driver { name, version, branch: c[1].parse().ok() });
        } else if DRIVER_BARE.is_match(n) {
            let branch = upstream(version.get_ref()).split('.').next().and_then(|b| b.parse().ok());
            drivers.push(Driver { name, version, branch });
        }
    }
    let nvidia_pkgs = pkgs.keys().any(|n| {
        let n = n.get_ref();
        n.starts_with("nvidia-") || n.starts_with("cuda-") || n.starts_with("libnccl") || n.contains("cudnn")
    });
    let driver = drivers.first();
    if drivers.len() > 1 {
        out.push(src.error(
            drivers[1].name,
            format!("a second driver package; {} is already the driver", drivers[0].name.get_ref()),
        ));
    }

    let driver_version = lint_driver(image, &src, driver, nvidia_pkgs, &mut out);
    lint_fabric(&src, pkgs, driver, &mut out);
    let cuda = lint_toolkit(&src, pkgs, driver, driver_version, &mut out);
    lint_nccl(&src, pkgs, cuda, &mut out);
    lint_cudnn(&src, pkgs, cuda, &mut out);
    lint_headers(&src, pkgs, &mut out);
    lint_torch(image, &src, driver, driver_version, &mut out);
    out.sort_by_key(|e| (e.line, e.column));
    out.dedup();
    out
}

/// The driver: pinned, open, branch consistent with its version; returns its pinned upstream version.
fn lint_driver<'a>(
    image: &Image,
    src: &SourceText,
    driver: Option<&Driver<'a>>,
    nvidia_pkgs: bool,
    out: &mut Vec<SpecError>,
) -> Option<&'a str> {
    let mut driver_version: Option<&'a str> = None;
    if let Some(d) = driver {
        let v = d.version.get_ref();
        if v == "*" {
            out.push(src.error(
                d.version,
                format!("pin {} to a driver version (\"570.133.20-1\" or \"570.133.*\")", d.name.get_ref()),
            ));
        } else {
            let up = upstream(v);
            if let Some(b) = d.branch {
                if !up.starts_with(&format!("{b}.")) && up != b.to_string() {
                    out.push(src.error(
                        d.version,
                        format!("version {v} is not of the {b} branch that {} names", d.name.get_ref()),
                    ));
                }
            }
            driver_version = pinned_upstream(v);
        }
        let open =
            image.spec.apt.packages.keys().any(|n| n.get_ref().starts_with("nvidia-") && n.get_ref().contains("open"));
        if !open {
            out.push(src.error(d.name, format!("{} is the proprietary kernel module: use the open kernel modules ({}-open, nvidia-open or nvidia-kernel-open-dkms), which Hopper and Blackwell need", d.name.get_ref(), d.name.get_ref())));
        }
    } else if image.spec.matches.as_ref().and_then(|m| m.gpu.as_ref()).is_some_and(|g| g.get_ref() == "nvidia")
        && nvidia_pkgs
    {
        if let Some((first, _)) = image
            .spec
            .apt
            .packages
            .iter()
            .find(|(n, _)| n.get_ref().starts_with("cuda-") || n.get_ref().starts_with("nvidia-"))
        {
            out.push(src.error(
                first,
                "an NVIDIA stack without a driver package: add the driver (nvidia-open or nvidia-driver-<branch>-open)",
            ));
        }
    }
    driver_version
}

/// Fabric manager = driver, exactly.
fn lint_fabric(src: &SourceText, pkgs: &Packages, driver: Option<&Driver>, out: &mut Vec<SpecError>) {
    for (name, version) in pkgs.iter().filter(|(n, _)| FABRIC.is_match(n.get_ref())) {
        let Some(d) = driver else {
            out.push(src.error(name, "fabric manager without a driver: pin the driver it must equal"));
            continue;
        };
        if let Some(b) =
            FABRIC.captures(name.get_ref()).and_then(|c| c.get(1)).and_then(|m| m.as_str().parse::<u32>().ok())
        {
            if d.branch.is_some_and(|db| db != b) {
                out.push(src.error(
                    name,
                    format!("fabric manager branch {b} differs from the driver branch {}", d.branch.unwrap()),
                ));
                continue;
            }
        }
        let (fv, dv) = (version.get_ref(), d.version.get_ref());
        let same = match (pinned_upstream(fv), pinned_upstream(dv)) {
            (Some(f), Some(d)) => f == d,
            _ => fv == dv,
        };
        if !same {
            out.push(src.error(
                version,
                format!("fabric manager {fv} must equal the driver version ({} = {dv})", d.name.get_ref()),
            ));
        }
    }
}

/// CUDA toolkit → minimum driver; returns the toolkit's (major, minor).
fn lint_toolkit(
    src: &SourceText,
    pkgs: &Packages,
    driver: Option<&Driver>,
    driver_version: Option<&str>,
    out: &mut Vec<SpecError>,
) -> Option<(u32, u32)> {
    let mut cuda: Option<(u32, u32)> = None;
    for (name, version) in pkgs {
        let Some(c) = TOOLKIT.captures(name.get_ref()) else { continue };
        let (major, minor): (u32, u32) = (c[1].parse().unwrap_or(0), c[2].parse().unwrap_or(0));
        cuda = Some((major, minor));
        if pinned_upstream(version.get_ref()).is_none() {
            out.push(src.error(version, format!("pin {} to an exact version", name.get_ref())));
        }
        match cuda_min_driver(major, minor) {
            None => out.push(src.error(
                name,
                format!("CUDA {major}.{minor} is not in kiln's table of minimum drivers (lint::CUDA_MIN_DRIVER)"),
            )),
            Some(min) => check_driver(out, src, driver, driver_version, min, &format!("CUDA {major}.{minor}")),
        }
    }
    cuda
}

/// NCCL built for this CUDA; both NCCL packages at one version.
fn lint_nccl(src: &SourceText, pkgs: &Packages, cuda: Option<(u32, u32)>, out: &mut Vec<SpecError>) {
    let mut nccl_version: Option<&Spanned<String>> = None;
    for (name, version) in pkgs.iter().filter(|(n, _)| NCCL.is_match(n.get_ref())) {
        let v = version.get_ref();
        if !exact(v) {
            out.push(
                src.error(
                    version,
                    format!("pin {} to an exact version, such as \"2.26.2-1+cuda12.8\"", name.get_ref()),
                ),
            );
            continue;
        }
        if let Some(prev) = nccl_version {
            if prev.get_ref() != v {
                out.push(src.error(
                    version,
                    format!("{} {v} differs from the other NCCL package's {}", name.get_ref(), prev.get_ref()),
                ));
            }
        }
        nccl_version = Some(version);
        match (NCCL_CUDA.captures(v), cuda) {
            (Some(c), Some((major, minor))) => {
                let built: (u32, u32) = (c[1].parse().unwrap_or(0), c[2].parse().unwrap_or(0));
                if built != (major, minor) {
                    out.push(src.error(
                        version,
                        format!(
                            "{} {v} is built for CUDA {}.{}, but the toolkit is CUDA {major}.{minor}",
                            name.get_ref(),
                            built.0,
                            built.1
                        ),
                    ));
                }
            }
            (None, _) => out.push(src.error(
                version,
                format!("{} {v} does not say which CUDA it is built for (\"+cudaX.Y\")", name.get_ref()),
            )),
            _ => {}
        }
    }
}

/// cuDNN for this CUDA major.
fn lint_cudnn(src: &SourceText, pkgs: &Packages, cuda: Option<(u32, u32)>, out: &mut Vec<SpecError>) {
    for (name, version) in pkgs {
        let Some(c) = CUDNN.captures(name.get_ref()) else { continue };
        let built: u32 = c[2].parse().unwrap_or(0);
        if let Some((major, _)) = cuda {
            if built != major {
                out.push(src.error(
                    name,
                    format!("{} is built for CUDA {built}, but the toolkit is CUDA {major}", name.get_ref()),
                ));
            }
        }
        if pinned_upstream(version.get_ref()).is_none() {
            out.push(src.error(version, format!("pin {} to an exact version", name.get_ref())));
        }
    }
}

/// Headers follow the running kernel.
fn lint_headers(src: &SourceText, pkgs: &Packages, out: &mut Vec<SpecError>) {
    for name in pkgs.keys() {
        let n = name.get_ref();
        if n.starts_with("linux-headers-") && !n.contains("${kernel_release}") {
            out.push(src.error(name, format!("{n} does not follow the running kernel: use \"linux-headers-${{kernel_release}}\" so that DKMS builds the driver for the kernel that boots")));
        }
    }
}

/// A CUDA build of PyTorch needs its CUDA's driver.
fn lint_torch(
    image: &Image,
    src: &SourceText,
    driver: Option<&Driver>,
    driver_version: Option<&str>,
    out: &mut Vec<SpecError>,
) {
    for v in &image.spec.venvs {
        for req in &v.get_ref().packages {
            let Some((name, version)) = split_requirement(req.get_ref()) else { continue };
            if !name.eq_ignore_ascii_case("torch") {
                continue;
            }
            let Some(c) = TORCH_CU.captures(version) else { continue };
            let (major, minor): (u32, u32) = (c[1].parse().unwrap_or(0), c[2].parse().unwrap_or(0));
            match cuda_min_driver(major, minor) {
                Some(min) => check_driver(
                    out,
                    src,
                    driver,
                    driver_version,
                    min,
                    &format!("torch {version} (CUDA {major}.{minor})"),
                ),
                None => out.push(src.error(
                    req,
                    format!("CUDA {major}.{minor} of torch {version} is not in kiln's table of minimum drivers"),
                )),
            }
            if driver.is_none() {
                out.push(
                    src.error(req, format!("torch {version} needs an NVIDIA driver, which this image does not pin")),
                );
            }
        }
    }
}

fn check_driver(
    out: &mut Vec<SpecError>,
    src: &SourceText,
    driver: Option<&Driver>,
    driver_version: Option<&str>,
    min: &str,
    what: &str,
) {
    let Some(d) = driver else { return };
    let min_branch: u32 = min.split('.').next().and_then(|b| b.parse().ok()).unwrap_or(0);
    let too_old = match (driver_version, d.branch) {
        (Some(v), _) => compare_dotted(v, min).is_lt(),
        (None, Some(b)) => b < min_branch,
        (None, None) => false,
    };
    if too_old {
        let have = driver_version.map(str::to_string).or(d.branch.map(|b| format!("branch {b}"))).unwrap_or_default();
        out.push(src.error(d.version, format!("driver {have} is older than {what} needs (>= {min})")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(upstream("1:570.133.20-1ubuntu1"), "570.133.20");
        assert_eq!(upstream("570.133.20"), "570.133.20");
        assert!(compare_dotted("570.133.20", "570.26").is_gt());
        assert!(compare_dotted("565.57.01", "570.26").is_lt());
        assert_eq!(cuda_min_driver(12, 8), Some("570.26"));
        assert_eq!(pinned_upstream("570.133.20-*"), Some("570.133.20"));
        assert_eq!(pinned_upstream("1:570.133.20-0ubuntu1"), Some("570.133.20"));
        assert_eq!(pinned_upstream("570.*"), None);
    }
}
