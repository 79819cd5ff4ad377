//! Every record kind is declared, every declared secret is redacted, and
//! nothing else is.

use std::{collections::BTreeSet, path::Path};

use mcp_persist_core::{
    conformance::samples::{self, PLANTED},
    declare::{self, Space},
    stores::inspect::{self, REDACTED},
};

/// The JSON pointers of every string equal to `needle` in `value`.
fn pointers_of(value: &serde_json::Value, needle: &str, at: String, out: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::String(s) if s == needle => {
            out.insert(at);
        }
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                pointers_of(v, needle, format!("{at}/{k}"), out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                pointers_of(v, needle, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn every_declared_kind_has_a_sample_whose_secrets_are_exactly_the_declared_ones() {
    let all = samples::all();
    assert_eq!(all.len(), declare::ALL.len());
    for sample in &all {
        let d = sample.declaration;
        let name = match d.space {
            Space::Kv => sample.key.to_string(),
            Space::Log => format!("{}#1", sample.key),
        };
        let shown = inspect::inspect(&name, &sample.bytes)
            .unwrap_or_else(|e| panic!("{}: the sample does not decode: {e}", d.kind));
        assert_eq!(shown.kind, d.kind);
        let mut redacted = BTreeSet::new();
        pointers_of(&shown.record, REDACTED, String::new(), &mut redacted);
        let declared: BTreeSet<String> = d.secret_fields.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(
            redacted, declared,
            "{}: the fields its type redacts differ from the declared secret fields",
            d.kind
        );
        let text = shown.record.to_string();
        assert!(
            !text.contains(PLANTED),
            "{}: a planted secret is shown",
            d.kind
        );
        assert_eq!(sample.secrets.len(), d.secret_fields.len());
    }
}

#[test]
fn a_record_under_another_kinds_key_is_corrupt() {
    let all = samples::all();
    let session = all
        .iter()
        .find(|s| s.declaration.kind == "server_session")
        .expect("sample");
    let creds = all
        .iter()
        .find(|s| s.declaration.kind == "credentials")
        .expect("sample");
    let err = inspect::inspect(&creds.key, &session.bytes).expect_err("kind mismatch accepted");
    assert!(
        err.to_string().contains("where a credentials was expected"),
        "{err}"
    );
}

/// Every `impl Record for T` in the crate names a declaration listed in
/// `declare::ALL`: a kind cannot be added without its declaration.
#[test]
fn every_record_type_is_declared() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let declare_rs = std::fs::read_to_string(src.join("declare.rs")).expect("declare.rs");
    let all_list = declare_rs
        .split("pub const ALL: &[&Declaration] = &[")
        .nth(1)
        .and_then(|rest| rest.split("];").next())
        .expect("the ALL list");
    let mut impls = Vec::new();
    let mut stack = vec![src];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("read");
                for (i, _) in text.match_indices("Record for ") {
                    let line_start = text[..i].rfind('\n').map_or(0, |n| n + 1);
                    let line = &text[line_start..];
                    if !line.trim_start().starts_with("impl") {
                        continue;
                    }
                    let body = &text[i..];
                    let decl = body
                        .split("const DECLARATION")
                        .nth(1)
                        .and_then(|b| b.split(';').next())
                        .and_then(|b| b.rsplit("::").next())
                        .map(str::trim)
                        .unwrap_or_else(|| {
                            panic!("{}: a Record impl without DECLARATION", path.display())
                        });
                    impls.push((path.display().to_string(), decl.to_owned()));
                }
            }
        }
    }
    assert_eq!(impls.len(), declare::ALL.len(), "record types: {impls:?}");
    for (file, decl) in &impls {
        assert!(
            all_list.contains(&format!("&{decl},")),
            "{file}: {decl} is not listed in declare::ALL"
        );
        assert!(
            declare_rs.contains(&format!("    {decl} {{")),
            "{file}: {decl} is not declared with declare!"
        );
    }
}

/// No key prefix of a declared kind is written as a string anywhere in the
/// workspace's Rust code but in the declarations and core's own tests: every
/// key is built from its declaration, so a change of layout cannot leave a
/// copy behind.
#[test]
fn no_key_prefix_is_written_outside_the_declarations() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("core is in the workspace")
        .to_path_buf();
    let prefixes: Vec<String> = declare::ALL
        .iter()
        .map(|d| format!("\"{}", d.prefix))
        .collect();
    let allowed = |path: &Path| {
        let rel = path.strip_prefix(&root).unwrap_or(path);
        rel.starts_with("core/src/declare.rs")
            || rel.starts_with("core/tests")
            || rel.starts_with("target")
            || rel.components().any(|c| {
                let c = c.as_os_str();
                c == "target" || c == ".cache" || c == ".git" || c == "node_modules"
            })
    };
    let mut found = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if allowed(&path) {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                for (n, line) in text.lines().enumerate() {
                    if prefixes.iter().any(|p| line.contains(p.as_str())) {
                        found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "key prefixes written outside core's declarations:\n{}",
        found.join("\n")
    );
}
