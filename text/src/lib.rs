//! How kiln writes for people, shared by every crate that shows something: numbers with three or
//! four significant digits, short identifiers, plain text tables, UTC timestamps, and the one
//! progress mechanism (stderr, terminals only).

pub mod timefmt;

/// A value with three or four significant digits.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        "-".into()
    } else if a >= 10_000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a == 0.0 {
        "0".into()
    } else {
        format!("{v:.3e}")
    }
}

pub fn pct(ratio: f64) -> String {
    format!("{:+.1} %", (ratio - 1.0) * 100.0)
}

/// The first twelve characters of an identifier, as the tables show a run or a host.
pub fn short(s: &str) -> &str {
    &s[..s.len().min(12)]
}

/// The first six characters of a fingerprint, as the tables show a software stack.
pub fn short6(s: &str) -> &str {
    &s[..s.len().min(6)]
}

/// Progress for people, the one mechanism every command uses: on stderr, and only when stderr is
/// a terminal (a script or a pipe sees nothing). `update` overwrites one status line in place;
/// `say` leaves a line.
pub struct Progress {
    enabled: bool,
}

impl Progress {
    pub fn new() -> Progress {
        use std::io::IsTerminal;
        Progress { enabled: std::io::stderr().is_terminal() }
    }

    /// Replaces the status line.
    pub fn update(&self, text: &str) {
        if self.enabled {
            eprint!("\r\x1b[2Kkiln: {text}");
        }
    }

    /// Clears the status line.
    pub fn finish(&self) {
        if self.enabled {
            eprint!("\r\x1b[2K");
        }
    }

    /// A line that stays.
    pub fn say(&self, text: &str) {
        if self.enabled {
            eprintln!("\r\x1b[2Kkiln: {text}");
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

/// One line of progress (see [`Progress::say`]).
pub fn progress(message: &str) {
    Progress::new().say(message);
}

/// A plain text table: a header row and rows, columns padded to their widest cell; the last
/// column is not padded.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i + 1 == widths.len() {
                text.push_str(cell);
            } else {
                text.push_str(cell);
                text.extend(std::iter::repeat_n(' ', widths[i] - cell.chars().count() + 2));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}
