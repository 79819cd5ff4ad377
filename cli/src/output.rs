//! Tables for people, JSON for scripts; notes and warnings on standard
//! error, as JSON objects too under `--json`.

use std::{
    io::Write,
    sync::atomic::{AtomicBool, Ordering},
};

/// Whether `--json` was given: standard error then carries one JSON object
/// per line, like standard output carries JSON.
static JSON: AtomicBool = AtomicBool::new(false);

/// Switches standard error to JSON lines (`--json`).
pub(crate) fn set_json(on: bool) {
    JSON.store(on, Ordering::Relaxed);
}

/// Whether `--json` was given.
pub(crate) fn json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// What a line on standard error is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Level {
    /// Something worth knowing: `note: ...` or `{"note": "..."}`.
    Note,
    /// Something went partly wrong: `warning: ...` or `{"warning": "..."}`.
    Warning,
}

/// Writes a note or warning on standard error, as text or (under `--json`)
/// as one JSON object on one line.
pub(crate) fn diag(level: Level, text: &str) {
    let name = match level {
        Level::Note => "note",
        Level::Warning => "warning",
    };
    let mut err = std::io::stderr().lock();
    // Nothing more can be done when standard error is gone.
    let _ = if json() {
        writeln!(err, "{}", serde_json::json!({ name: text }))
    } else {
        writeln!(err, "{name}: {text}")
    };
}

/// A table: a header row and rows of cells.
#[derive(Debug, Default)]
pub(crate) struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names.
    pub(crate) fn new(header: &[&'static str]) -> Table {
        Table {
            header: header.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Writes the table with columns aligned, two spaces apart.
    pub(crate) fn print(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(cell.chars().count());
                }
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &str>, out: &mut dyn Write| {
            let mut text = String::new();
            for (i, cell) in cells.enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                text.push_str(cell);
                let pad = widths.get(i).copied().unwrap_or(0);
                text.extend(std::iter::repeat_n(
                    ' ',
                    pad.saturating_sub(cell.chars().count()),
                ));
            }
            writeln!(out, "{}", text.trim_end())
        };
        line(&mut self.header.iter().copied(), out)?;
        for row in &self.rows {
            line(&mut row.iter().map(String::as_str), out)?;
        }
        Ok(())
    }
}

/// Writes `value` as pretty JSON and a newline.
pub(crate) fn print_json(out: &mut impl Write, value: &serde_json::Value) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)
}

/// Text for an optional cell.
pub(crate) fn or_dash(value: Option<impl ToString>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}
