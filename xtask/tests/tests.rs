//! Workspace-wide checks: generated files are fresh, each crate keeps to
//! the dependencies its role allows, and the actor's modules import each
//! other without a circle.

mod black_box;
mod circles;
mod dependencies;
mod generated;
