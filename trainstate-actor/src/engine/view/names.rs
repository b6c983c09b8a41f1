//! Search in run names: every name in one text, searched at memory speed.
//!
//! An index of a name's pieces (trigrams) answered a search from a small
//! set, but cost about 450 bytes a run, more than the rest of the indexes
//! together. One text of every name, a line each, costs the name's bytes
//! and one 24-byte entry; `memmem` searches 100,000 names in well under a
//! millisecond, and what it finds is sorted into listing order.

use memchr::memmem;

use super::Key;

/// The names of the committed runs, and where each one's run is.
#[derive(Default)]
pub(super) struct Names {
    /// Every name added, each followed by a line break (a name has no
    /// control characters, so a match never spans two names). Removed
    /// names stay until [`Names::compact`] drops them.
    text: String,
    /// The names in `text` order: where each starts, and its run's key
    /// (`DEAD` as the slot once removed).
    entries: Vec<Entry>,
    /// For each slot, the index in `entries` of its run's name.
    by_slot: Vec<u32>,
    /// Bytes of `text` that belong to removed names.
    dead_bytes: usize,
}

#[derive(Clone, Copy)]
struct Entry {
    start: usize,
    key: Key,
}

/// The slot of an entry whose name was removed.
const DEAD: u32 = u32::MAX;
/// `by_slot` of a slot without a name.
const NONE: u32 = u32::MAX;

impl Names {
    /// Adds the name of the run at `key`. A slot holds one name: the
    /// caller removes the old one first.
    pub(super) fn add(&mut self, key: Key, name: &str) {
        let slot = key.1 as usize;
        if self.by_slot.len() <= slot {
            self.by_slot.resize(slot + 1, NONE);
        }
        self.by_slot[slot] = u32::try_from(self.entries.len()).expect("fewer than 2^32 names");
        self.entries.push(Entry { start: self.text.len(), key });
        self.text.push_str(name);
        self.text.push('\n');
    }

    /// Removes the name of the run at `key`, if it has one.
    pub(super) fn remove(&mut self, key: Key) {
        let Some(at) = self.by_slot.get_mut(key.1 as usize) else { return };
        let index = std::mem::replace(at, NONE);
        if index == NONE {
            return;
        }
        let index = index as usize;
        self.dead_bytes += self.end(index) - self.entries[index].start;
        self.entries[index].key.1 = DEAD;
        if self.dead_bytes > self.text.len() / 2 {
            self.compact();
        }
    }

    /// The keys of the runs whose name contains `text`, ascending. An
    /// empty text is in every name.
    pub(super) fn find(&self, text: &str) -> Vec<Key> {
        let mut keys = Vec::new();
        if text.contains('\n') {
            return keys;
        }
        if text.is_empty() {
            keys.extend(self.entries.iter().filter(|e| e.key.1 != DEAD).map(|e| e.key));
        } else {
            // Matches come in text order: walk the entries beside them.
            let mut entry = 0;
            let mut last = usize::MAX;
            for at in memmem::find_iter(self.text.as_bytes(), text.as_bytes()) {
                while entry + 1 < self.entries.len() && self.entries[entry + 1].start <= at {
                    entry += 1;
                }
                let found = self.entries[entry];
                if entry != last && found.key.1 != DEAD {
                    keys.push(found.key);
                }
                last = entry;
            }
        }
        keys.sort_unstable();
        keys
    }

    /// Where the name of `entries[index]` ends (before its line break).
    fn end(&self, index: usize) -> usize {
        self.entries.get(index + 1).map_or(self.text.len(), |next| next.start) - 1
    }

    /// Drops the removed names: linear, and done only once they take half
    /// the text, so adding and removing stay constant time on average.
    fn compact(&mut self) {
        let mut text = String::with_capacity(self.text.len() - self.dead_bytes);
        let mut entries = Vec::with_capacity(self.entries.len());
        for index in 0..self.entries.len() {
            let entry = self.entries[index];
            if entry.key.1 == DEAD {
                continue;
            }
            self.by_slot[entry.key.1 as usize] = entries.len() as u32;
            entries.push(Entry { start: text.len(), key: entry.key });
            text.push_str(&self.text[entry.start..=self.end(index)]);
        }
        self.text = text;
        self.entries = entries;
        self.dead_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_finds_each_run_once_in_key_order_and_forgets_removed_names() {
        let mut names = Names::default();
        names.add((3, 0), "bench-run-77");
        names.add((1, 1), "run-777-run-77");
        names.add((2, 2), "other");
        assert_eq!(names.find("run-77"), [(1, 1), (3, 0)]);
        assert_eq!(names.find("r"), [(1, 1), (2, 2), (3, 0)]);
        assert_eq!(names.find(""), [(1, 1), (2, 2), (3, 0)]);
        assert!(names.find("77\nother").is_empty(), "never across two names");
        assert!(names.find("nothing").is_empty());

        names.remove((1, 1));
        assert_eq!(names.find("run-77"), [(3, 0)]);
        names.add((5, 1), "run-78");
        assert_eq!(names.find("run-7"), [(3, 0), (5, 1)]);
        names.remove((9, 7)); // a slot without a name
        assert_eq!(names.find(""), [(2, 2), (3, 0), (5, 1)]);
    }

    #[test]
    fn compacting_keeps_every_live_name() {
        let mut names = Names::default();
        for slot in 0..100u32 {
            names.add((u64::from(slot), slot), &format!("name-{slot}"));
        }
        for slot in (0..100u32).filter(|s| s % 3 != 0) {
            names.remove((u64::from(slot), slot));
        }
        assert!(names.dead_bytes < names.text.len() / 2 + 1, "compacted");
        let want: Vec<Key> =
            (0..100u32).filter(|s| s % 3 == 0).map(|s| (u64::from(s), s)).collect();
        assert_eq!(names.find("name-"), want);
        assert_eq!(names.find("name-99"), [(99, 99)]);
        names.remove((99, 99));
        assert!(names.find("name-99").is_empty());
    }
}
