//! Integration tests of trainstate-schema: one binary, one module per concern.

mod common;
mod compat;
mod invalid;
mod progress;
mod properties;
mod registration;
mod schema;
mod workers;
