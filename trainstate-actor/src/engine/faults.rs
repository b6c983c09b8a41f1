//! Test-only fault hooks, behind the `fault-injection` feature so that
//! integration tests and child processes can use them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Faults to inject into a running state actor.
#[derive(Debug, Default)]
pub struct Faults {
    panic_on_next_write: AtomicBool,
    panic_on_every_write: AtomicBool,
    fail_next_commit: AtomicBool,
    writer_held: Mutex<bool>,
    writer_released: Condvar,
    load_released_by: Mutex<Option<PathBuf>>,
    ray_preparations_held: Mutex<bool>,
    ray_preparations_released: Condvar,
    ray_preparations_waiting: AtomicUsize,
    actor_held: Mutex<bool>,
    actor_released: tokio::sync::Notify,
    actor_waiting: AtomicUsize,
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

    /// Every Ray Train V2 write the HTTP handlers prepare off the actor's
    /// turn waits, in its preparation, until released.
    pub fn hold_ray_preparations(&self) {
        *self.ray_preparations_held.lock().unwrap() = true;
    }

    /// Lets held V2 preparations go on.
    pub fn release_ray_preparations(&self) {
        *self.ray_preparations_held.lock().unwrap() = false;
        self.ray_preparations_released.notify_all();
    }

    /// The state actor stops at the start of its next turn until released:
    /// whatever waits for its turn waits.
    pub fn hold_actor(&self) {
        *self.actor_held.lock().unwrap() = true;
    }

    /// Lets a held actor go on.
    pub fn release_actor(&self) {
        *self.actor_held.lock().unwrap() = false;
        self.actor_released.notify_waiters();
    }

    /// True while the actor waits, held, at the start of a turn.
    pub fn actor_waiting(&self) -> bool {
        self.actor_waiting.load(Ordering::SeqCst) > 0
    }

    /// Waits while the actor is held (see [`Faults::hold_actor`]).
    pub(crate) async fn wait_while_actor_held(&self) {
        loop {
            // Created before the check: a release after it wakes it.
            let released = self.actor_released.notified();
            if !*self.actor_held.lock().unwrap() {
                return;
            }
            self.actor_waiting.fetch_add(1, Ordering::SeqCst);
            released.await;
            self.actor_waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// How many V2 preparations wait, held.
    pub fn ray_preparations_waiting(&self) -> usize {
        self.ray_preparations_waiting.load(Ordering::SeqCst)
    }

    /// Waits while V2 preparations are held (a blocking thread's wait).
    pub(crate) fn wait_while_ray_preparations_held(&self) {
        let mut held = self.ray_preparations_held.lock().unwrap();
        self.ray_preparations_waiting.fetch_add(1, Ordering::SeqCst);
        while *held {
            held = self.ray_preparations_released.wait(held).unwrap();
        }
        self.ray_preparations_waiting.fetch_sub(1, Ordering::SeqCst);
    }

    /// The state actor's load of the stored runs waits, before it reads a
    /// row, until a file exists at `path` (the test creates it to release
    /// the load).
    pub fn hold_load_until_exists(&self, path: PathBuf) {
        *self.load_released_by.lock().unwrap() = Some(path);
    }

    /// Waits while the load is held (see [`Faults::hold_load_until_exists`]).
    pub(crate) async fn wait_while_load_held(&self) {
        let Some(path) = self.load_released_by.lock().unwrap().clone() else { return };
        let mut waited = false;
        while !path.exists() {
            if !waited {
                tracing::warn!(path = %path.display(), "fault injected: the load waits for this file");
                waited = true;
            }
            // A test hook: the file appears from outside the process.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
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
