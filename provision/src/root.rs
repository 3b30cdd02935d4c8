//! Paths below a root directory taken as `/`: how kiln keeps `--root DIR` a boundary. Every
//! symbolic link on the way is followed as the system booted from DIR would follow it — an
//! absolute target starts again at DIR, `..` stops at DIR — so no path leaves it.

use std::path::{Component, Path, PathBuf};

/// How many symbolic links one path may cross, as the kernel's own limit.
const MAX_LINKS: usize = 40;

/// `rel` below `root` with every symbolic link followed inside `root`. A loop, or more than 40
/// links, stops where it is (the open that follows then fails).
pub fn resolve_in_root(root: &Path, rel: &Path) -> PathBuf {
    let mut done = PathBuf::new(); // below the root, never with `..`
    let mut todo: Vec<std::ffi::OsString> =
        rel.components().rev().filter(|c| *c != Component::RootDir).map(|c| c.as_os_str().to_owned()).collect();
    let mut links = 0;
    while let Some(part) = todo.pop() {
        match part.to_str() {
            Some(".") => {}
            Some("..") => {
                done.pop();
            }
            _ => match std::fs::read_link(root.join(&done).join(&part)) {
                Ok(target) if links < MAX_LINKS => {
                    links += 1;
                    if target.is_absolute() {
                        done.clear();
                    }
                    todo.extend(
                        target
                            .components()
                            .rev()
                            .filter(|c| *c != Component::RootDir)
                            .map(|c| c.as_os_str().to_owned()),
                    );
                }
                _ => done.push(&part),
            },
        }
    }
    root.join(done)
}

/// `rel` below `root` with its directories resolved inside `root` and its last component left as
/// it is (so that a link there is replaced or read as a link, never followed out).
pub fn parent_in_root(root: &Path, rel: &Path) -> PathBuf {
    match (rel.parent(), rel.file_name()) {
        (Some(parent), Some(name)) => resolve_in_root(root, parent).join(name),
        _ => resolve_in_root(root, rel),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_stay_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("/usr/lib", root.join("lib")).unwrap();
        std::os::unix::fs::symlink("/", root.join("usr/up")).unwrap();
        std::os::unix::fs::symlink("../../../../../../etc", root.join("usr/climb")).unwrap();
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        let r = |p: &str| resolve_in_root(&root, Path::new(p));
        assert_eq!(r("/lib/x.so"), root.join("usr/lib/x.so"), "an absolute link starts at the root");
        assert_eq!(r("usr/up/etc/passwd"), root.join("etc/passwd"));
        assert_eq!(r("usr/climb/shadow"), root.join("etc/shadow"), ".. stops at the root");
        assert_eq!(r("../../etc/shadow"), root.join("etc/shadow"));
        assert!(r("loop/x").starts_with(&root), "a loop stays inside too");
        assert_eq!(parent_in_root(&root, Path::new("lib")), root.join("lib"), "the last link is left as it is");
        assert_eq!(parent_in_root(&root, Path::new("lib/x")), root.join("usr/lib/x"));
    }
}
