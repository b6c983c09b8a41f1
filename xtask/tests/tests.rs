//! Workspace-wide checks: generated files are fresh, and each crate keeps to
//! the dependencies its role allows.

mod black_box;
mod dependencies;
mod generated;
