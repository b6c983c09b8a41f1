//! Stack captures, decided: how a rank's stacks are cut to their bound,
//! normalised, grouped with the ranks stuck in the same place, and which
//! ranks are the suspects (those outside the largest group).

#[cfg(test)]
use trainstate_schema::api::RankStack;
use trainstate_schema::api::{CaptureState, StackCapture, StackGroup, StackSuspect};
use trainstate_schema::limits::{MAX_CAPTURE_BYTES, MAX_STACK_BYTES, MIN_STACK_BYTES};

/// The bytes one rank's stacks keep in a capture of a run of `world_size`
/// ranks: [`MAX_CAPTURE_BYTES`] shared, between [`MIN_STACK_BYTES`] and
/// [`MAX_STACK_BYTES`].
pub(crate) fn rank_stack_bytes(world_size: u32) -> usize {
    (MAX_CAPTURE_BYTES / world_size.max(1) as usize).clamp(MIN_STACK_BYTES, MAX_STACK_BYTES)
}

/// `stack` cut to at most `max_bytes`, at the end of a line where there is
/// one, and whether it was cut.
pub(crate) fn cut(stack: &str, max_bytes: usize) -> (String, bool) {
    if stack.len() <= max_bytes {
        return (stack.to_owned(), false);
    }
    let mut end = max_bytes;
    while !stack.is_char_boundary(end) {
        end -= 1;
    }
    let kept = &stack[..end];
    let kept = match kept.rfind('\n') {
        Some(line_end) if line_end > 0 => &kept[..=line_end],
        _ => kept,
    };
    (kept.to_owned(), true)
}

/// Groups the answered ranks of `capture` and names its suspects, in place:
/// sets `groups`, `suspects` and each rank's `group`.
///
/// Ranks are grouped by the frames of their main thread after
/// normalising (see [`main_thread`]): other threads (a data loader's, a
/// logger's) are kept in the stored text but do not split a group, since
/// they differ between ranks doing the same thing. The largest group is
/// taken as where a healthy rank is; when two groups are equally large,
/// the one holding the lowest rank. The suspects are the ranks of every
/// other group (the smallest groups first), then, once the capture is
/// complete, the ranks that gave no stack.
pub(crate) fn group(capture: &mut StackCapture) {
    let mut keys: Vec<(Vec<String>, Vec<u32>, String)> = Vec::new();
    for entry in &mut capture.ranks {
        entry.group = None;
        if !entry.answered {
            continue;
        }
        let frames = main_thread(&entry.stack);
        let key: Vec<String> = frames.iter().map(Frame::normalised).collect();
        match keys.iter_mut().position(|(known, _, _)| *known == key) {
            Some(index) => {
                keys[index].1.push(entry.rank);
                entry.group = Some(index as u32);
            }
            None => {
                let innermost =
                    frames.first().map(Frame::shown).unwrap_or_else(|| "no frame".into());
                entry.group = Some(keys.len() as u32);
                keys.push((key, vec![entry.rank], innermost));
            }
        }
    }
    // Largest first; equally large groups in the order of their lowest rank.
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by_key(|&index| {
        (std::cmp::Reverse(keys[index].1.len()), keys[index].1.iter().min().copied())
    });
    let mut renumber = vec![0u32; keys.len()];
    for (new, &old) in order.iter().enumerate() {
        renumber[old] = new as u32;
    }
    for entry in &mut capture.ranks {
        entry.group = entry.group.map(|old| renumber[old as usize]);
    }
    let mut groups: Vec<StackGroup> = order
        .iter()
        .map(|&index| {
            let (frames, ranks, innermost) = &keys[index];
            let mut ranks = ranks.clone();
            ranks.sort_unstable();
            StackGroup::new(ranks, frames.clone(), innermost.clone())
        })
        .collect();
    let node_of = |rank: u32| -> Option<String> {
        capture.ranks.iter().find(|entry| entry.rank == rank).and_then(|entry| entry.node.clone())
    };
    let mut suspects: Vec<StackSuspect> = Vec::new();
    for stuck in groups.iter().skip(1).rev() {
        for &rank in &stuck.ranks {
            suspects.push(StackSuspect::new(rank, node_of(rank), stuck.innermost.clone()));
        }
    }
    if capture.state == CaptureState::Complete {
        for entry in capture.ranks.iter().filter(|entry| !entry.answered) {
            suspects.push(StackSuspect::new(entry.rank, entry.node.clone(), NO_ANSWER.into()));
        }
    }
    groups.shrink_to_fit();
    capture.groups = groups;
    capture.suspects = suspects;
}

/// What a suspect that gave no stack is said to be stuck at.
pub(crate) const NO_ANSWER: &str = "no answer";

/// One frame of a stack: its function, its file and its line, as far as
/// the text says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    function: String,
    file: Option<String>,
    line: Option<u32>,
}

impl Frame {
    /// The frame without what differs between ranks in the same place: the
    /// line, the directories of the file, addresses and numbers.
    fn normalised(&self) -> String {
        match &self.file {
            Some(file) => format!("{} ({})", without_numbers(&self.function), base_name(file)),
            None => without_numbers(&self.function),
        }
    }

    /// The frame as a person reads it: `function (file.py:41)`.
    fn shown(&self) -> String {
        match (&self.file, self.line) {
            (Some(file), Some(line)) => format!("{} ({}:{line})", self.function, base_name(file)),
            (Some(file), None) => format!("{} ({})", self.function, base_name(file)),
            (None, _) => self.function.clone(),
        }
    }
}

/// The frames of the main thread of `stack`, innermost first.
///
/// Three shapes are read: Python's `faulthandler` (`Thread 0x… (most recent
/// call first):` then `  File "f.py", line 41 in fn`; the main thread is
/// the one whose outermost frame is `<module>`, else the last listed, since
/// faulthandler lists the newest thread first), `py-spy dump` (`Thread 123
/// (idle): "MainThread"` then `    fn (f.py:41)`; the thread named
/// `MainThread`, else the first) and anything else (a controller's own
/// text: each non-empty line a frame, innermost first).
fn main_thread(stack: &str) -> Vec<Frame> {
    let threads = threads(stack);
    if threads.is_empty() {
        return stack
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .map(|line| Frame { function: line.to_owned(), file: None, line: None })
            .collect();
    }
    let named_main = threads.iter().position(|(name, _)| name.contains("\"MainThread\""));
    let module_outermost = threads
        .iter()
        .position(|(_, frames)| frames.last().is_some_and(|frame| frame.function == "<module>"));
    let chosen = named_main.or(module_outermost).unwrap_or(
        if threads[0].0.starts_with("Thread ") && is_py_spy(&threads[0].0) {
            0
        } else {
            threads.len() - 1
        },
    );
    threads.into_iter().nth(chosen).map(|(_, frames)| frames).unwrap_or_default()
}

/// The threads of a faulthandler or py-spy dump: each header line and its
/// frames, innermost first. Empty when `stack` is neither.
fn threads(stack: &str) -> Vec<(String, Vec<Frame>)> {
    let mut threads: Vec<(String, Vec<Frame>)> = Vec::new();
    for line in stack.lines() {
        let trimmed = line.trim();
        if is_thread_header(trimmed) {
            threads.push((trimmed.to_owned(), Vec::new()));
            continue;
        }
        let Some((_, frames)) = threads.last_mut() else { continue };
        if let Some(frame) = faulthandler_frame(trimmed).or_else(|| py_spy_frame(trimmed)) {
            frames.push(frame);
        }
    }
    threads
}

/// True for a thread's header line: faulthandler's `Thread 0x…` or
/// `Current thread 0x…`, or py-spy's `Thread 123 (idle): "MainThread"`.
fn is_thread_header(line: &str) -> bool {
    (line.starts_with("Thread ") || line.starts_with("Current thread "))
        && (line.ends_with("(most recent call first):") || is_py_spy(line))
}

/// True for py-spy's thread header, which names the thread after a colon.
fn is_py_spy(header: &str) -> bool {
    header.starts_with("Thread ")
        && header.contains("):")
        && !header.ends_with("(most recent call first):")
}

/// `File "/path/f.py", line 41 in fn` as a frame.
fn faulthandler_frame(line: &str) -> Option<Frame> {
    let rest = line.strip_prefix("File \"")?;
    let (file, rest) = rest.split_once('"')?;
    let rest = rest.strip_prefix(", line ")?;
    let (number, function) = rest.split_once(" in ")?;
    Some(Frame {
        function: function.to_owned(),
        file: Some(file.to_owned()),
        line: number.parse().ok(),
    })
}

/// `fn (f.py:41)` (py-spy's frame) as a frame.
fn py_spy_frame(line: &str) -> Option<Frame> {
    let (function, rest) = line.rsplit_once(" (")?;
    let inside = rest.strip_suffix(')')?;
    let (file, number) = match inside.rsplit_once(':') {
        Some((file, number)) if number.bytes().all(|b| b.is_ascii_digit()) => {
            (file, number.parse().ok())
        }
        _ => (inside, None),
    };
    Some(Frame { function: function.to_owned(), file: Some(file.to_owned()), line: number })
}

/// The last component of a path.
fn base_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// `text` with each run of digits (and hexadecimal addresses) made `N`, so
/// that addresses, thread ids and counters do not split a group.
fn without_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '0' && chars.peek().is_some_and(|next| *next == 'x' || *next == 'X') {
            chars.next();
            while chars.peek().is_some_and(char::is_ascii_hexdigit) {
                chars.next();
            }
            out.push('N');
        } else if c.is_ascii_digit() {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push('N');
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use trainstate_schema::api::{CaptureTrigger, RankStackReport};

    use super::*;

    const WAITING: &str = "Thread 0x00007f3b2c5fe700 (most recent call first):
  File \"/usr/lib/python3.11/threading.py\", line 320 in wait
  File \"/usr/lib/python3.11/threading.py\", line 995 in _bootstrap

Current thread 0x00007f3b33e1c740 (most recent call first):
  File \"/venv/lib/torch/distributed/distributed_c10d.py\", line 1320 in all_reduce
  File \"/job/train.py\", line 30 in main
  File \"/job/train.py\", line 44 in <module>
";

    fn stuck(line: u32, thread: &str) -> String {
        format!(
            "Thread {thread} (most recent call first):
  File \"/usr/lib/python3.11/threading.py\", line 324 in wait

Thread 0x00007f0000000001 (most recent call first):
  File \"/job/train.py\", line {line} in rank_two_is_stuck
  File \"/job/train.py\", line 28 in main
  File \"/job/train.py\", line 44 in <module>
"
        )
    }

    const PY_SPY: &str = "Process 4242: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): \"MainThread\"
    rank_two_is_stuck (train.py:41)
    main (train.py:28)
    <module> (train.py:44)
Thread 4250 (idle): \"Thread-1\"
    wait (threading.py:320)
";

    fn capture(stacks: &[Option<&str>], state: CaptureState) -> StackCapture {
        let ranks = stacks
            .iter()
            .enumerate()
            .map(|(rank, stack)| {
                let entry = RankStack::unanswered(rank as u32, Some(format!("node-{}", rank / 2)));
                match stack {
                    Some(stack) => entry
                        .with_report(RankStackReport::new(rank as u32, "faulthandler", *stack), 1),
                    None => entry,
                }
            })
            .collect();
        let mut capture = StackCapture::new(1, "0", 0, CaptureTrigger::Stalled, "", 20_000, ranks);
        capture.state = state;
        capture
    }

    fn suspects(capture: &StackCapture) -> Vec<(u32, &str)> {
        capture.suspects.iter().map(|s| (s.rank, s.innermost.as_str())).collect()
    }

    #[test]
    fn the_rank_stuck_elsewhere_is_the_suspect_with_its_innermost_frame() {
        let odd = stuck(41, "0x00007f9999999999");
        let mut capture = capture(
            &[Some(WAITING), Some(WAITING), Some(&odd), Some(WAITING)],
            CaptureState::Complete,
        );
        group(&mut capture);
        assert_eq!(capture.groups.len(), 2);
        assert_eq!(capture.groups[0].ranks, vec![0, 1, 3]);
        assert_eq!(capture.groups[0].innermost, "all_reduce (distributed_c10d.py:1320)");
        assert_eq!(suspects(&capture), vec![(2, "rank_two_is_stuck (train.py:41)")]);
        assert_eq!(capture.suspects[0].node.as_deref(), Some("node-1"));
        let groups: Vec<Option<u32>> = capture.ranks.iter().map(|r| r.group).collect();
        assert_eq!(groups, vec![Some(0), Some(0), Some(1), Some(0)]);
    }

    #[test]
    fn lines_addresses_and_other_threads_do_not_split_a_group() {
        let one = stuck(41, "0x00007f1111111111");
        let other = stuck(43, "0x00007f2222222222")
            .replace("line 324 in wait", "line 330 in _wait_for_tstate_lock");
        let mut capture =
            capture(&[Some(&one), Some(&other), Some(PY_SPY)], CaptureState::Complete);
        group(&mut capture);
        assert_eq!(capture.groups.len(), 1, "{:?}", capture.groups);
        assert_eq!(capture.groups[0].ranks, vec![0, 1, 2]);
        assert_eq!(capture.groups[0].frames[0], "rank_two_is_stuck (train.py)");
        assert!(capture.suspects.is_empty());
    }

    #[test]
    fn a_silent_rank_is_a_suspect_once_the_capture_is_complete() {
        let stacks = [Some(WAITING), None, Some(WAITING)];
        let mut pending = capture(&stacks, CaptureState::Pending);
        group(&mut pending);
        assert!(pending.suspects.is_empty());
        let mut complete = capture(&stacks, CaptureState::Complete);
        group(&mut complete);
        assert_eq!(suspects(&complete), vec![(1, NO_ANSWER)]);
    }

    #[test]
    fn equally_large_groups_take_the_lowest_ranks_as_the_healthy_one() {
        let odd = stuck(41, "0x1");
        let mut capture = capture(&[Some(&odd), Some(WAITING)], CaptureState::Complete);
        group(&mut capture);
        assert_eq!(capture.groups[0].ranks, vec![0]);
        assert_eq!(suspects(&capture), vec![(1, "all_reduce (distributed_c10d.py:1320)")]);
    }

    #[test]
    fn a_controllers_own_text_is_grouped_line_by_line() {
        let a = "frame wait_for_peer at 0x7f01\nframe train_loop\n";
        let b = "frame wait_for_peer at 0x7f99\nframe train_loop\n";
        let c = "frame load_shard 17\nframe train_loop\n";
        let mut capture = capture(&[Some(a), Some(b), Some(c)], CaptureState::Complete);
        group(&mut capture);
        assert_eq!(capture.groups[0].ranks, vec![0, 1]);
        assert_eq!(suspects(&capture), vec![(2, "frame load_shard 17")]);
    }

    #[test]
    fn a_stack_is_cut_at_a_line_within_its_bound() {
        assert_eq!(cut("ab\ncd\n", 10), ("ab\ncd\n".to_owned(), false));
        assert_eq!(cut("ab\ncd\nef\n", 7), ("ab\ncd\n".to_owned(), true));
        assert_eq!(cut("abcdef", 3), ("abc".to_owned(), true));
        assert_eq!(cut("é", 1), (String::new(), true));
        assert_eq!(rank_stack_bytes(4), MAX_STACK_BYTES);
        assert_eq!(rank_stack_bytes(65_536), MIN_STACK_BYTES);
        assert_eq!(rank_stack_bytes(1_024), 8 * 1024);
    }
}
