//! Workspace-wide checks: generated files are fresh, each crate keeps to
//! the dependencies its role allows, and the head crate keeps to its wings
//! with no import circle among its files.

mod black_box;
mod circles;
mod dependencies;
mod generated;
