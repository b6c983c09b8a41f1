//! Test-only fault hooks, behind the `fault-injection` feature so that
//! integration tests and child processes can use them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

/// Faults to inject into a running state actor.
#[derive(Debug, Default)]
pub struct Faults {
    panic_on_next_write: AtomicBool,
    panic_on_every_write: AtomicBool,
    fail_next_commit: AtomicBool,
    writer_held: Mutex<bool>,
    writer_released: Condvar,
}

impl Faults {
    /// The actor panics while handling its next write request.
    pub fn panic_on_next_write(&self) {
        self.panic_on_next_write.store(true, Ordering::SeqCst);
    }

    /// The actor panics while handling every write request from now on.
    pub fn panic_on_every_write(&self) {
        self.panic_on_every_write.store(true, Ordering::SeqCst);
    }

    /// The store's next commit fails, as a full disk would make it.
    pub fn fail_next_commit(&self) {
        self.fail_next_commit.store(true, Ordering::SeqCst);
    }

    /// The store writer stops before its next commit until released.
    pub fn hold_writer(&self) {
        *self.writer_held.lock().unwrap() = true;
    }

    /// Lets a held writer go on.
    pub fn release_writer(&self) {
        *self.writer_held.lock().unwrap() = false;
        self.writer_released.notify_all();
    }

    pub(crate) fn take_panic(&self) -> bool {
        self.panic_on_next_write.swap(false, Ordering::SeqCst)
            || self.panic_on_every_write.load(Ordering::SeqCst)
    }

    pub(crate) fn take_commit_failure(&self) -> bool {
        self.fail_next_commit.swap(false, Ordering::SeqCst)
    }

    pub(crate) fn wait_while_held(&self) {
        let mut held = self.writer_held.lock().unwrap();
        while *held {
            held = self.writer_released.wait(held).unwrap();
        }
    }
}
