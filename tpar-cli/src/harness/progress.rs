//! Progress on stderr: an indicatif bar on a terminal; elsewhere (a log, a pipe) a plain
//! line now and then, never a `\r`. Hidden on every rank but the root.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How often a plain progress line is written when stderr is not a terminal.
const PLAIN_EVERY: Duration = Duration::from_secs(10);

pub struct Progress {
    bar: Option<ProgressBar>,
    plain: Option<Plain>,
}

struct Plain {
    len: u64,
    pos: u64,
    msg: String,
    last: Instant,
}

impl Progress {
    pub fn new(show: bool, len: usize) -> Progress {
        if !show {
            return Progress { bar: None, plain: None };
        }
        if std::io::stderr().is_terminal() {
            let b = ProgressBar::new(len as u64);
            b.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            return Progress { bar: Some(b), plain: None };
        }
        Progress { bar: None, plain: Some(Plain { len: len as u64, pos: 0, msg: String::new(), last: Instant::now() }) }
    }

    pub fn set_message(&mut self, msg: String) {
        if let Some(b) = &self.bar {
            b.set_message(msg);
        } else if let Some(p) = &mut self.plain {
            p.msg = msg;
        }
    }

    pub fn set_position(&mut self, pos: u64) {
        if let Some(b) = &self.bar {
            b.set_position(pos);
        } else if let Some(p) = &mut self.plain {
            p.pos = pos;
            p.tick();
        }
    }

    pub fn inc(&mut self) {
        if let Some(b) = &self.bar {
            b.inc(1);
        } else if let Some(p) = &mut self.plain {
            p.pos += 1;
            p.tick();
        }
    }

    /// Runs `f` (which prints) with the bar out of the way.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bar {
            Some(b) => b.suspend(f),
            None => f(),
        }
    }

    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

impl Plain {
    fn tick(&mut self) {
        if self.last.elapsed() >= PLAIN_EVERY {
            self.last = Instant::now();
            let _ = writeln!(std::io::stderr(), "tpar: {}/{} {}", self.pos, self.len, self.msg);
        }
    }
}
