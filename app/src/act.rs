//! Acting on a verdict where the cluster is scheduled: on REJECT, the node drained in Slurm with
//! the first failing check as the reason, so that no job lands on a bad box; on a later ACCEPT of
//! a node kiln itself drained (its reason starts `kiln:`), the node resumed. A node drained by
//! anyone else is never touched. For every other scheduler, a hook: a command run with the verdict
//! document on standard input, its exit recorded.

use std::io::Write;
use std::process::{Command, Stdio};

use kiln_sku::verdict::{Decision, Status, Verdict};
use serde::Serialize;

/// What kiln's own drain reasons start with: how a drain kiln made is told from an operator's.
pub const REASON_PREFIX: &str = "kiln:";

/// What to do after a verdict.
#[derive(Debug, Clone, Default)]
pub struct Actions {
    /// Drain the node in Slurm on REJECT (and resume it on a later ACCEPT, when kiln drained it).
    pub drain: bool,
    /// The node's Slurm name; `None`: this host's short name.
    pub slurm_node: Option<String>,
    /// A shell command run with the verdict document on standard input.
    pub on_verdict: Option<String>,
}

/// What was done, for the commission's document and text.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Acted {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm: Option<Slurm>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_verdict: Option<Hook>,
}

/// The node's state in Slurm and what kiln did to it.
#[derive(Debug, Clone, Serialize)]
pub struct Slurm {
    pub node: String,
    /// `drained`, `resumed`, `left` (drained by someone else: not touched) or `none`.
    pub action: &'static str,
    /// The drain reason kiln gave, or the one it found and left.
    pub reason: Option<String>,
    /// Why Slurm could not be asked or told (no `scontrol`, not an admin, no such node).
    pub error: Option<String>,
}

/// The hook's run.
#[derive(Debug, Clone, Serialize)]
pub struct Hook {
    pub command: String,
    pub exit: Option<i32>,
    pub error: Option<String>,
}

impl Acted {
    /// Lines for people: what was done, and any failure to do it.
    pub fn render(&self) -> String {
        let mut text = String::new();
        if let Some(s) = &self.slurm {
            let reason = s.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
            match (&s.error, s.action) {
                (Some(e), _) => text.push_str(&format!("slurm: node {} not changed: {e}\n", s.node)),
                (None, "left") => {
                    text.push_str(&format!("slurm: node {} left drained, by someone else{reason}\n", s.node))
                }
                (None, "none") => {}
                (None, action) => text.push_str(&format!("slurm: node {} {action}{reason}\n", s.node)),
            }
        }
        if let Some(h) = &self.on_verdict {
            match (&h.error, h.exit) {
                (Some(e), _) => text.push_str(&format!("on-verdict: `{}` did not run: {e}\n", h.command)),
                (None, Some(code)) => text.push_str(&format!("on-verdict: `{}` exited {code}\n", h.command)),
                (None, None) => text.push_str(&format!("on-verdict: `{}` was killed by a signal\n", h.command)),
            }
        }
        text
    }
}

/// Acts on `v` (stored as `verdict_id`) as `actions` say.
pub fn act(v: &Verdict, verdict_id: Option<&str>, actions: &Actions) -> Acted {
    let slurm = actions.drain.then(|| slurm(v, verdict_id, actions.slurm_node.clone().unwrap_or_else(short_hostname)));
    let on_verdict = actions.on_verdict.as_ref().map(|command| hook(command, v, verdict_id));
    Acted { slurm, on_verdict }
}

/// This host's name up to its first dot: Slurm's usual NodeName.
fn short_hostname() -> String {
    let name = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    name.split('.').next().unwrap_or_default().to_string()
}

/// The drain reason of a REJECT: the first failing check, its subject, and the verdict.
pub fn drain_reason(v: &Verdict, verdict_id: Option<&str>) -> String {
    let first = v.checks.iter().find(|c| c.status == Status::Fail);
    let what = first.map(|c| format!("{} {}", c.id, c.subject)).unwrap_or_else(|| "rejected".into());
    let more = v.counts.fail.saturating_sub(1);
    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
    let id = verdict_id.map(|id| format!(" (verdict {})", &id[..id.len().min(8)])).unwrap_or_default();
    // Slurm keeps a reason on one line; kiln's checks never hold a newline, but a subject could.
    format!("{REASON_PREFIX} REJECT: {what}{more}{id}").replace(['\n', '\r'], " ")
}

fn slurm(v: &Verdict, verdict_id: Option<&str>, node: String) -> Slurm {
    let mut out = Slurm { node, action: "none", reason: None, error: None };
    let (state, reason) = match node_state(&out.node) {
        Ok(found) => found,
        Err(e) => {
            out.error = Some(e);
            return out;
        }
    };
    let drained = state.contains("drain");
    let ours = reason.starts_with(REASON_PREFIX);
    let change = match v.verdict {
        // Someone else's drain: kiln neither lifts nor rewrites it.
        Decision::Reject | Decision::Accept if drained && !ours => {
            out.action = "left";
            out.reason = Some(reason);
            None
        }
        Decision::Reject => {
            let why = drain_reason(v, verdict_id);
            out.reason = Some(why.clone());
            Some(("drained", vec!["State=DRAIN".to_string(), format!("Reason={why}")]))
        }
        Decision::Accept if drained => Some(("resumed", vec!["State=RESUME".to_string()])),
        _ => None,
    };
    if let Some((action, settings)) = change {
        let mut args = vec!["update".to_string(), format!("NodeName={}", out.node)];
        args.extend(settings);
        match run("scontrol", &args) {
            Ok(_) => out.action = action,
            Err(e) => out.error = Some(e),
        }
    }
    out
}

/// A node's state (sinfo's long form: `idle`, `drained`, `draining`, `mixed`…) and reason (`none`
/// when there is none).
fn node_state(node: &str) -> Result<(String, String), String> {
    let said = run("sinfo", &["-h", "-N", "-n", node, "-o", "%T|%E"])?;
    let line =
        said.lines().next().ok_or_else(|| format!("Slurm has no node {node:?} (sinfo -N -n {node} lists nothing)"))?;
    let (state, reason) = line.split_once('|').unwrap_or((line, ""));
    Ok((state.trim().to_string(), reason.trim().to_string()))
}

/// Runs a Slurm command; its standard output, or what went wrong.
fn run<S: AsRef<str>>(program: &str, args: &[S]) -> Result<String, String> {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let out = Command::new(program).args(&args).stdin(Stdio::null()).output().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{program} is not installed (Slurm's client commands)"),
        _ => format!("{program}: {e}"),
    })?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(format!("`{program} {}` failed ({}): {said}", args.join(" "), out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `sh -c command` with the verdict document on standard input and `KILN_VERDICT`
/// (`accept`, `reject`, `inconclusive`) and `KILN_VERDICT_ID` in its environment.
fn hook(command: &str, v: &Verdict, verdict_id: Option<&str>) -> Hook {
    let mut out = Hook { command: command.to_string(), exit: None, error: None };
    let document = match serde_json::to_vec(v) {
        Ok(d) => d,
        Err(e) => {
            out.error = Some(e.to_string());
            return out;
        }
    };
    let child = Command::new("sh")
        .args(["-c", command])
        .env("KILN_VERDICT", v.verdict.as_str())
        .env("KILN_VERDICT_ID", verdict_id.unwrap_or(""))
        .stdin(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            out.error = Some(format!("sh: {e}"));
            return out;
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A hook that does not read its input is no failure of kiln's.
        let _ = stdin.write_all(&document);
    }
    match child.wait() {
        Ok(status) => out.exit = status.code(),
        Err(e) => out.error = Some(e.to_string()),
    }
    out
}
