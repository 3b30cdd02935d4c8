//! A throwaway PostgreSQL cluster for tests and benchmarks: `initdb` into a temporary folder,
//! `postgres` listening only on a Unix socket in that folder (no TCP port, so clusters of tests
//! running at once never meet), stopped and removed when dropped. As root, the cluster runs as
//! `nobody` (PostgreSQL refuses root). Debian's server programs live in
//! `/usr/lib/postgresql/<version>/bin`, off the PATH: they are looked for there.

#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

pub struct PgCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// The server's options (`pg_ctl -o`), for a restart.
    options: String,
    /// The URL of the `kiln` database, through the socket.
    pub url: String,
}

/// The folder holding `initdb` and `pg_ctl`: `KILN_PG_BIN`, else the newest Debian install, else
/// the PATH. `None` when there is none.
pub fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("KILN_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").is_file())
        .collect();
    debian.sort_by_key(|p| {
        p.parent().and_then(|v| v.file_name()).and_then(|v| v.to_str()).and_then(|v| v.parse::<u32>().ok())
    });
    if let Some(newest) = debian.pop() {
        return Some(newest);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path).find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
    })
}

/// What a test needs for [`PgCluster`], for `util::needs`: nothing, or the missing programs.
pub fn missing() -> Option<String> {
    bin_dir().is_none().then(|| "PostgreSQL's initdb and pg_ctl (Debian package postgresql)".to_string())
}

const NOBODY: u32 = 65534;

impl PgCluster {
    /// Starts a cluster and creates the database `kiln` in it. Tests pay for no durability
    /// (`fsync` off); see [`PgCluster::start_durable`].
    pub fn start() -> PgCluster {
        Self::start_with(false)
    }

    /// As [`PgCluster::start`], with PostgreSQL's default durability (every commit flushed), as a
    /// benchmark must measure it.
    pub fn start_durable() -> PgCluster {
        Self::start_with(true)
    }

    fn start_with(durable: bool) -> PgCluster {
        let bin = bin_dir().expect("PostgreSQL programs (check `missing()` first)");
        let dir = tempfile::Builder::new().prefix("kiln-pg-").tempdir().expect("temporary folder");
        let root = nix::unistd::geteuid().is_root();
        if root {
            std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).expect("chown the cluster folder");
        }
        let data = dir.path().join("data");
        let run = |program: &str, args: &[&str]| {
            let mut cmd = Command::new(bin.join(program));
            cmd.args(args).current_dir(dir.path()).stdin(Stdio::null());
            if root {
                cmd.uid(NOBODY).gid(NOBODY);
            }
            let out = cmd.output().unwrap_or_else(|e| panic!("running {program}: {e}"));
            assert!(
                out.status.success(),
                "{program} {args:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let data_s = data.to_str().expect("UTF-8 temporary path");
        let sock = dir.path().to_str().expect("UTF-8 temporary path");
        run("initdb", &["-D", data_s, "-U", "kiln", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"]);
        // No TCP; the socket in the cluster's folder; no durability to pay for in a test.
        let mut options = format!("-k {sock} -c listen_addresses=''");
        if !durable {
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off";
        }
        let log = dir.path().join("log");
        run("pg_ctl", &["-D", data_s, "-o", &options, "-l", log.to_str().unwrap(), "-w", "-t", "60", "start"]);
        let cluster = PgCluster { url: format!("postgres://kiln@localhost/kiln?host={sock}"), dir, bin, options };
        cluster.psql("postgres", "CREATE DATABASE kiln");
        cluster
    }

    /// Runs SQL through `psql` on `database`; returns its unaligned output.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-h",
                self.dir.path().to_str().unwrap(),
                "-U",
                "kiln",
                "-d",
                database,
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .stdin(Stdio::null())
            .output()
            .expect("running psql");
        assert!(out.status.success(), "psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn pg_ctl(&self, args: &[&str]) -> std::process::Output {
        let data = self.dir.path().join("data");
        let mut cmd = Command::new(self.bin.join("pg_ctl"));
        cmd.arg("-D").arg(&data).args(args).stdin(Stdio::null());
        if nix::unistd::geteuid().is_root() {
            cmd.uid(NOBODY).gid(NOBODY);
        }
        cmd.output().expect("running pg_ctl")
    }

    /// Stops the server (fast: open connections are cut, as in a restart).
    pub fn stop(&self) {
        let out = self.pg_ctl(&["-m", "fast", "-w", "stop"]);
        assert!(out.status.success(), "pg_ctl stop: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Starts it again after [`PgCluster::stop`], with the same options.
    pub fn restart(&self) {
        let log = self.dir.path().join("log");
        let out = self.pg_ctl(&["-o", &self.options, "-l", log.to_str().unwrap(), "-w", "-t", "60", "start"]);
        assert!(out.status.success(), "pg_ctl start: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["-m", "immediate", "-w", "stop"]);
    }
}
