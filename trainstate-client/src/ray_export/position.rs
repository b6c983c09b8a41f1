//! The durable position of an ingester in an export event file, and the
//! reading of that file from it.
//!
//! A position names a file by its identity (device and inode, and a
//! fingerprint of its first bytes, which tells a file rewritten in place
//! from the one it replaced) and the byte offset just after the last line
//! handled. The position file holds one position for each file name the
//! ingester follows, and is written atomically.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// How many of a file's first bytes its fingerprint covers.
pub(crate) const FINGERPRINT_BYTES: u64 = 1024;

/// The format of the position file this build writes.
const POSITION_VERSION: u32 = 1;

/// Which file: device and inode, as the OS names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FileId {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
}

impl FileId {
    pub(crate) fn of(file: &File) -> std::io::Result<(FileId, u64)> {
        let meta = file.metadata()?;
        Ok((FileId { dev: meta.dev(), ino: meta.ino() }, meta.len()))
    }
}

/// Where an ingester is in each file it follows, by the file's name: what
/// the position file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Positions {
    /// The format of this file.
    pub(crate) version: u32,
    /// Each followed name's position.
    pub(crate) files: BTreeMap<String, Position>,
}

impl Positions {
    /// No position yet.
    pub(crate) fn new() -> Self {
        Self { version: POSITION_VERSION, files: BTreeMap::new() }
    }

    /// The positions saved in `path`, if there are any.
    pub(crate) fn load(path: &Path) -> Result<Option<Positions>, String> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read it: {e}")),
        };
        let positions: Positions = serde_json::from_slice(&bytes).map_err(|e| {
            format!("it does not parse ({e}); delete it to read the events from the start")
        })?;
        if positions.version != POSITION_VERSION {
            return Err(format!(
                "it has format {} and this build reads format {POSITION_VERSION}",
                positions.version
            ));
        }
        Ok(Some(positions))
    }

    /// Writes the positions to `path` atomically and durably: a temporary
    /// file, fsync, rename over the old one, fsync of the directory.
    ///
    /// The temporary file (`<path>.tmp`) is always a new file: whatever is
    /// under its name (a stale one, or a symlink someone planted) is
    /// removed first, never followed, and it is created exclusively, so a
    /// symlink planted in between fails the write instead of redirecting it.
    /// It is created readable and writable by its owner alone (`0600`), as
    /// the head's store is: the paths it names are no one else's to read.
    pub(crate) fn save(&self, path: &Path) -> std::io::Result<()> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        {
            match std::fs::remove_file(&tmp) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let mut file =
                OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            let mut json = serde_json::to_vec_pretty(self).expect("positions serialize");
            json.push(b'\n');
            file.write_all(&json)?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()
    }
}

/// Opens `path` for an OS lock: an existing regular file, or a new one.
/// A symlink (dangling or not) or anything but a regular file is refused
/// and never followed: a new file is created exclusively (which fails on
/// a symlink instead of creating its target), and an existing one, once
/// opened, must be the file the path names (device and inode) before it is
/// used. The error says what is wrong with the path.
pub(crate) fn open_lock_file(path: &Path) -> Result<File, String> {
    let refuse = |what: &str| {
        format!(
            "{} {what}; refusing it (remove it: the ingester creates its own lock file)",
            path.display()
        )
    };
    let named = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => return Err(refuse("is a symlink")),
        Ok(meta) if !meta.is_file() => return Err(refuse("is not a regular file")),
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(
                |e| {
                    if e.kind() == std::io::ErrorKind::AlreadyExists {
                        refuse("appeared while it was being created")
                    } else {
                        format!("cannot create {}: {e}", path.display())
                    }
                },
            );
        }
        Err(e) => return Err(format!("cannot inspect {}: {e}", path.display())),
    };
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let opened = file.metadata().map_err(|e| format!("cannot inspect {}: {e}", path.display()))?;
    if (opened.dev(), opened.ino()) != (named.dev(), named.ino()) {
        return Err(refuse("changed while it was being opened"));
    }
    Ok(file)
}

/// Where an ingester is in one export event file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Position {
    /// The path the file was read under (symbolic links resolved).
    pub(crate) path: PathBuf,
    /// The file's identity.
    #[serde(flatten)]
    pub(crate) id: FileId,
    /// How many of the file's first bytes `fingerprint` covers.
    pub(crate) fingerprint_len: u64,
    /// FNV-1a (64 bits, hex) of the file's first `fingerprint_len` bytes.
    pub(crate) fingerprint: String,
    /// The byte offset just after the last line handled.
    pub(crate) offset: u64,
    /// How many lines come before `offset`.
    pub(crate) line: u64,
}

impl Position {
    /// The start of a file.
    pub(crate) fn start(path: PathBuf, id: FileId) -> Self {
        Self { path, id, fingerprint_len: 0, fingerprint: fnv1a(&[]), offset: 0, line: 0 }
    }

    /// Whether `file` (of identity `id` and length `len`) is still the file
    /// this position is in, with every byte before the position unchanged
    /// as far as the fingerprint can tell.
    pub(crate) fn check(&self, file: &mut File, id: FileId, len: u64) -> std::io::Result<Check> {
        if id != self.id {
            return Ok(Check::Replaced);
        }
        if len < self.offset.max(self.fingerprint_len) {
            return Ok(Check::Truncated);
        }
        if fingerprint(file, self.fingerprint_len)? != self.fingerprint {
            return Ok(Check::Rewritten);
        }
        Ok(Check::Same)
    }

    /// Extends the fingerprint to the file's first bytes now there, up to
    /// [`FINGERPRINT_BYTES`]: bytes of an append-only file never change.
    pub(crate) fn extend_fingerprint(&mut self, file: &mut File, len: u64) -> std::io::Result<()> {
        let want = len.min(FINGERPRINT_BYTES);
        if want > self.fingerprint_len {
            self.fingerprint = fingerprint(file, want)?;
            self.fingerprint_len = want;
        }
        Ok(())
    }
}

/// What a position says of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// The same file, unchanged before the position.
    Same,
    /// Another file under the same name (rotated, or a new Ray session).
    Replaced,
    /// The same file, now shorter than the position.
    Truncated,
    /// The same file, its first bytes changed.
    Rewritten,
}

fn fingerprint(file: &mut File, len: u64) -> std::io::Result<String> {
    let mut bytes = Vec::with_capacity(len as usize);
    file.seek(SeekFrom::Start(0))?;
    Read::by_ref(file).take(len).read_to_end(&mut bytes)?;
    Ok(fnv1a(&bytes))
}

/// FNV-1a, 64 bits, as hex: a fingerprint stable across builds (std's
/// hasher is not).
fn fnv1a(bytes: &[u8]) -> String {
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// One line of an export event file.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    /// Its number, from 1.
    pub(crate) number: u64,
    /// The byte offset of its start.
    pub(crate) start: u64,
    /// The byte offset just after it (and its line break).
    pub(crate) end: u64,
    /// Its bytes, without the line break; `None` when longer than the
    /// limit (skipped, never buffered whole).
    pub(crate) bytes: Option<Vec<u8>>,
}

/// The most bytes of lines one read returns (beyond its first line).
const MAX_BATCH_BYTES: u64 = 4 << 20;

/// A last line without its line break yet, as far as it has been read:
/// kept between reads, so that the next read of the file reads only what
/// was appended after it, never the line again.
#[derive(Debug, Clone)]
pub(crate) struct PartialLine {
    /// The file it is in.
    id: FileId,
    /// The byte offset of its start.
    start: u64,
    /// Its number, from 1.
    number: u64,
    /// How many of its bytes have been read.
    read: u64,
    /// Its bytes so far; `None` once longer than the limit (it is skipped
    /// when it ends, and never held whole).
    bytes: Option<Vec<u8>>,
}

impl PartialLine {
    /// Its number, from 1.
    pub(crate) fn number(&self) -> u64 {
        self.number
    }

    /// The byte offset of its start.
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    /// True once it is longer than the limit.
    pub(crate) fn is_oversized(&self) -> bool {
        self.bytes.is_none()
    }
}

/// What one read of a file found.
#[derive(Debug, Default)]
pub(crate) struct LinesRead {
    /// The complete lines read, in order.
    pub(crate) lines: Vec<Line>,
    /// The last line, when it has no line break yet (and the read was not
    /// told to take it), to give to the next read.
    pub(crate) partial: Option<PartialLine>,
    /// How many bytes this read took from the file.
    pub(crate) bytes_read: u64,
}

/// Reads up to `max_lines` complete lines from `file` at `position`.
/// A last line without its line break is left for later (Ray may be
/// writing it), unless `take_partial` (a file Ray no longer writes): it is
/// returned as `partial`, and when given back to the next read of the same
/// file at the same position, that read goes on from where this one
/// stopped, so a line is read once however long it stays unended.
pub(crate) fn read_lines(
    file: &mut File,
    position: &Position,
    max_lines: usize,
    max_line_bytes: usize,
    take_partial: bool,
    partial: Option<PartialLine>,
) -> std::io::Result<LinesRead> {
    let mut carried = partial.filter(|p| p.id == position.id && p.start == position.offset);
    let resume_at = position.offset + carried.as_ref().map_or(0, |p| p.read);
    file.seek(SeekFrom::Start(resume_at))?;
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let mut read = LinesRead::default();
    let (mut offset, mut number) = (position.offset, position.line);
    while read.lines.len() < max_lines {
        let (mut bytes, mut consumed) = match carried.take() {
            Some(partial) => (partial.bytes, partial.read),
            None => (Some(Vec::new()), 0),
        };
        let complete = loop {
            let available = reader.fill_buf()?;
            if available.is_empty() {
                break false;
            }
            let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
                Some(i) => (&available[..=i], true),
                None => (available, false),
            };
            if let Some(kept) = &mut bytes {
                kept.extend_from_slice(chunk);
                if kept.len() > max_line_bytes + 1 {
                    bytes = None;
                }
            }
            let n = chunk.len();
            reader.consume(n);
            consumed += n as u64;
            read.bytes_read += n as u64;
            if found {
                break true;
            }
        };
        if consumed == 0 {
            break;
        }
        if !complete && !take_partial {
            read.partial = Some(PartialLine {
                id: position.id,
                start: offset,
                number: number + 1,
                read: consumed,
                bytes,
            });
            break;
        }
        if let Some(kept) = &mut bytes
            && kept.last() == Some(&b'\n')
        {
            kept.pop();
        }
        number += 1;
        read.lines.push(Line { number, start: offset, end: offset + consumed, bytes });
        offset += consumed;
        if !complete || offset - position.offset >= MAX_BATCH_BYTES {
            break;
        }
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(
        content: &[u8],
        max_lines: usize,
        take_partial: bool,
    ) -> Vec<(u64, u64, u64, Option<String>)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, content).unwrap();
        let mut file = File::open(&path).unwrap();
        let (id, _) = FileId::of(&file).unwrap();
        let position = Position::start(path, id);
        read_lines(&mut file, &position, max_lines, 8, take_partial, None)
            .unwrap()
            .lines
            .into_iter()
            .map(|l| (l.number, l.start, l.end, l.bytes.map(|b| String::from_utf8(b).unwrap())))
            .collect()
    }

    #[test]
    fn complete_lines_only_unless_the_file_is_abandoned() {
        let some = |s: &str| Some(s.to_owned());
        assert_eq!(
            lines_of(b"ab\ncd\nef", 10, false),
            [(1, 0, 3, some("ab")), (2, 3, 6, some("cd"))]
        );
        assert_eq!(
            lines_of(b"ab\ncd\nef", 10, true),
            [(1, 0, 3, some("ab")), (2, 3, 6, some("cd")), (3, 6, 8, some("ef"))]
        );
        assert_eq!(lines_of(b"ab\ncd\n", 1, false), [(1, 0, 3, some("ab"))]);
        assert_eq!(lines_of(b"", 10, true), []);
        assert_eq!(lines_of(b"\n\n", 10, false), [(1, 0, 1, some("")), (2, 1, 2, some(""))]);
        // A line over the limit (8 bytes) is returned without its bytes.
        assert_eq!(
            lines_of(b"0123456789abc\nok\n", 10, false),
            [(1, 0, 14, None), (2, 14, 17, some("ok"))]
        );
    }

    #[test]
    fn an_unended_line_is_read_on_from_where_the_last_read_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"ok\n0123").unwrap();
        let mut file = File::open(&path).unwrap();
        let (id, _) = FileId::of(&file).unwrap();
        let mut position = Position::start(path.clone(), id);
        let first = read_lines(&mut file, &position, 10, 8, false, None).unwrap();
        assert_eq!((first.lines.len(), first.bytes_read), (1, 7));
        position.offset = 3;
        position.line = 1;
        let partial = first.partial.unwrap();
        assert_eq!((partial.number(), partial.start(), partial.is_oversized()), (2, 3, false));
        // Nothing appended: nothing read.
        let again = read_lines(&mut file, &position, 10, 8, false, Some(partial)).unwrap();
        assert_eq!((again.lines.len(), again.bytes_read), (0, 0));
        // Appended past the limit (8 bytes), then ended: only the new bytes.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"456789").unwrap();
        let over = read_lines(&mut file, &position, 10, 8, false, again.partial).unwrap();
        assert_eq!(over.bytes_read, 6);
        assert!(over.partial.as_ref().unwrap().is_oversized());
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"\nab\n").unwrap();
        let ended = read_lines(&mut file, &position, 10, 8, false, over.partial).unwrap();
        assert_eq!(ended.bytes_read, 4);
        let got: Vec<_> =
            ended.lines.iter().map(|l| (l.number, l.start, l.end, l.bytes.clone())).collect();
        assert_eq!(got, [(2, 3, 14, None), (3, 14, 17, Some(b"ab".to_vec()))]);
        // A partial line of another position is not taken up.
        let stale = read_lines(&mut file, &Position::start(path, id), 1, 8, false, None).unwrap();
        assert_eq!(stale.bytes_read, 3);
    }

    #[test]
    fn a_position_round_trips_and_notices_truncation_and_rewriting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.log");
        std::fs::write(&path, b"first line\nsecond line\n").unwrap();
        let mut file = File::open(&path).unwrap();
        let (id, len) = FileId::of(&file).unwrap();
        let mut position = Position::start(path.clone(), id);
        position.extend_fingerprint(&mut file, len).unwrap();
        position.offset = 11;
        position.line = 1;
        let saved = dir.path().join("position.json");
        let mut positions = Positions::new();
        positions.files.insert("events.log".into(), position.clone());
        positions.save(&saved).unwrap();
        assert_eq!(Positions::load(&saved).unwrap(), Some(positions));
        assert_eq!(position.check(&mut file, id, len).unwrap(), Check::Same);

        std::fs::write(&path, b"first line\n").unwrap();
        let mut file = File::open(&path).unwrap();
        assert_eq!(position.check(&mut file, id, 11).unwrap(), Check::Truncated);
        std::fs::write(&path, b"other line\nsecond line\nthird\n").unwrap();
        let mut file = File::open(&path).unwrap();
        assert_eq!(position.check(&mut file, id, 29).unwrap(), Check::Rewritten);
        let other = FileId { ino: id.ino + 1, ..id };
        assert_eq!(position.check(&mut file, other, 29).unwrap(), Check::Replaced);

        assert_eq!(Positions::load(&dir.path().join("none")).unwrap(), None);
        std::fs::write(&saved, b"{").unwrap();
        assert!(Positions::load(&saved).unwrap_err().contains("delete it"));
        std::fs::write(&saved, br#"{"version": 2, "files": {}}"#).unwrap();
        assert!(Positions::load(&saved).unwrap_err().contains("format 2"));
    }
}
