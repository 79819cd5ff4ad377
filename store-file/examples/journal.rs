//! A tiny journal that keeps its state in a folder: run it twice and it
//! remembers. Kill it at any moment and the folder is still sound.
//!
//! ```text
//! cargo run -p mcp-persist-store-file --example journal -- ./journal-state "first note"
//! cargo run -p mcp-persist-store-file --example journal -- ./journal-state "second note"
//! ```

use anyhow::{Context, Result};
use mcp_persist_core::{Error, Key, KvStore, LogStore, PutMode, PutOptions};
use mcp_persist_store_file::FileStore;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "journal-state".to_owned());
    let note: Vec<String> = args.collect();

    let store = FileStore::open(&dir)
        .await
        .with_context(|| format!("opening the journal in {dir}"))?;

    let (runs_key, notes_key) = (Key::new("runs")?, Key::new("notes")?);
    // Count runs with compare-and-swap: two journals started at once still
    // count both runs.
    let runs = loop {
        let (current, mode) = match store.get(&runs_key).await? {
            Some(entry) => (
                String::from_utf8_lossy(&entry.value).parse::<u64>()?,
                PutMode::Update(entry.version),
            ),
            None => (0, PutMode::Create),
        };
        match store
            .put(
                &runs_key,
                (current + 1).to_string().into_bytes(),
                PutOptions::new(mode),
            )
            .await
        {
            Ok(_) => break current + 1,
            Err(Error::Conflict { .. } | Error::AlreadyExists { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    println!("run number {runs} of the journal in {dir}");

    if !note.is_empty() {
        let seqs = store
            .append(&notes_key, vec![note.join(" ").into_bytes()], None)
            .await?;
        println!("noted as #{}", seqs[0]);
    }
    for record in store.read_after(&notes_key, 0, usize::MAX).await? {
        println!(
            "#{:>3}  {}",
            record.seq,
            String::from_utf8_lossy(&record.data)
        );
    }
    Ok(())
}
