//! Reading stored runs back into records at start, on every core.
//!
//! A row whose columns describe its JSON ([`super::columns`]) becomes a
//! record from its columns: its JSON is only checked to be JSON, never
//! parsed into fields. Any other row (written before the columns existed,
//! or changed outside trainstate) is parsed as it always was, so a damaged
//! document is still named. The store reads its rows on the writer thread
//! and hands them over in batches; parser threads turn them into records
//! meanwhile, so reading and checking overlap and the checking is spread
//! over the machine's cores.

use std::sync::mpsc::{Receiver, sync_channel};
use std::sync::{Arc, Mutex};

use trainstate_schema::RunId;

use super::columns::StoredColumns;
use crate::record::{RunRecord, versions};

/// One stored run as read: its id, its version when the store keeps one,
/// its JSON (or why it cannot be read as text) and its columns when it has
/// them.
pub(crate) struct StoredRow {
    pub(crate) id: String,
    pub(crate) version: Option<u64>,
    pub(crate) json: Result<String, String>,
    pub(crate) columns: Option<StoredColumns>,
}

/// The stored runs as records, and the rows that did not load.
#[derive(Default)]
pub(crate) struct Loaded {
    pub(crate) records: Vec<Arc<RunRecord>>,
    /// `(id, reason)`, in the order the store read them.
    pub(crate) corrupt: Vec<(String, String)>,
    /// The records that were read from their JSON because their row had no
    /// columns that describe it: the store writes their columns again.
    pub(crate) from_json: Vec<Arc<RunRecord>>,
}

/// Rows a parser takes at once: large enough that handing them over costs
/// nothing beside parsing them, small enough that every parser has work
/// until the last rows.
const BATCH: usize = 256;

/// Parses the rows `read` gives to its sink, on parser threads, while
/// `read` goes on reading; returns every record and every row that did not
/// load. An error of `read` is returned as it is, after the parsers stop.
pub(crate) fn parse_rows<E>(
    read: impl FnOnce(&mut dyn FnMut(StoredRow)) -> Result<(), E>,
) -> Result<Loaded, E> {
    // The reading thread takes a core of its own. A parser per remaining
    // core, not more: each parser's allocator arena keeps the memory its
    // temporaries freed, and with a parser per core a store of 20,000 live
    // runs took 4.11 KiB a run instead of 3.95.
    let parsers =
        std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1)).clamp(1, 8);
    let (tx, rx) = sync_channel::<Vec<(usize, StoredRow)>>(parsers * 4);
    let rx = Mutex::new(rx);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..parsers)
            .map(|_| {
                std::thread::Builder::new()
                    .name("trainstate-load".into())
                    .spawn_scoped(scope, || parse_batches(&rx))
                    .expect("a parser thread starts")
            })
            .collect();
        let mut batch = Vec::with_capacity(BATCH);
        let mut n = 0;
        let read = read(&mut |row| {
            batch.push((n, row));
            n += 1;
            if batch.len() == BATCH {
                // The parsers stop only once this sender is gone.
                let _ = tx.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)));
            }
        });
        if !batch.is_empty() {
            let _ = tx.send(batch);
        }
        drop(tx);
        let mut loaded = Loaded { records: Vec::with_capacity(n), ..Loaded::default() };
        let mut corrupt = Vec::new();
        for worker in workers {
            let parsed = worker.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
            loaded.records.extend(parsed.records);
            loaded.from_json.extend(parsed.from_json);
            corrupt.extend(parsed.corrupt);
        }
        corrupt.sort_unstable_by_key(|(n, _)| *n);
        loaded.corrupt = corrupt.into_iter().map(|(_, bad)| bad).collect();
        read.map(|()| loaded)
    })
}

/// Says, for each run moved aside by `--quarantine-corrupt`, why and where.
pub(crate) fn log_quarantined(corrupt: &[(String, String)], table: &str) {
    for (id, reason) in corrupt {
        tracing::warn!(
            run = %id,
            reason = %reason,
            table,
            "a stored run does not load: moved aside into the quarantine table"
        );
    }
}

/// What one parser made of its batches.
#[derive(Default)]
struct Parsed {
    records: Vec<Arc<RunRecord>>,
    from_json: Vec<Arc<RunRecord>>,
    /// `(n, (id, reason))`: `n` is the row's place in the store's order.
    corrupt: Vec<(usize, (String, String))>,
}

fn parse_batches(rx: &Mutex<Receiver<Vec<(usize, StoredRow)>>>) -> Parsed {
    let mut parsed = Parsed::default();
    loop {
        let batch = match rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
            Ok(batch) => batch,
            Err(_) => return parsed,
        };
        for (n, row) in batch {
            let json = match row.json {
                Ok(json) => json,
                Err(reason) => {
                    parsed.corrupt.push((n, (row.id, reason)));
                    continue;
                }
            };
            let version = row.version.unwrap_or_else(versions::next);
            let described = row.columns.filter(|stored| stored.describe(&row.id, &json));
            let (record, from_json) = match described {
                Some(stored) => {
                    let record = RunId::parse(&row.id)
                        .map_err(|e| e.to_string())
                        .and_then(|id| RunRecord::from_columns(id, stored.columns, json, version));
                    (record, false)
                }
                None => (RunRecord::from_stored_version(json, version), true),
            };
            match record {
                Ok(record) if record.id.as_str() == row.id => {
                    if from_json {
                        parsed.from_json.push(record.clone());
                    }
                    parsed.records.push(record);
                }
                Ok(record) => parsed
                    .corrupt
                    .push((n, (row.id, format!("its document names another run, {}", record.id)))),
                Err(reason) => parsed.corrupt.push((n, (row.id, reason))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, json: Result<&str, &str>) -> StoredRow {
        let json = json.map(Into::into).map_err(Into::into);
        StoredRow { id: id.into(), version: None, json, columns: None }
    }

    #[test]
    fn rows_that_do_not_load_are_named_in_the_order_they_were_read() {
        let rows: Vec<StoredRow> = (0..3 * BATCH + 7)
            .map(|i| match i % 100 {
                5 => row(&format!("bad-{i:04}"), Err("its JSON is not UTF-8")),
                9 => row(&format!("bad-{i:04}"), Ok("{not json")),
                _ => row(&format!("bad-{i:04}"), Ok("[]")),
            })
            .collect();
        let loaded = parse_rows::<()>(|sink| {
            rows.into_iter().for_each(sink);
            Ok(())
        })
        .expect("read");
        assert!(loaded.records.is_empty());
        let ids: Vec<&str> = loaded.corrupt.iter().map(|(id, _)| id.as_str()).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(ids, sorted, "in the order read");
        assert_eq!(ids.len(), 3 * BATCH + 7);
        assert_eq!(loaded.corrupt[5].1, "its JSON is not UTF-8");
    }

    #[test]
    fn an_error_of_the_reader_is_returned_after_the_parsers_stop() {
        let result = parse_rows(|sink| {
            sink(row("a", Ok("{}")));
            Err("the disk went away")
        });
        assert_eq!(result.err(), Some("the disk went away"));
    }
}
