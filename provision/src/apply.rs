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
    fn started(&mut self, seq: usize, step: &Step) -> Result<i64, String>;
    fn finished(&mut self, id: i64, result: &StepResult) -> Result<(), String>;
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
) -> Result<Applied, String> {
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
        let result = StepResult { ok: last.ok(), exit_code: last.exit_code, output_tail: tail, duration: start.elapsed() };
        journal.finished(id, &result)?;
        progress(Event::Finished { index, step, result: &result });
        if !result.ok {
            return Ok(Applied::Failed { done: index, step: Box::new(step.clone()), result });
        }
    }
    Ok(Applied::Done { steps: total })
}
