//! Carrying out a plan: one step at a time, journaled before and after, stopping at the first
//! failure or at an interruption between steps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::exec::{Executor, Finished};
use crate::plan::{Plan, Step};

/// Where each step is recorded before it starts and after it ends. A journal that cannot write
/// stops the apply: a change nobody recorded is worse than a change not made.
pub trait Journal {
    /// Records that `step` (number `seq` of this apply) is starting; returns its record's id.
    fn started(&mut self, seq: usize, step: &Step) -> Result<i64, JournalError>;
    fn finished(&mut self, id: i64, result: &StepResult) -> Result<(), JournalError>;
}

/// A journal that could not record a step: what it was recording and why it could not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot journal {what}: {cause}")]
pub struct JournalError {
    pub what: String,
    pub cause: String,
}

#[derive(Debug, Clone)]
pub struct StepResult {
    pub ok: bool,
    /// The exit code of the action that ended the step (the last one, or the one that failed).
    pub exit_code: Option<i32>,
    pub output_tail: String,
    pub duration: Duration,
}

#[derive(Debug)]
pub enum Applied {
    /// Every step succeeded.
    Done { steps: usize },
    /// `step` failed; the steps before it succeeded.
    Failed { done: usize, step: Box<Step>, result: StepResult },
    /// Stopped between steps because of SIGINT/SIGTERM.
    Interrupted { done: usize },
}

/// What progress reporting is told.
pub enum Event<'a> {
    Starting { index: usize, total: usize, step: &'a Step },
    Output(&'a [u8]),
    Finished { index: usize, step: &'a Step, result: &'a StepResult },
}

/// Applies `plan`, numbering its steps from `first_seq` (a resumed apply continues its numbering).
pub fn apply(
    plan: &Plan,
    first_seq: usize,
    exec: &mut dyn Executor,
    journal: &mut dyn Journal,
    interrupted: &AtomicBool,
    progress: &mut dyn FnMut(Event),
) -> Result<Applied, JournalError> {
    let total = plan.steps.len();
    for (index, step) in plan.steps.iter().enumerate() {
        if interrupted.load(Ordering::SeqCst) {
            return Ok(Applied::Interrupted { done: index });
        }
        progress(Event::Starting { index, total, step });
        let id = journal.started(first_seq + index, step)?;
        let start = Instant::now();
        let mut last = Finished { exit_code: Some(0), output_tail: String::new() };
        let mut tail = String::new();
        for action in &step.actions {
            last = exec.perform(action, &mut |bytes| progress(Event::Output(bytes)));
            tail.push_str(&last.output_tail);
            if !last.ok() {
                break;
            }
        }
        if tail.len() > crate::exec::TAIL_BYTES {
            let mut cut = tail.len() - crate::exec::TAIL_BYTES;
            while !tail.is_char_boundary(cut) {
                cut += 1;
            }
            tail.drain(..cut);
        }
        let result =
            StepResult { ok: last.ok(), exit_code: last.exit_code, output_tail: tail, duration: start.elapsed() };
        journal.finished(id, &result)?;
        progress(Event::Finished { index, step, result: &result });
        if !result.ok {
            return Ok(Applied::Failed { done: index, step: Box::new(step.clone()), result });
        }
    }
    Ok(Applied::Done { steps: total })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{Action, Recording};
    use crate::plan::{plan, Facts, Target};

    #[derive(Default)]
    struct Memory {
        events: Vec<String>,
    }

    impl Journal for Memory {
        fn started(&mut self, seq: usize, step: &Step) -> Result<i64, JournalError> {
            self.events.push(format!("start {seq} {}", step.key));
            Ok(seq as i64)
        }
        fn finished(&mut self, id: i64, result: &StepResult) -> Result<(), JournalError> {
            self.events.push(format!("end {id} ok={}", result.ok));
            Ok(())
        }
    }

    const SPEC: &str = r#"
[image]
name = "rec"
version = "1"

[[file]]
path = "/etc/rec.conf"
content = "a = 1\n"

[[command]]
name = "evil-looking"
run = ["echo", "$(reboot); rm -rf /", "${root}/x"]
unless = ["test", "-e", "${root}/done"]
"#;

    fn setup() -> (tempfile::TempDir, crate::image::Image, Target, Facts) {
        let dir = tempfile::tempdir().unwrap();
        let spec = dir.path().join("rec.toml");
        std::fs::write(&spec, SPEC).unwrap();
        let image = crate::image::load(&spec).unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let target = Target::new(&root);
        let facts = Facts::read(&target, "2026-01-01T00:00:00Z".into());
        (dir, image, target, facts)
    }

    #[test]
    fn a_recording_executor_sees_argument_vectors_and_the_journal_brackets_each_step() {
        let (_dir, image, target, facts) = setup();
        let mut rec = Recording::default();
        let p = plan(&image, &target, &facts, &mut rec).unwrap();
        // The guard was probed (the recorder answers "exit 1": not done), with variables expanded.
        assert_eq!(rec.probes.len(), 1);
        assert_eq!(rec.probes[0].argv, ["test", "-e", &format!("{}/done", target.root.display())]);
        let keys: Vec<&str> = p.steps.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["file:/etc/rec.conf", "command:evil-looking", "image:record"]);

        let mut journal = Memory::default();
        let never = AtomicBool::new(false);
        let out = apply(&p, 1, &mut rec, &mut journal, &never, &mut |_| {}).unwrap();
        assert!(matches!(out, Applied::Done { steps: 3 }));
        assert_eq!(
            journal.events,
            [
                "start 1 file:/etc/rec.conf",
                "end 1 ok=true",
                "start 2 command:evil-looking",
                "end 2 ok=true",
                "start 3 image:record",
                "end 3 ok=true"
            ]
        );
        // The command went out as an argument vector: no shell, the text passed through as one argument.
        let Action::Run(cmd) = &rec.actions[1] else { panic!("{:?}", rec.actions[1]) };
        assert_eq!(cmd.argv, ["echo", "$(reboot); rm -rf /", &format!("{}/x", target.root.display())]);
        assert!(!target.root.join("etc/rec.conf").exists(), "the recorder must not write");
    }

    #[test]
    fn an_interruption_stops_between_steps_and_a_failure_stops_the_apply() {
        let (_dir, image, target, facts) = setup();
        let mut rec = Recording::default();
        let p = plan(&image, &target, &facts, &mut rec).unwrap();
        let mut journal = Memory::default();
        let stop = AtomicBool::new(true);
        let out = apply(&p, 1, &mut rec, &mut journal, &stop, &mut |_| {}).unwrap();
        assert!(matches!(out, Applied::Interrupted { done: 0 }));
        assert!(journal.events.is_empty());

        // For real: the file is written, then the command fails (no such program), and nothing after runs.
        let mut broken = p.clone();
        if let Action::Run(cmd) = &mut broken.steps[1].actions[0] {
            cmd.argv[0] = "/nonexistent/kiln-test-program".into();
        }
        let mut live = Recording { live: true, ..Default::default() };
        let out = apply(&broken, 1, &mut live, &mut journal, &AtomicBool::new(false), &mut |_| {}).unwrap();
        let Applied::Failed { done, step, result } = out else { panic!("{out:?}") };
        assert_eq!((done, step.key.as_str(), result.exit_code), (1, "command:evil-looking", None));
        assert!(result.output_tail.contains("cannot start /nonexistent/kiln-test-program"));
        assert_eq!(std::fs::read_to_string(target.root.join("etc/rec.conf")).unwrap(), "a = 1\n");
        assert_eq!(live.actions.len(), 2, "the step after the failure did not run");
    }
}
