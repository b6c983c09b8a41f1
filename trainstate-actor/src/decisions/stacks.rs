//! Stack captures, decided: how a rank's stacks are cut to their bound,
//! normalised, grouped with the ranks stuck in the same place, and which
//! ranks are the suspects (those outside the largest group).

use trainstate_schema::api::{RankStack, StackCapture, StackGroup, StackSuspect};
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
/// sets `groups`, `suspects` and each rank's `group`. A rank that did not
/// answer is a suspect once the capture is complete.
pub(crate) fn group(capture: &mut StackCapture) {
    // Filled in by the grouping rule (normalised main-thread frames).
    let _ = (StackGroup::new, StackSuspect::new, |_: &RankStack| ());
    let _ = capture;
}
