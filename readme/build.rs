//! Extracts the client and the server from `mcp-persist`'s README, so that
//! the programs of this crate are the README's code, never a copy of it.

use std::{fs, path::Path};

#[path = "extract.rs"]
mod extract;

fn main() {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp-persist/README.md");
    println!("cargo::rerun-if-changed={}", readme.display());
    println!("cargo::rerun-if-changed=extract.rs");
    let text =
        fs::read_to_string(&readme).unwrap_or_else(|e| panic!("reading {}: {e}", readme.display()));
    let out = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR");
    for (heading, file) in [
        ("## A durable client", "client.rs"),
        ("## A durable server", "server.rs"),
    ] {
        let code = extract::code_under(&text, heading).unwrap_or_else(|| {
            panic!(
                "{} has no Rust code block under {heading:?}",
                readme.display()
            )
        });
        fs::write(Path::new(&out).join(file), code)
            .unwrap_or_else(|e| panic!("writing {file}: {e}"));
    }
}
