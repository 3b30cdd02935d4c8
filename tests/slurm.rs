//! A verdict acting where the cluster is scheduled, against a real Slurm: a throwaway single-node
//! cluster (Debian's `munged`, `slurmctld` and `slurmd`, as root, every file and socket in a
//! temporary directory, ports of their own), and `kiln commission --on-reject drain` on the fake
//! NVML's 8× H100: a REJECT drains the node with kiln's reason, a later ACCEPT resumes it, and a
//! node an operator drained stays drained whatever kiln decides. `--on-verdict` runs its command
//! with the verdict on standard input.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::gpu::capture;
use crate::util::needs;
use crate::verdict::{cases, judge_with};

/// What the cluster needs here: root (the daemons run as root, as `SlurmUser`) and the programs.
fn missing() -> Vec<String> {
    let mut missing = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        missing.push("root (slurmctld and slurmd run as root here)".to_string());
    }
    for (program, package) in [
        ("munged", "munge"),
        ("slurmctld", "slurm-wlm"),
        ("slurmd", "slurm-wlm"),
        ("scontrol", "slurm-wlm"),
        ("sinfo", "slurm-wlm"),
    ] {
        if program_path(program).is_none() {
            missing.push(format!("{program} (Debian package {package})"));
        }
    }
    missing
}

/// Where a program is: daemons live in sbin, which a user's PATH may not hold.
fn program_path(program: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"].iter().map(|d| Path::new(d).join(program)).find(|p| p.exists())
}

/// The command for `program`, by its full path.
fn command(program: &str) -> Command {
    Command::new(program_path(program).unwrap_or_else(|| PathBuf::from(program)))
}

/// A free TCP port on loopback (held only while it is found).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A one-node Slurm cluster whose node is this host, stopped when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    node: String,
    daemons: Vec<Child>,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        for sub in ["state", "spool", "log"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        let key: Vec<u8> = (0..1024).map(|i| (i * 7919 % 251) as u8 ^ std::process::id() as u8).collect();
        std::fs::write(d.join("munge.key"), key).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.join("munge.key"), std::fs::Permissions::from_mode(0o400)).unwrap();
        let node = nix::unistd::gethostname().unwrap().to_string_lossy().split('.').next().unwrap().to_string();
        let p = |name: &str| d.join(name).display().to_string();
        let conf = format!(
            "ClusterName=kilntest\nSlurmctldHost={node}(127.0.0.1)\nSlurmUser=root\nSlurmdUser=root\n\
             SlurmctldPort={}\nSlurmdPort={}\nAuthType=auth/munge\nAuthInfo=socket={}\nCredType=cred/munge\n\
             StateSaveLocation={}\nSlurmdSpoolDir={}\nSlurmctldPidFile={}\nSlurmdPidFile={}\n\
             SlurmctldLogFile={}\nSlurmdLogFile={}\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             SchedulerType=sched/builtin\nSelectType=select/linear\nReturnToService=2\nMpiDefault=none\n\
             JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
             NodeName={node} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN\n\
             PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
            free_port(),
            free_port(),
            p("munge.sock"),
            p("state"),
            p("spool"),
            p("slurmctld.pid"),
            p("slurmd.pid"),
            p("log/slurmctld.log"),
            p("log/slurmd.log"),
        );
        std::fs::write(d.join("slurm.conf"), conf).unwrap();
        let mut cluster = Cluster { dir, node, daemons: Vec::new() };
        let munged = command("munged")
            .args(["--foreground", "--force", "-S", &p("munge.sock"), "--key-file", &p("munge.key")])
            .args([
                "--log-file",
                &p("log/munged.log"),
                "--pid-file",
                &p("munged.pid"),
                "--seed-file",
                &p("munged.seed"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting munged");
        cluster.daemons.push(munged);
        cluster.wait_for(|| Path::new(&p("munge.sock")).exists(), "munged's socket");
        for daemon in ["slurmctld", "slurmd"] {
            let child = command(daemon)
                .args(if daemon == "slurmctld" { &["-D", "-i"][..] } else { &["-D"][..] })
                .env("SLURM_CONF", cluster.conf())
                // Their logs are files of the cluster's directory, printed when it does not start.
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {daemon}: {e}"));
            cluster.daemons.push(child);
        }
        cluster.wait_for(|| cluster.state().is_some_and(|(s, _)| s.starts_with("idle")), "the node idle in sinfo");
        cluster
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    /// `(state, reason)` of the node as `sinfo` gives them.
    fn state(&self) -> Option<(String, String)> {
        let out = command("sinfo")
            .args(["-h", "-N", "-n", &self.node, "-o", "%T|%E"])
            .env("SLURM_CONF", self.conf())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let (state, reason) = text.lines().next()?.split_once('|')?;
        Some((state.trim().to_string(), reason.trim().to_string()))
    }

    fn scontrol(&self, args: &[&str]) {
        let out = command("scontrol").args(args).env("SLURM_CONF", self.conf()).output().unwrap();
        assert!(out.status.success(), "scontrol {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn wait_for(&self, ready: impl Fn() -> bool, what: &str) {
        let until = Instant::now() + Duration::from_secs(60);
        while !ready() {
            if Instant::now() > until {
                let logs: Vec<String> = ["munged.log", "slurmctld.log", "slurmd.log"]
                    .iter()
                    .map(|l| std::fs::read_to_string(self.dir.path().join("log").join(l)).unwrap_or_default())
                    .collect();
                panic!("no {what} within 60 s: {:?}\n{}", self.state(), logs.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.daemons.iter_mut().rev() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.wait();
        }
    }
}

#[test]
fn a_reject_drains_the_node_in_slurm_and_an_accept_resumes_only_kilns_drain() {
    if !needs("a_reject_drains_the_node_in_slurm_and_an_accept_resumes_only_kilns_drain", &missing()) {
        return;
    }
    let cluster = Cluster::start();
    let smi = capture("H100SXMx8_smi_q.txt");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kiln.db");
    let conf = cluster.conf();
    let env = [("SLURM_CONF", conf.as_path())];
    let all = cases();
    let (clean, ecc) = (&all[0], &all[4]);
    assert_eq!((clean.verdict_of(), ecc.verdict_of()), ("accept", "reject"));
    let hook_out = dir.path().join("hook.json");
    let hook = format!("cat > '{}'; echo \"$KILN_VERDICT\" >> '{}'; exit 7", hook_out.display(), hook_out.display());
    let drain = ["--on-reject", "drain", "--slurm-node", cluster.node.as_str()];

    // REJECT: drained, the first failing check as the reason; the hook had the verdict.
    let mut args = drain.to_vec();
    args.extend(["--on-verdict", hook.as_str()]);
    let (v, code) = judge_with(&smi, ecc, &db, &args, &env);
    assert_eq!(code, 1);
    let (state, reason) = cluster.state().unwrap();
    assert!(state.starts_with("drain"), "{state} {reason}: {}", v["acted"]);
    assert!(reason.starts_with("kiln: REJECT: gpu.ecc.uncorrectable GPU 5"), "{reason}");
    assert_eq!(v["acted"]["slurm"]["action"], "drained", "{}", v["acted"]);
    assert_eq!(v["acted"]["on_verdict"]["exit"], 7, "{}", v["acted"]);
    let heard = std::fs::read_to_string(&hook_out).unwrap();
    let (document, said) = heard.rsplit_once('}').unwrap();
    let document: serde_json::Value = serde_json::from_str(&format!("{document}}}")).unwrap();
    assert_eq!((document["verdict"].as_str(), said.trim()), (Some("reject"), "reject"));

    // ACCEPT: kiln's drain is lifted.
    let (v, code) = judge_with(&smi, clean, &db, &drain, &env);
    assert_eq!(code, 0);
    assert_eq!(v["acted"]["slurm"]["action"], "resumed", "{}", v["acted"]);
    let (state, reason) = cluster.state().unwrap();
    assert!(!state.contains("drain"), "{state} {reason}");

    // An operator's drain is never kiln's to lift, nor to overwrite.
    cluster.scontrol(&["update", &format!("NodeName={}", cluster.node), "State=DRAIN", "Reason=maintenance: PSU swap"]);
    let (v, _) = judge_with(&smi, ecc, &db, &drain, &env);
    assert_eq!(v["acted"]["slurm"]["action"], "left", "{}", v["acted"]);
    let (v, _) = judge_with(&smi, clean, &db, &drain, &env);
    assert_eq!(v["acted"]["slurm"]["action"], "left", "{}", v["acted"]);
    let (state, reason) = cluster.state().unwrap();
    assert!(state.starts_with("drain") && reason == "maintenance: PSU swap", "{state} {reason}");

    // Without --on-reject, the scheduler is left alone.
    let (v, _) = judge_with(&smi, clean, &db, &[], &env);
    assert!(v["acted"].is_null(), "{}", v["acted"]);
}
