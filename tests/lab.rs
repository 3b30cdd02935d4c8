//! A throwaway provisioning lab, shared by the provisioning tests and the plan benchmark: a root
//! that looks like Debian 12, a flat apt repository of `.deb` packages built here with dpkg-deb,
//! and pure-Python wheels built without any build backend.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

pub struct Lab {
    pub dir: tempfile::TempDir,
}

impl Lab {
    pub fn new() -> Lab {
        let lab = Lab { dir: tempfile::tempdir().unwrap() };
        let root = lab.root();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/os-release"), "ID=debian\nVERSION_ID=\"12\"\nPRETTY_NAME=\"kiln test root\"\n")
            .unwrap();
        std::fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nkilnsvc:x:4242:4243::/nonexistent:/bin/false\n",
        )
        .unwrap();
        std::fs::write(root.join("etc/group"), "root:x:0:\nkilnsvc:x:4243:\n").unwrap();
        std::fs::create_dir_all(lab.repo()).unwrap();
        lab
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    pub fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }
    pub fn db(&self) -> PathBuf {
        self.dir.path().join("kiln.db")
    }
    pub fn spec(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&p, text.replace("@REPO@", self.repo().to_str().unwrap())).unwrap();
        p
    }
    /// `dpkg-query` on the lab's root: package → (version, status abbreviation).
    pub fn installed(&self) -> Vec<(String, String, String)> {
        let out = Command::new("dpkg-query")
            .arg(format!("--admindir={}", self.root().join("var/lib/dpkg").display()))
            .args(["-W", "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n"])
            .output()
            .expect("dpkg-query");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                (f[0].to_string(), f[1].to_string(), f[2].trim().to_string())
            })
            .collect()
    }

    /// Builds a `.deb` into the repository: `files` are (absolute path, content).
    pub fn deb(&self, name: &str, version: &str, depends: Option<&str>, files: &[(&str, &str)]) {
        let staging = self.dir.path().join(format!("build-{name}-{version}"));
        std::fs::create_dir_all(staging.join("DEBIAN")).unwrap();
        let mut control = format!("Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: kiln tests <tests@kiln.invalid>\nDescription: kiln test package\n");
        if let Some(d) = depends {
            control += &format!("Depends: {d}\n");
        }
        std::fs::write(staging.join("DEBIAN/control"), control).unwrap();
        for (path, content) in files {
            let p = staging.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        let deb = self.repo().join(format!("{name}_{version}_all.deb"));
        let out = Command::new("dpkg-deb")
            .args(["--root-owner-group", "-b"])
            .arg(&staging)
            .arg(&deb)
            .output()
            .expect("dpkg-deb (package dpkg) is needed");
        assert!(out.status.success(), "dpkg-deb: {}", String::from_utf8_lossy(&out.stderr));
        self.publish();
    }

    /// Writes the flat repository's `Packages` index, as dpkg-scanpackages would.
    pub fn publish(&self) {
        let mut index = String::new();
        let mut debs: Vec<PathBuf> = std::fs::read_dir(self.repo())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "deb"))
            .collect();
        debs.sort();
        for deb in debs {
            let control = Command::new("dpkg-deb").arg("-f").arg(&deb).output().unwrap();
            let bytes = std::fs::read(&deb).unwrap();
            let sha: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
            index += String::from_utf8_lossy(&control.stdout).trim_end();
            index += &format!(
                "\nFilename: ./{}\nSize: {}\nSHA256: {sha}\n\n",
                deb.file_name().unwrap().to_string_lossy(),
                bytes.len()
            );
        }
        std::fs::write(self.repo().join("Packages"), index).unwrap();
    }
}

impl Lab {
    fn gpg(&self) -> Command {
        let home = self.path().join("gnupg");
        if !home.exists() {
            std::fs::create_dir_all(&home).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let mut c = Command::new("gpg");
        c.arg("--batch").arg("--quiet").arg("--homedir").arg(home);
        c
    }

    /// A new signing key in the lab's own GnuPG home; returns its fingerprint and exports it
    /// (armored) to `keys/<name>.asc` beside the specs.
    pub fn signing_key(&self, name: &str) -> String {
        let uid = format!("{name} <{name}@kiln.invalid>");
        let out = self
            .gpg()
            .args(["--passphrase", "", "--quick-generate-key", &uid, "ed25519", "sign", "never"])
            .output()
            .expect("gpg is needed");
        assert!(out.status.success(), "gpg: {}", String::from_utf8_lossy(&out.stderr));
        let list = self.gpg().args(["--with-colons", "--list-keys", &uid]).output().unwrap();
        let text = String::from_utf8_lossy(&list.stdout);
        let fpr = text
            .lines()
            .find(|l| l.starts_with("fpr:"))
            .and_then(|l| l.split(':').nth(9))
            .expect("a fingerprint")
            .to_string();
        let keys = self.path().join("keys");
        std::fs::create_dir_all(&keys).unwrap();
        let armored = self.gpg().args(["--armor", "--export", &fpr]).output().unwrap();
        std::fs::write(keys.join(format!("{name}.asc")), armored.stdout).unwrap();
        fpr
    }

    /// Signs the repository's index with key `fingerprint`: `Release` with the index's hash, and
    /// `InRelease`, its clear-signed form, which apt checks against the source's Signed-By.
    pub fn sign_repo(&self, fingerprint: &str) {
        let packages = std::fs::read(self.repo().join("Packages")).unwrap();
        let sha: String = Sha256::digest(&packages).iter().map(|b| format!("{b:02x}")).collect();
        let release = format!("Origin: kiln-tests\nLabel: kiln-tests\nSHA256:\n {sha} {} Packages\n", packages.len());
        std::fs::write(self.repo().join("Release"), release).unwrap();
        let out = self
            .gpg()
            .args(["--yes", "--local-user", fingerprint, "--clearsign", "-o"])
            .arg(self.repo().join("InRelease"))
            .arg(self.repo().join("Release"))
            .output()
            .unwrap();
        assert!(out.status.success(), "signing: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// A pure-Python wheel, built without any build backend: a wheel is a zip with metadata.
pub fn wheel(dir: &Path, name: &str, version: &str) -> String {
    let script = r#"
import base64, hashlib, sys, zipfile
name, version, out = sys.argv[1:4]
dist = f"{name}-{version}"
files = {
    f"{name}/__init__.py": f"VERSION = '{version}'\n",
    f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: kiln-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
path = f"{out}/{dist}-py3-none-any.whl"
with zipfile.ZipFile(path, "w") as z:
    for p, content in files.items():
        data = content.encode()
        z.writestr(p, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{p},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    z.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
print(hashlib.sha256(open(path, "rb").read()).hexdigest())
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args([name, version])
        .arg(dir)
        .output()
        .expect("python3 is needed");
    assert!(out.status.success(), "building a wheel: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
