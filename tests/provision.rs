//! `kiln provision` with the real tools and no network: `.deb` packages built here with dpkg-deb and
//! published in a local file repository, applied into a throwaway root with the real apt and dpkg;
//! a real virtualenv filled from wheels built here; an apply killed mid-step and resumed; broken
//! specs and inconsistent NVIDIA pins with the exact messages they must produce.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::lab::{wheel, Lab};
use crate::util::{self, kiln, Run};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Applying needs root (dpkg chowns files) and Debian's packaging tools, plus what `extra` names;
/// CI runs as root with all of them. Elsewhere these tests say what they skipped and stop.
fn need_root(test: &str, extra: &[Option<String>]) -> bool {
    let mut missing = vec![
        util::root("applying packages chowns files"),
        util::program("dpkg-deb", "dpkg"),
        util::program("apt-get", "apt"),
    ];
    missing.extend(extra.iter().cloned());
    util::needs(test, &missing.into_iter().flatten().collect::<Vec<_>>())
}

/// python3 with its venv module, for the virtualenv tests.
fn python_venv() -> Option<String> {
    let ok = Command::new("python3").args(["-c", "import venv, ensurepip"]).output().is_ok_and(|o| o.status.success());
    (!ok).then(|| "python3 with venv and ensurepip (Debian packages python3, python3-venv)".to_string())
}

/// The lab driven through the `kiln` binary, with the lab's database.
trait Provision {
    fn provision(&self, verb: &str, spec: &Path, extra: &[&str]) -> Run;
    fn log(&self) -> Vec<Value>;
    fn journal(&self, apply: &str) -> Value;
}

impl Provision for Lab {
    /// `kiln provision <verb> <spec> --root <root>` with this lab's database.
    fn provision(&self, verb: &str, spec: &Path, extra: &[&str]) -> Run {
        let root = self.root();
        let mut args = vec!["provision", verb, spec.to_str().unwrap(), "--root", root.to_str().unwrap()];
        args.extend_from_slice(extra);
        kiln(&args, &[("KILN_DB", &self.db())])
    }
    fn log(&self) -> Vec<Value> {
        let out = kiln(&["provision", "log", "--json"], &[("KILN_DB", &self.db())]).success().json();
        out["applies"].as_array().unwrap().clone()
    }
    fn journal(&self, apply: &str) -> Value {
        kiln(&["provision", "log", "--apply", apply, "--json"], &[("KILN_DB", &self.db())]).success().json()
    }
}

fn step_keys(plan: &Value) -> Vec<String> {
    plan["steps"].as_array().unwrap().iter().map(|s| s["key"].as_str().unwrap().to_string()).collect()
}

const APT_SPEC: &str = r#"
[image]
name = "lab-apt"
version = "1"

[match]
os = ["debian 12"]

[[apt.repository]]
name = "lab"
uri = "file:@REPO@"
suite = "./"
trusted = true

[apt]
packages = { kiln-hello = "@HELLO@", kiln-tool = "*" }
hold = ["kiln-hello"]

[[file]]
path = "/etc/kiln-lab/app.conf"
content = "threads = 8\n"
mode = "0640"
owner = "kilnsvc"
group = "kilnsvc"

[[module]]
name = "nvidia_peermem"
options = { peerdirect_support = 1 }

[sysctl]
"vm.max_map_count" = 1048576

[[command]]
name = "index"
run = ["touch", "${root}/var/lib/kiln-lab-indexed"]
creates = "/var/lib/kiln-lab-indexed"

[[check]]
name = "hello version"
run = ["cat", "${root}/usr/share/kiln-hello/version"]
contains = "@HELLO_SHOWS@"
"#;

fn apt_spec(lab: &Lab, hello: &str, shows: &str) -> PathBuf {
    lab.spec("lab-apt", &APT_SPEC.replace("@HELLO@", hello).replace("@HELLO_SHOWS@", shows))
}

// Long: one scenario on one throwaway root, each step building on the state the last one left
// (install, apply again, drift, verify, upgrade); split, the state would travel between tests.
#[test]
fn apt_install_idempotence_drift_verify_and_upgrade() {
    if !need_root("apt_install_idempotence_drift_verify_and_upgrade", &[]) {
        return;
    }
    let lab = Lab::new();
    for v in ["1.0", "2.0"] {
        lab.deb("kiln-hello", v, None, &[("/usr/share/kiln-hello/version", &format!("{v}\n"))]);
    }
    lab.deb("kiln-tool", "0.3", Some("kiln-hello"), &[("/usr/share/kiln-tool/README", "tool\n")]);
    let spec = apt_spec(&lab, "1.0", "1.0");
    let root = lab.root();

    // The plan of an empty root, in order; a dry run changes nothing.
    let plan = lab.provision("plan", &spec, &["--json"]).success().json();
    assert_eq!(
        step_keys(&plan),
        [
            "apt:skeleton",
            "file:/etc/apt/sources.list.d/kiln-lab.sources",
            "file:/etc/apt/preferences.d/kiln-lab-apt.pref",
            "apt:update",
            "apt:install",
            "apt:hold",
            "file:/etc/kiln-lab/app.conf",
            "file:/etc/modules-load.d/kiln-lab-apt.conf",
            "file:/etc/modprobe.d/kiln-lab-apt.conf",
            "file:/etc/sysctl.d/90-kiln-lab-apt.conf",
            "command:index",
            "image:record"
        ]
    );
    assert_eq!(plan["steps"][4]["why"], "kiln-hello is not installed; kiln-tool is not installed");
    let dry = lab.provision("apply", &spec, &["--dry-run"]).success();
    assert!(dry.stdout().contains("12 steps would run (dry run: nothing changed)"), "{}", dry.describe());
    assert!(!root.join("var").exists(), "a dry run wrote to the root");
    assert!(!lab.db().exists(), "a dry run opened the journal");

    // Install.
    let applied = lab.provision("apply", &spec, &[]).success();
    assert!(applied.stdout().contains("lab-apt: applied 12 steps to"), "{}", applied.describe());
    let pkgs = lab.installed();
    assert!(pkgs.contains(&("kiln-hello".into(), "1.0".into(), "hi".into())), "{pkgs:?}");
    assert!(pkgs.contains(&("kiln-tool".into(), "0.3".into(), "ii".into())), "{pkgs:?}");
    let conf = root.join("etc/kiln-lab/app.conf");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "threads = 8\n");
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&conf).unwrap();
    assert_eq!((meta.mode() & 0o7777, meta.uid(), meta.gid()), (0o640, 4242, 4243));
    assert_eq!(
        std::fs::read_to_string(root.join("etc/modprobe.d/kiln-lab-apt.conf")).unwrap(),
        "options nvidia_peermem peerdirect_support=1\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/sysctl.d/90-kiln-lab-apt.conf")).unwrap(),
        "vm.max_map_count = 1048576\n"
    );
    assert!(root.join("var/lib/kiln-lab-indexed").exists());

    // A second apply changes nothing, says so, and journals nothing.
    let again = lab.provision("apply", &spec, &[]).success();
    assert!(
        again.stdout().contains("lab-apt 1 is applied to")
            && again.stdout().contains("nothing to change (11 items checked)"),
        "{}",
        again.describe()
    );
    assert_eq!(lab.log().len(), 1);
    let verified = lab.provision("verify", &spec, &[]).success();
    assert!(
        verified.stdout().contains("no drift") && verified.stdout().contains("check ok    : hello version (1.0)"),
        "{}",
        verified.describe()
    );

    // Drift after manual changes: a file edited and chmod-ed, the hold released.
    std::fs::write(&conf, "threads = 64\n").unwrap();
    let unhold = Command::new("dpkg")
        .arg(format!("--root={}", root.display()))
        .arg("--set-selections")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    unhold.stdin.as_ref().unwrap().write_all(b"kiln-hello install\n").unwrap();
    assert!(unhold.wait_with_output().unwrap().status.success());
    let drift = lab.provision("verify", &spec, &[]);
    assert_eq!(drift.code(), Some(1), "{}", drift.describe());
    let text = drift.stdout();
    assert!(text.contains("lab-apt: 2 drift items on"), "{text}");
    assert!(text.contains("drift: hold kiln-hello — kiln-hello is not held"), "{text}");
    assert!(text.contains("drift: write /etc/kiln-lab/app.conf — content differs (sha256 "), "{text}");
    let drift_json = lab.provision("verify", &spec, &["--json"]);
    assert_eq!(drift_json.code(), Some(1));
    assert_eq!(drift_json.json()["drift"].as_array().unwrap().len(), 2);
    lab.provision("apply", &spec, &[]).success();
    lab.provision("verify", &spec, &[]).success();
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "threads = 8\n");

    // Upgrading a pinned version: the plan says why, the hold does not stop kiln, verify agrees.
    let spec = apt_spec(&lab, "2.0", "2.0");
    let plan = lab.provision("plan", &spec, &["--json"]).success().json();
    assert_eq!(
        step_keys(&plan),
        ["file:/etc/apt/preferences.d/kiln-lab-apt.pref", "apt:update", "apt:install", "apt:hold", "image:record"]
    );
    assert_eq!(plan["steps"][2]["why"], "kiln-hello is 1.0 (want 2.0)");
    assert_eq!(plan["steps"][3]["why"], "kiln-hello is installed by this plan, which releases its hold");
    lab.provision("apply", &spec, &[]).success();
    assert!(lab.installed().contains(&("kiln-hello".into(), "2.0".into(), "hi".into())), "{:?}", lab.installed());
    lab.provision("verify", &spec, &[]).success();

    // A glob pin moves it back: apt's preferences pin 1.*, and apt-get installs the bare name.
    let spec = apt_spec(&lab, "1.*", "1.0");
    lab.provision("apply", &spec, &[]).success();
    assert!(lab.installed().contains(&("kiln-hello".into(), "1.0".into(), "hi".into())), "{:?}", lab.installed());
    lab.provision("verify", &spec, &[]).success();

    // The fingerprint names the image at the hash the last apply recorded.
    let status = kiln(&["provision", "status", "--root", root.to_str().unwrap(), "--json"], &[]).success().json();
    let plan = lab.provision("plan", &spec, &["--json"]).success().json();
    assert_eq!(status["images"][0]["image"], "lab-apt");
    assert_eq!(status["images"][0]["hash"], plan["image_hash"]);
    assert_eq!(lab.log().len(), 4, "install, the drift repair, the upgrade, the glob pin");
    assert!(lab.log().iter().all(|a| a["status"] == "succeeded"));
}

/// A signed repository: the key file's fingerprint pinned, apt verifying the index's signature
/// against it below another root; a key file holding a second key passes only the pinned one to apt.
#[test]
fn signed_repository_with_a_pinned_key() {
    if !need_root("signed_repository_with_a_pinned_key", &[util::program("gpg", "gnupg")]) {
        return;
    }
    let lab = Lab::new();
    lab.deb("kiln-hello", "1.0", None, &[("/usr/share/kiln-hello/version", "1.0\n")]);
    let pinned = lab.signing_key("repo");
    let other = lab.signing_key("other");
    lab.sign_repo(&pinned);
    // Both keys in one file: only the pinned one may reach apt.
    let both = [
        std::fs::read(lab.path().join("keys/repo.asc")).unwrap(),
        std::fs::read(lab.path().join("keys/other.asc")).unwrap(),
    ]
    .concat();
    std::fs::write(lab.path().join("keys/both.asc"), both).unwrap();
    let spec_with = |file: &str, fpr: &str| {
        lab.spec("lab-signed", &format!(
            "[image]\nname = \"lab-signed\"\nversion = \"1\"\n\n[[apt.repository]]\nname = \"signed\"\nuri = \"file:@REPO@\"\nsuite = \"./\"\nkey = {{ file = \"keys/{file}\", fingerprint = \"{fpr}\" }}\n\n[apt.packages]\nkiln-hello = \"1.0\"\n"
        ))
    };
    // The wrong key is refused at the fingerprint, before anything is written.
    let spec = spec_with("other.asc", &pinned);
    let refused = lab.provision("plan", &spec, &[]);
    assert_eq!(refused.code(), Some(2), "{}", refused.describe());
    let want = format!(
        "kiln: error: {}:9:48: key file {}/keys/other.asc holds {other}, not the pinned {pinned}",
        spec.display(),
        lab.path().display()
    );
    assert_eq!(refused.stderr().trim_end(), want);

    let spec = spec_with("both.asc", &pinned);
    lab.provision("apply", &spec, &[]).success();
    assert!(lab.installed().contains(&("kiln-hello".into(), "1.0".into(), "ii".into())), "{:?}", lab.installed());
    let sources = std::fs::read_to_string(lab.root().join("etc/apt/sources.list.d/kiln-signed.sources")).unwrap();
    assert!(sources.contains("Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n"), "{sources}");
    let inline: String = sources
        .lines()
        .skip_while(|l| !l.starts_with("Signed-By:"))
        .skip(1)
        .map(|l| if l == " ." { "\n".to_string() } else { format!("{}\n", &l[1..]) })
        .collect();
    std::fs::write(lab.path().join("inline.asc"), inline).unwrap();
    let shown = Command::new("gpg")
        .args(["--batch", "--show-keys", "--with-colons"])
        .arg(lab.path().join("inline.asc"))
        .output()
        .unwrap();
    let fprs: Vec<String> = String::from_utf8_lossy(&shown.stdout)
        .lines()
        .filter(|l| l.starts_with("fpr:"))
        .map(|l| l.split(':').nth(9).unwrap().to_string())
        .collect();
    assert_eq!(fprs.first(), Some(&pinned), "the inline key is the pinned one");
    assert!(!fprs.contains(&other), "the second key must not reach apt: {fprs:?}");
    let again = lab.provision("plan", &spec, &[]).success();
    assert!(again.stdout().contains("nothing to change"), "{}", again.describe());

    // An index signed by another key: apt refuses it, and kiln stops at that step with apt's words.
    lab.deb("kiln-hello", "2.0", None, &[("/usr/share/kiln-hello/version", "2.0\n")]);
    lab.sign_repo(&other);
    let spec = lab.spec(
        "lab-signed",
        &std::fs::read_to_string(&spec).unwrap().replace("kiln-hello = \"1.0\"", "kiln-hello = \"2.0\""),
    );
    let failed = lab.provision("apply", &spec, &[]);
    assert_eq!(failed.code(), Some(2), "{}", failed.describe());
    assert!(
        failed.stderr().contains("step 2 of 4 failed")
            && failed.stderr().contains("step:      apt-get update")
            && failed.stderr().contains("NO_PUBKEY"),
        "{}",
        failed.describe()
    );
    assert!(lab.installed().contains(&("kiln-hello".into(), "1.0".into(), "ii".into())));
}

#[test]
fn python_venv_from_local_wheels_with_hashes() {
    if !need_root("python_venv_from_local_wheels_with_hashes", &[python_venv()]) {
        return;
    }
    let lab = Lab::new();
    let wheels = lab.path().join("wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    wheel(&wheels, "kilnwheel", "1.0");
    let sha2 = wheel(&wheels, "kilnwheel", "2.0");
    let spec_text = |version: &str, hash: &str| {
        format!(
            "[image]\nname = \"lab-venv\"\nversion = \"1\"\n\n[[venv]]\npath = \"/opt/kiln/venvs/lab\"\nwheels = \"wheels\"\npackages = [\"kilnwheel=={version}\"]\n{}",
            if hash.is_empty() { String::new() } else { format!("hashes = {{ kilnwheel = [\"sha256:{hash}\"] }}\n") }
        )
    };
    let spec = lab.spec("lab-venv", &spec_text("1.0", ""));
    let plan = lab.provision("plan", &spec, &["--json"]).success().json();
    assert_eq!(step_keys(&plan), ["venv:/opt/kiln/venvs/lab", "pip:/opt/kiln/venvs/lab", "image:record"]);
    lab.provision("apply", &spec, &[]).success();
    let python = lab.root().join("opt/kiln/venvs/lab/bin/python");
    let import = |want: &str| {
        let out = Command::new(&python).args(["-c", "import kilnwheel; print(kilnwheel.VERSION)"]).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want, "{}", String::from_utf8_lossy(&out.stderr));
    };
    import("1.0");
    let again = lab.provision("apply", &spec, &[]).success();
    assert!(again.stdout().contains("nothing to change"), "{}", again.describe());

    // A wrong hash: pip refuses, the apply stops at that step with pip's words, the journal keeps it.
    let spec = lab.spec("lab-venv", &spec_text("2.0", &"0".repeat(64)));
    let failed = lab.provision("apply", &spec, &[]);
    assert_eq!(failed.code(), Some(2), "{}", failed.describe());
    assert!(
        failed.stderr().contains("step 1 of 2 failed")
            && failed.stderr().contains("THESE PACKAGES DO NOT MATCH THE HASHES"),
        "{}",
        failed.describe()
    );
    import("1.0");
    let applies = lab.log();
    assert_eq!(applies[0]["status"], "failed");
    // The fix: the right hash, and --resume finishes the same apply.
    let spec = lab.spec("lab-venv", &spec_text("2.0", &sha2));
    let resumed = lab.provision("apply", &spec, &["--resume"]).success();
    assert!(resumed.stdout().contains("resuming"), "{}", resumed.describe());
    import("2.0");
    let journal = lab.journal(applies[0]["id"].as_str().unwrap());
    let states: Vec<(&str, &str)> = journal["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["step_key"].as_str().unwrap(), s["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        [
            ("pip:/opt/kiln/venvs/lab", "failed"),
            ("pip:/opt/kiln/venvs/lab", "succeeded"),
            ("image:record", "succeeded")
        ]
    );
    lab.provision("verify", &spec, &[]).success();
}

/// `kiln provision apply SPEC` on the lab, in a process group of its own, so that a kill of the
/// group takes the step's child with it, as a power cut would.
fn spawn_apply(lab: &Lab, spec: &Path) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["provision", "apply", spec.to_str().unwrap(), "--root", lab.root().to_str().unwrap()])
        .env("KILN_DB", lab.db())
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn killed_apply_resumes_and_the_journal_tells_the_story() {
    if !need_root("killed_apply_resumes_and_the_journal_tells_the_story", &[]) {
        return;
    }
    let lab = Lab::new();
    let spec = lab.spec(
        "lab-crash",
        r#"
[image]
name = "lab-crash"
version = "1"

[[file]]
path = "/etc/kiln-lab/first"
content = "1\n"

[[command]]
name = "slow"
run = ["sh", "-c", "sleep 2 && touch \"$0\"", "${root}/var/slow-done"]
creates = "/var/slow-done"

[[command]]
name = "after"
run = ["touch", "${root}/var/after-done"]
creates = "/var/after-done"
"#,
    );
    let mut child = spawn_apply(&lab, &spec);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let apply_id = loop {
        assert!(std::time::Instant::now() < deadline, "the slow step never started");
        if lab.db().exists() {
            if let Some(a) = lab.log().first() {
                let id = a["id"].as_str().unwrap().to_string();
                let j = lab.journal(&id);
                if j["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|s| s["step_key"] == "command:slow" && s["status"] == "started")
                {
                    break id;
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // SAFETY: kill of the process group we created.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    child.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(!lab.root().join("var/slow-done").exists(), "the killed step finished anyway");

    // A plain apply refuses to paper over the crash.
    let refused = lab.provision("apply", &spec, &[]);
    assert_eq!(refused.code(), Some(2), "{}", refused.describe());
    assert!(
        refused.stderr().contains("did not finish: kiln was killed or interrupted")
            && refused.stderr().contains("--resume"),
        "{}",
        refused.describe()
    );

    let resumed = lab.provision("apply", &spec, &["--resume"]).success();
    assert!(
        resumed.stdout().contains("applied 3 steps") && resumed.stdout().contains("resuming"),
        "{}",
        resumed.describe()
    );
    assert!(lab.root().join("var/slow-done").exists() && lab.root().join("var/after-done").exists());

    let journal = lab.journal(&apply_id);
    assert_eq!(journal["apply"]["status"], "succeeded");
    assert_eq!(journal["apply"]["resumes"], 1);
    let story: Vec<(i64, &str, &str)> = journal["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["seq"].as_i64().unwrap(), s["step_key"].as_str().unwrap(), s["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        story,
        [
            (1, "file:/etc/kiln-lab/first", "succeeded"),
            (2, "command:slow", "interrupted"),
            (3, "command:slow", "succeeded"),
            (4, "command:after", "succeeded"),
            (5, "image:record", "succeeded")
        ]
    );
    let slow = &journal["steps"][2];
    assert_eq!(slow["exit_code"], 0);
    assert!(slow["duration_ms"].as_i64().unwrap() >= 1900, "{slow}");
    let text = kiln(&["provision", "log", "--apply", &apply_id[..8]], &[("KILN_DB", &lab.db())]).success().stdout();
    assert!(
        text.contains("succeeded (started") && text.contains("resumed 1 time)") && text.contains("interrupted"),
        "{text}"
    );
    lab.provision("apply", &spec, &[]).success();
}

/// `provision apply` killed with SIGKILL (with its step's children) at seeded moments: after each
/// kill the database passes `kiln db check`, the journal holds every step that started with an
/// outcome or `started` (never a half-written row), a plain apply refuses to paper over a crash,
/// and `--resume` finishes the image, which then verifies clean.
#[test]
fn applies_killed_at_seeded_moments_resume_to_a_verified_image() {
    if !need_root("applies_killed_at_seeded_moments_resume_to_a_verified_image", &[]) {
        return;
    }
    let image = r#"
[image]
name = "lab-kills"
version = "1"

[[file]]
path = "/etc/kiln-lab/a"
content = "a\n"

[[command]]
name = "one"
run = ["sh", "-c", "sleep 0.2 && touch \"$0\"", "${root}/var/one"]
creates = "/var/one"

[[file]]
path = "/etc/kiln-lab/b"
content = "b\n"

[[command]]
name = "two"
run = ["sh", "-c", "sleep 0.2 && touch \"$0\"", "${root}/var/two"]
creates = "/var/two"

[[command]]
name = "three"
run = ["sh", "-c", "sleep 0.2 && touch \"$0\"", "${root}/var/three"]
creates = "/var/three"
"#;
    for ms in crate::kill::delays(0x70726f76, 8, 1_200) {
        let lab = Lab::new();
        let spec = lab.spec("lab-kills", image);
        let mut child = spawn_apply(&lab, &spec);
        std::thread::sleep(std::time::Duration::from_millis(ms));
        // SAFETY: kill of the process group we created.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        child.wait().unwrap();
        let context = format!("apply killed after {ms} ms");
        if lab.db().exists() {
            let check = kiln(&["db", "check"], &[("KILN_DB", &lab.db())]);
            assert_eq!(check.code(), Some(0), "{context}: {}", check.describe());
            for a in lab.log() {
                let journal = lab.journal(a["id"].as_str().unwrap());
                for step in journal["steps"].as_array().unwrap() {
                    let status = step["status"].as_str().unwrap();
                    assert!(matches!(status, "started" | "succeeded" | "failed" | "interrupted"), "{context}: {step}");
                    if status == "succeeded" {
                        assert!(step["finished_at"].is_string() && step["exit_code"] == 0, "{context}: {step}");
                    }
                }
            }
        }
        lab.provision("apply", &spec, &["--resume"]).success();
        lab.provision("verify", &spec, &[]).success();
        let log = lab.log();
        assert_eq!(log[0]["status"], "succeeded", "{context}: {log:?}");
        for f in ["var/one", "var/two", "var/three", "etc/kiln-lab/a", "etc/kiln-lab/b"] {
            assert!(lab.root().join(f).exists(), "{context}: {f} missing");
        }
    }
}

#[test]
fn apply_needs_root_and_says_so_before_doing_anything() {
    let lab = Lab::new();
    let spec = lab.spec(
        "lab-root",
        "[image]\nname = \"lab-root\"\nversion = \"1\"\n\n[[file]]\npath = \"/etc/x\"\ncontent = \"x\"\n",
    );
    let bin = env!("CARGO_BIN_EXE_kiln");
    let root = lab.root();
    let args = ["provision", "apply", spec.to_str().unwrap(), "--root", root.to_str().unwrap()];
    if !util::needs(
        "apply_needs_root_and_says_so_before_doing_anything",
        &util::program("setpriv", "util-linux").filter(|_| is_root()).into_iter().collect::<Vec<_>>(),
    ) {
        return;
    }
    let output = if is_root() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(lab.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin])
            .args(args)
            .env("KILN_DB", lab.db())
            .output()
            .expect("setpriv (util-linux)")
    } else {
        Command::new(bin).args(args).env("KILN_DB", lab.db()).output().unwrap()
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("kiln provision apply needs root") && stderr.contains("--dry-run"), "{stderr}");
    assert!(!lab.db().exists() && !lab.root().join("etc/x").exists());
}

/// Each broken spec and the one error it must produce: file, line, column, message.
#[test]
fn bad_specs_point_at_file_line_and_column() {
    let lab = Lab::new();
    let head = "[image]\nname = \"x\"\nversion = \"1\"\n";
    let cases: &[(&str, String, &str)] = &[
        ("unknown-key", format!("{head}flavour = \"y\"\n"), "4:1: unknown field `flavour`, expected one of `name`, `version`, `description`"),
        ("wrong-type", "[image]\nname = \"x\"\nversion = 1\n".into(), "3:11: invalid type: integer `1`, expected a string"),
        ("missing-field", "[image]\nname = \"x\"\n".into(), "1:1: missing field `version`"),
        ("syntax", "[image]\nname = \"x\nversion = \"1\"\n".into(), "2:10: invalid basic string"),
        ("duplicate-table", format!("{head}[image]\nname = \"y\"\n"), "4:1: invalid table header: duplicate key `image` in document root"),
        ("package-version-type", format!("{head}[apt.packages]\nhwloc = 1\n"), "5:9: invalid type: integer `1`, expected a string"),
        ("package-version", format!("{head}[apt.packages]\nhwloc = \"1.0 or later\"\n"), "5:9: version \"1.0 or later\" of hwloc must be a Debian version, a glob such as \"570.*\", or \"*\""),
        ("mode", format!("{head}[[file]]\npath = \"/etc/x\"\ncontent = \"y\"\nmode = \"644x\"\n"), "7:8: mode \"644x\" must be octal, e.g. \"0644\""),
        ("relative-path", format!("{head}[[file]]\npath = \"etc/x\"\ncontent = \"y\"\n"), "5:8: a file path must be absolute, without '..'"),
        ("source-hash", format!("{head}[[file]]\npath = \"/etc/x\"\nsource = \"x.conf\"\nsha256 = \"{}\"\n", "ab".repeat(32)), "7:10: @DIR@/x.conf has sha256 @SHA@, not the pinned abababababababababababababababababababababababababababababababab"),
        ("regex", format!("{head}[[check]]\nname = \"c\"\nrun = [\"true\"]\nmatches = \"(unclosed\"\n"), "7:11: bad regex: unclosed group"),
        ("unguarded-command", format!("{head}[[command]]\nname = \"c\"\nrun = [\"true\"]\n"), "4:1: command \"c\" has no guard: give it `creates` or `unless`, so that applying twice is safe"),
        ("unpinned-requirement", format!("{head}[[venv]]\npath = \"/opt/v\"\npackages = [\"torch>=2\"]\n"), "6:13: \"torch>=2\" must pin an exact version: \"name==version\""),
        ("trusted-https", format!("{head}[[apt.repository]]\nname = \"r\"\nuri = \"https://example.invalid/\"\nsuite = \"/\"\ntrusted = true\n"), "8:11: only a file: repository may be trusted without a key; pin the signing key with key.fingerprint"),
        ("short-fingerprint", format!("{head}[[apt.repository]]\nname = \"r\"\nuri = \"https://example.invalid/\"\nsuite = \"/\"\nkey = {{ url = \"https://example.invalid/k\", fingerprint = \"ABCD\" }}\n"), "8:58: key fingerprint must be 40 hexadecimal digits (spaces allowed)"),
        ("unsigned-repository", format!("{head}[[apt.repository]]\nname = \"r\"\nuri = \"https://example.invalid/\"\nsuite = \"/\"\n"), "4:1: repository \"r\" has no signing key: add key = { file = …, fingerprint = … }"),
        ("hold-unknown", format!("{head}[apt]\nhold = [\"nope\"]\n"), "5:9: hold names \"nope\", which [apt.packages] does not install"),
        ("unknown-service-key", format!("{head}[[service]]\nname = \"s\"\nenable = true\n"), "6:1: unknown field `enable`, expected one of `name`, `enabled`, `started`"),
        ("os-not-a-list", format!("{head}[match]\nos = \"debian 12\"\n"), "5:6: invalid type: string \"debian 12\", expected a sequence"),
        ("dotted-key", format!("{head}[apt.packages]\nlibpython3.11 = \"*\"\n"), "5:1: a bare key with dots is a dotted key (nested tables) in TOML: quote names that contain dots, e.g. \"libpython3.12\" = \"*\""),
        ("gpu-vendor", format!("{head}[match]\ngpu = \"amd\"\n"), "5:7: gpu must be \"nvidia\" or \"none\", not \"amd\""),
        ("image-name", "[image]\nname = \"My Image\"\nversion = \"1\"\n".into(), "2:8: image name \"My Image\" must be lowercase letters, digits, '.', '-' and '_'"),
        // Spec values can never become options, nor reach outside the image's folder.
        ("package-option", format!("{head}[apt.packages]\n\"--allow-unauthenticated\" = \"*\"\n"), "5:1: \"--allow-unauthenticated\" is not a Debian package name"),
        ("version-option", format!("{head}[apt.packages]\nhwloc = \"-o=APT::Get::AllowUnauthenticated=1\"\n"), "5:9: version \"-o=APT::Get::AllowUnauthenticated=1\" of hwloc must be a Debian version, a glob such as \"570.*\", or \"*\""),
        ("pip-option", format!("{head}[[venv]]\npath = \"/opt/v\"\npackages = [\"--index-url==http://evil\"]\n"), "6:13: \"--index-url==http://evil\" must pin an exact version: \"name==version\""),
        ("module-option", format!("{head}[[module]]\nname = \"-r\"\n"), "5:8: \"-r\" is not a kernel module name"),
        ("sysctl-option", format!("{head}[sysctl]\n\"-p\" = 1\n"), "5:1: \"-p\" is not a sysctl name"),
        ("unit-option", format!("{head}[[service]]\nname = \"--global\"\nenabled = true\n"), "5:8: \"--global\" is not a systemd unit name"),
        ("source-outside", format!("{head}[[file]]\npath = \"/etc/x\"\nsource = \"../../etc/shadow\"\nsha256 = \"{}\"\n", "ab".repeat(32)), "6:10: source \"../../etc/shadow\" must be a path inside the image's folder (relative, without '..', no link out of it)"),
        ("source-absolute", format!("{head}[[file]]\npath = \"/etc/x\"\nsource = \"/etc/shadow\"\nsha256 = \"{}\"\n", "ab".repeat(32)), "6:10: source \"/etc/shadow\" must be a path inside the image's folder (relative, without '..', no link out of it)"),
        ("source-link-out", format!("{head}[[file]]\npath = \"/etc/x\"\nsource = \"out\"\nsha256 = \"{}\"\n", "ab".repeat(32)), "6:10: source \"out\" must be a path inside the image's folder (relative, without '..', no link out of it)"),
        ("key-outside", format!("{head}[[apt.repository]]\nname = \"r\"\nuri = \"https://example.invalid/\"\nsuite = \"/\"\nkey = {{ file = \"/etc/apt/trusted.gpg\", fingerprint = \"{}\" }}\n", "AB".repeat(20)), "8:16: key file \"/etc/apt/trusted.gpg\" must be a path inside the image's folder (relative, without '..', no link out of it)"),
        ("wheels-outside", format!("{head}[[venv]]\npath = \"/opt/v\"\npackages = [\"x==1\"]\nwheels = \"../w\"\n"), "7:10: wheel directory \"../w\" must be a path inside the image's folder (relative, without '..', no link out of it)"),
    ];
    std::os::unix::fs::symlink("/etc/hostname", lab.path().join("out")).unwrap();
    std::fs::write(lab.path().join("x.conf"), "threads = 8\n").unwrap();
    let conf_sha: String = Sha256::digest(b"threads = 8\n").iter().map(|b| format!("{b:02x}")).collect();
    let mut failures = Vec::new();
    for (name, text, want) in cases {
        let spec = lab.spec(name, text);
        let run = kiln(&["provision", "plan", spec.to_str().unwrap(), "--root", lab.root().to_str().unwrap()], &[]);
        let want = format!(
            "kiln: error: {}:{}",
            spec.display(),
            want.replace("@DIR@", lab.path().to_str().unwrap()).replace("@SHA@", &conf_sha)
        );
        if run.code() != Some(2) || run.stderr().trim_end() != want {
            failures.push(format!(
                "{name}:\n  want {want}\n  got  {} (exit {:?})",
                run.stderr().trim_end(),
                run.code()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn shipped_images_lint_clean_and_plan_on_an_empty_root() {
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("images");
    let run = kiln(&["provision", "lint", "--images", images.to_str().unwrap()], &[]).success();
    let n = std::fs::read_dir(&images)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "toml"))
        .count();
    assert!(n >= 3, "cpu-base and two NVIDIA stacks ship");
    assert!(run.stdout().contains(&format!("{n} images linted, 0 findings")), "{}", run.describe());
    // An image being built: plan the Ubuntu NVIDIA stack into an empty Ubuntu root (no GPU needed
    // for another root).
    let lab = Lab::new();
    std::fs::write(lab.root().join("etc/os-release"), "ID=ubuntu\nVERSION_ID=\"24.04\"\n").unwrap();
    std::fs::create_dir_all(lab.root().join("lib/modules/6.8.0-48-generic")).unwrap();
    if std::env::consts::ARCH == "x86_64" {
        let plan = kiln(
            &[
                "provision",
                "plan",
                images.join("nvidia-cuda12.8-ubuntu24.04.toml").to_str().unwrap(),
                "--root",
                lab.root().to_str().unwrap(),
                "--json",
            ],
            &[],
        )
        .success()
        .json();
        let install = plan["steps"].as_array().unwrap().iter().find(|s| s["key"] == "apt:install").unwrap();
        let cmd = install["actions"][0]["argv"].as_array().unwrap();
        assert!(cmd.iter().any(|a| a == "linux-headers-6.8.0-48-generic"), "headers follow the root's kernel: {cmd:?}");
        assert!(cmd.iter().any(|a| a == "libnccl2=2.26.2-1+cuda12.8"), "{cmd:?}");
        assert!(
            cmd.iter().any(|a| a == "nvidia-open-570"),
            "a glob pin installs the bare name under an apt pin: {cmd:?}"
        );
        let source = plan["steps"].as_array().unwrap().iter().find(|s| s["key"] == "apt-source:cuda").unwrap();
        assert_eq!(source["actions"][0]["kind"], "fetch_key");
        assert_eq!(source["actions"][0]["fingerprint"], "EB693B3035CD5710E231E123A4B469963BF863CC");
    }
}

/// Inconsistent NVIDIA pins, each with the exact finding `lint` must report.
#[test]
fn lint_finds_inconsistent_nvidia_pins() {
    let lab = Lab::new();
    let head = "[image]\nname = \"x\"\nversion = \"1\"\n[match]\ngpu = \"nvidia\"\n";
    let cases: &[(&str, String, &str)] = &[
        ("driver-too-old", format!("{head}[apt.packages]\nnvidia-open-560 = \"560.35.03-1\"\ncuda-toolkit-12-8 = \"12.8.1-1\"\n"), "7:19: driver 560.35.03 is older than CUDA 12.8 needs (>= 570.26)"),
        ("fabric-manager-differs", format!("{head}[apt.packages]\nnvidia-open-570 = \"570.133.20-1\"\nnvidia-fabricmanager-570 = \"570.124.06-1\"\n"), "8:28: fabric manager 570.124.06-1 must equal the driver version (nvidia-open-570 = 570.133.20-1)"),
        ("fabric-manager-branch", format!("{head}[apt.packages]\nnvidia-open-570 = \"570.133.20-1\"\nnvidia-fabricmanager-565 = \"570.133.20-1\"\n"), "8:1: fabric manager branch 565 differs from the driver branch 570"),
        ("headers-fixed", format!("{head}[apt.packages]\n\"linux-headers-6.8.0-45-generic\" = \"*\"\n"), "7:1: linux-headers-6.8.0-45-generic does not follow the running kernel: use \"linux-headers-${kernel_release}\" so that DKMS builds the driver for the kernel that boots"),
        ("proprietary", format!("{head}[apt.packages]\nnvidia-driver-570-server = \"570.133.20-0ubuntu1\"\n"), "7:1: nvidia-driver-570-server is the proprietary kernel module: use the open kernel modules (nvidia-driver-570-server-open, nvidia-open or nvidia-kernel-open-dkms), which Hopper and Blackwell need"),
        ("driver-unpinned", format!("{head}[apt.packages]\nnvidia-open = \"*\"\n"), "7:15: pin nvidia-open to a driver version (\"570.133.20-1\" or \"570.133.*\")"),
        ("nccl-cuda", format!("{head}[apt.packages]\nnvidia-open-570 = \"570.133.20-1\"\ncuda-toolkit-12-8 = \"12.8.1-1\"\nlibnccl2 = \"2.21.5-1+cuda12.4\"\n"), "9:12: libnccl2 2.21.5-1+cuda12.4 is built for CUDA 12.4, but the toolkit is CUDA 12.8"),
        ("cudnn-major", format!("{head}[apt.packages]\nnvidia-open-580 = \"580.65.06-1\"\ncuda-toolkit-13-0 = \"13.0.0-1\"\nlibcudnn9-cuda-12 = \"9.8.0.87-1\"\n"), "9:1: libcudnn9-cuda-12 is built for CUDA 12, but the toolkit is CUDA 13"),
        ("torch-cuda", format!("{head}[apt.packages]\nnvidia-open-550 = \"550.127.05-1\"\n[[venv]]\npath = \"/opt/v\"\npackages = [\"torch==2.7.0+cu128\"]\n"), "7:19: driver 550.127.05 is older than torch 2.7.0+cu128 (CUDA 12.8) needs (>= 570.26)"),
        ("branch-mismatch", format!("{head}[apt.packages]\nnvidia-open-570 = \"575.51.03-1\"\n"), "7:19: version 575.51.03-1 is not of the 570 branch that nvidia-open-570 names"),
    ];
    let mut failures = Vec::new();
    for (name, text, want) in cases {
        let spec = lab.spec(name, text);
        let run = kiln(&["provision", "lint", spec.to_str().unwrap()], &[]);
        let want = format!("{}:{}", spec.display(), want);
        let first = run.stdout().lines().next().unwrap_or("").to_string();
        if run.code() != Some(1) || first != want {
            failures.push(format!("{name}:\n  want {want}\n  got  {first} (exit {:?})\n{}", run.code(), run.stdout()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `--root` is a boundary for writes too: a target whose `etc/` and `var/` are absolute links to
/// directories outside it gets the files, the lock and the image record inside it, and nothing
/// lands where the links point on this machine.
#[test]
fn apply_never_writes_outside_its_root() {
    if !util::needs(
        "apply_never_writes_outside_its_root",
        &util::root("apply needs root").into_iter().collect::<Vec<_>>(),
    ) {
        return;
    }
    let lab = Lab::new();
    let outside = tempfile::tempdir().unwrap();
    let (etc, var) = (outside.path().join("etc"), outside.path().join("var"));
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::create_dir_all(&var).unwrap();
    let root = lab.root();
    std::fs::create_dir_all(&root).unwrap();
    for d in ["etc", "var"] {
        let _ = std::fs::remove_dir_all(root.join(d));
    }
    std::os::unix::fs::symlink(&etc, root.join("etc")).unwrap();
    std::os::unix::fs::symlink(&var, root.join("var")).unwrap();
    let spec = lab.spec(
        "lab-boundary",
        "[image]\nname = \"lab-boundary\"\nversion = \"1\"\n\n[[file]]\npath = \"/etc/kiln-boundary.conf\"\ncontent = \"inside\\n\"\n",
    );
    lab.provision("apply", &spec, &[]).success();
    let escaped: Vec<_> = walk(outside.path());
    assert!(escaped.iter().all(|p| p.is_dir()), "written outside the root: {escaped:?}");
    // What the links name, taken inside the root.
    let inside = kiln_provision::root::resolve_in_root(&root, Path::new("/etc/kiln-boundary.conf"));
    assert!(inside.starts_with(&root), "{}", inside.display());
    assert_eq!(std::fs::read_to_string(&inside).unwrap(), "inside\n");
    lab.provision("verify", &spec, &[]).success();
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        out.push(e.path());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        }
    }
    out
}
