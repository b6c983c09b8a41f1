//! Reading stored runs back into records at start, on every core.
//!
//! A row whose columns describe its JSON ([`super::columns`]) becomes a
//! record from its columns: its JSON is only checked to be JSON, never
//! parsed into fields. Any other row (written before the columns existed,
//! or changed outside trainstate) is parsed as it always was, so a damaged
//! document is still named. The store reads its rows on the writer thread
//! and copies each JSON into a batch (one buffer, used again once a parser
//! is done with it); parser threads turn batches into records meanwhile,
//! each JSON into a text of its own, so reading and checking overlap and
//! what a run keeps is allocated and first touched off the reading thread.

use std::ops::Range;
use std::sync::mpsc::{Receiver, Sender, channel, sync_channel};
use std::sync::{Arc, Mutex};

use trainstate_schema::RunId;

use super::columns::StoredColumns;
use crate::decisions::record::{RunRecord, versions};

/// One stored run as read: its id, its version when the store keeps one,
/// its JSON as stored (or why it cannot be read), and its columns when it
/// has them.
pub(crate) struct StoredRow<'a> {
    pub(crate) id: String,
    pub(crate) version: Option<u64>,
    pub(crate) json: Result<&'a [u8], String>,
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

/// Rows handed to a parser: each row's JSON is a range of `json`.
struct Batch {
    json: Vec<u8>,
    rows: Vec<(usize, Row)>,
}

/// A [`StoredRow`] in a [`Batch`].
struct Row {
    id: String,
    version: Option<u64>,
    json: Result<Range<usize>, String>,
    columns: Option<StoredColumns>,
}

/// Parses the rows `read` gives to its sink, on parser threads, while
/// `read` goes on reading; returns every record and every row that did not
/// load. An error of `read` is returned as it is, after the parsers stop.
pub(crate) fn parse_rows<E>(
    read: impl FnOnce(&mut dyn FnMut(StoredRow<'_>)) -> Result<(), E>,
) -> Result<Loaded, E> {
    // A parser per core: the reading thread only copies bytes, so the
    // parsers do most of the work. Their temporaries are few (a live run's
    // members), so their allocator arenas hold little but the runs.
    let parsers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
    let (tx, rx) = sync_channel::<Batch>(parsers * 4);
    let rx = Mutex::new(rx);
    // Batches' buffers go back to the reader, which fills them again: the
    // JSON is copied into memory already touched.
    let (used, reuse) = channel::<Vec<u8>>();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..parsers)
            .map(|_| {
                let used = used.clone();
                let rx = &rx;
                std::thread::Builder::new()
                    .name("trainstate-load".into())
                    .spawn_scoped(scope, move || parse_batches(rx, &used))
                    .expect("a parser thread starts")
            })
            .collect();
        drop(used);
        let new_batch = || Batch {
            json: reuse.try_recv().unwrap_or_default(),
            rows: Vec::with_capacity(BATCH),
        };
        let mut batch = new_batch();
        let mut n = 0;
        let read = read(&mut |row| {
            let json = row.json.map(|json| {
                let start = batch.json.len();
                batch.json.extend_from_slice(json);
                start..batch.json.len()
            });
            let row = Row { id: row.id, version: row.version, json, columns: row.columns };
            batch.rows.push((n, row));
            n += 1;
            if batch.rows.len() == BATCH {
                // The parsers stop only once this sender is gone.
                let _ = tx.send(std::mem::replace(&mut batch, new_batch()));
            }
        });
        if !batch.rows.is_empty() {
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

fn parse_batches(rx: &Mutex<Receiver<Batch>>, used: &Sender<Vec<u8>>) -> Parsed {
    let mut parsed = Parsed::default();
    loop {
        let Batch { mut json, rows } = match rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
            Ok(batch) => batch,
            Err(_) => return parsed,
        };
        for (n, row) in rows {
            let text = row.json.and_then(|range| {
                String::from_utf8(json[range].to_vec())
                    .map_err(|_| "its JSON is not UTF-8".to_owned())
            });
            let text = match text {
                Ok(text) => text,
                Err(reason) => {
                    parsed.corrupt.push((n, (row.id, reason)));
                    continue;
                }
            };
            let version = row.version.unwrap_or_else(versions::next);
            let described = row.columns.filter(|stored| stored.describe(&row.id, &text));
            let (record, from_json) = match described {
                Some(stored) => {
                    let record = RunId::parse(&row.id)
                        .map_err(|e| e.to_string())
                        .and_then(|id| RunRecord::from_columns(id, stored.columns, text, version));
                    (record, false)
                }
                None => (RunRecord::from_stored_version(text, version), true),
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
        json.clear();
        // The reader may be done: then the buffer is simply freed.
        let _ = used.send(json);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row<'a>(id: &str, json: Result<&'a str, &str>) -> StoredRow<'a> {
        let json = json.map(str::as_bytes).map_err(Into::into);
        StoredRow { id: id.into(), version: None, json, columns: None }
    }

    #[test]
    fn rows_that_do_not_load_are_named_in_the_order_they_were_read() {
        let rows: Vec<StoredRow<'_>> = (0..3 * BATCH + 7)
            .map(|i| match i % 100 {
                5 => row(&format!("bad-{i:04}"), Err("its JSON column holds Integer, not text")),
                7 => StoredRow { json: Ok(b"{\"\xff\"}"), ..row(&format!("bad-{i:04}"), Ok("")) },
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
        assert_eq!(loaded.corrupt[5].1, "its JSON column holds Integer, not text");
        assert_eq!(loaded.corrupt[7].1, "its JSON is not UTF-8");
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
