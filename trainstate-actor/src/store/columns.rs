//! The columns a stored run keeps beside its JSON, and the check that they
//! still describe it.
//!
//! A run's row holds its canonical JSON and, in columns of their own, the
//! fields the actor indexes ([`RunColumns`]). A load builds each record from
//! the columns and keeps the JSON as text without parsing it, which is what
//! makes a restart fast. The columns are only trusted together with the
//! JSON they were written with: every row also keeps a CRC-32 of its id,
//! its JSON and its columns, written in the same statement. A row whose
//! check does not match (edited by hand, or written before the columns
//! existed) is read from its JSON as before, so a damaged document is
//! still refused and named.

use crate::decisions::record::RunColumns;

/// The check of a row: a CRC-32 of its id, its JSON and its columns, each
/// field preceded by its length (or a tag for a missing one), so that no
/// two different rows feed the same bytes.
pub(crate) fn check(id: &str, columns: &RunColumns<'_>, json: &str) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    let mut text = |text: &str| {
        crc.update(&(text.len() as u64).to_le_bytes());
        crc.update(text.as_bytes());
    };
    text(id);
    text(json);
    text(columns.status.as_str());
    text(&columns.job_id);
    text(&columns.name);
    text(&columns.controller_actor_id);
    text(&columns.node_ids);
    text(&columns.node_ips);
    match &columns.cluster {
        Some(cluster) => text(cluster),
        None => crc.update(&[0xff]),
    }
    let end = columns.end_time_ms.map_or([0xff; 9], |end| {
        let mut bytes = [0; 9];
        bytes[1..].copy_from_slice(&end.to_le_bytes());
        bytes
    });
    crc.update(&columns.start_time_ms.to_le_bytes());
    crc.update(&end);
    crc.update(&[u8::from(columns.lost_controller), u8::from(columns.leased)]);
    crc.finalize()
}

/// A row's columns as read back, with the check written beside them.
#[derive(Debug)]
pub(crate) struct StoredColumns {
    pub(crate) columns: RunColumns<'static>,
    pub(crate) check: u32,
}

impl StoredColumns {
    /// Whether these columns were written with `json` for the run `id`.
    pub(crate) fn describe(&self, id: &str, json: &str) -> bool {
        check(id, &self.columns, json) == self.check
    }
}

#[cfg(test)]
mod tests {
    use trainstate_schema::RunStatus;

    use super::*;

    fn columns() -> RunColumns<'static> {
        RunColumns {
            start_time_ms: 1,
            end_time_ms: None,
            status: RunStatus::Running,
            lost_controller: false,
            leased: true,
            job_id: "job".into(),
            name: "run".into(),
            controller_actor_id: "ctrl".into(),
            cluster: None,
            node_ids: "a\nb".into(),
            node_ips: "10.0.0.1".into(),
        }
    }

    #[test]
    fn every_field_of_a_row_changes_its_check() {
        let base = check("r1", &columns(), "{}");
        type Change = fn(&mut RunColumns<'static>);
        let changes: [Change; 11] = [
            |c| c.start_time_ms = 2,
            |c| c.end_time_ms = Some(0),
            |c| c.status = RunStatus::Finished,
            |c| c.lost_controller = true,
            |c| c.leased = false,
            |c| c.job_id = "jo".into(),
            |c| c.name = "runs".into(),
            |c| c.controller_actor_id = "".into(),
            |c| c.cluster = Some("".into()),
            |c| c.node_ids = "a".into(),
            |c| c.node_ips = "10.0.0.1\n".into(),
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut changed = columns();
            change(&mut changed);
            assert_ne!(check("r1", &changed, "{}"), base, "change {i}");
        }
        assert_ne!(check("r2", &columns(), "{}"), base);
        assert_ne!(check("r1", &columns(), "{ }"), base);
        // A byte moved from one field to the next is a different row.
        let mut moved = columns();
        (moved.job_id, moved.name) = ("jobr".into(), "un".into());
        assert_ne!(check("r1", &moved, "{}"), base);
        let stored = StoredColumns { columns: columns(), check: base };
        assert!(stored.describe("r1", "{}"));
        assert!(!stored.describe("r1", "{\"id\":7}"));
    }
}
